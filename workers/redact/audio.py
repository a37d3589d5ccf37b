"""Redacted audio: a recording again, with time ranges silenced, as FLAC.

Silence rather than a tone: a tone over a spoken digit keeps the digit's length and rhythm
audible, and a listener (or a model) does not need either; silence is what AWS Call
Analytics writes too, and FLAC compresses it to almost nothing. Every channel is silenced in
a range, not only the speaker's: on a stereo call the other channel often carries the same
words as crosstalk or echo. The sample rate and channel count are the source's (decoded with
PyAV, which the audio worker uses too); the sample format is 16-bit, FLAC's usual one.
"""

from __future__ import annotations

import io
from collections.abc import Iterable

import numpy as np

# Around each range: Whisper's word boundaries are within ~0.1 s of the speech (docs/reference/outputs.md,
# Transcripts: word timestamps), and a clipped edge of a digit is still a digit.
MARGIN_S = 0.15


def decode_pcm(data: bytes) -> tuple[np.ndarray, int]:
    """The first audio stream as int16 (channels, samples) at its own rate."""
    import av

    with av.open(io.BytesIO(data), mode="r") as container:
        stream = container.streams.audio[0]
        rate = stream.codec_context.sample_rate or stream.rate
        channels = stream.codec_context.channels
        resampler = av.AudioResampler(
            format="s16p", layout=stream.codec_context.layout.name, rate=rate
        )
        parts = []
        for frame in container.decode(stream):
            for out in resampler.resample(frame):
                parts.append(out.to_ndarray())
        for out in resampler.resample(None):
            parts.append(out.to_ndarray())
    pcm = np.concatenate(parts, axis=1) if parts else np.zeros((channels, 0), np.int16)
    return pcm.reshape(channels, -1), int(rate)


def encode_flac(pcm: np.ndarray, rate: int) -> bytes:
    import av

    channels = pcm.shape[0]
    layout = {1: "mono", 2: "stereo"}.get(channels, f"{channels}c")
    buf = io.BytesIO()
    with av.open(buf, "w", format="flac") as container:
        stream = container.add_stream("flac", rate=rate, layout=layout)
        step = 4096
        for at in range(0, pcm.shape[1], step):
            frame = av.AudioFrame.from_ndarray(
                np.ascontiguousarray(pcm[:, at : at + step]), format="s16p", layout=layout
            )
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buf.getvalue()


def silence(
    data: bytes, ranges: Iterable[tuple[float, float]], margin_s: float = MARGIN_S
) -> bytes:
    """``data`` (any format PyAV reads) as FLAC with every range (seconds) silenced."""
    pcm, rate = decode_pcm(data)
    pcm = pcm.copy()
    for start, end in ranges:
        a = max(0, int((start - margin_s) * rate))
        b = min(pcm.shape[1], int(np.ceil((end + margin_s) * rate)))
        if b > a:
            pcm[:, a:b] = 0
    return encode_flac(pcm, rate)
