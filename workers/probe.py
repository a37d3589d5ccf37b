"""A recording's container header, read without decoding a frame (``overnight probe``).

PyAV opens the container from a file object and reads only what the demuxer needs for the
header, so a two-hour call on object storage costs a few kilobytes, not its whole size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO

from overnight.schemas import ErrorCode


class ProbeError(Exception):
    def __init__(self, code: ErrorCode, message: str):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Header:
    duration_s: float | None  # the first audio stream's, else the container's; None: unstated
    channels: int
    sample_rate: int
    codec: str
    container: str


def read_header(f: IO[bytes]) -> Header:
    """The header of the container in ``f``; ``ProbeError`` with the error code of the
    transcription job for the same file (not_audio, no_audio_stream)."""
    import av

    try:
        container = av.open(f, mode="r", metadata_errors="ignore")
    except av.error.FFmpegError as exc:
        message = f"cannot open as audio: {exc.strerror or exc}"
        raise ProbeError(ErrorCode.NOT_AUDIO, message) from None
    with container:
        if not container.streams.audio:
            raise ProbeError(ErrorCode.NO_AUDIO_STREAM, "the container has no audio stream")
        stream = container.streams.audio[0]
        if stream.duration is not None and stream.time_base is not None:
            duration: float | None = float(stream.duration * stream.time_base)
        elif container.duration is not None:
            duration = container.duration / av.time_base
        else:
            duration = None
        ctx = stream.codec_context
        return Header(
            duration_s=duration,
            channels=int(ctx.channels or 1),
            sample_rate=int(ctx.sample_rate or stream.rate or 0),
            codec=ctx.name,
            container=container.format.name,
        )
