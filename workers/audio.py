"""Audio bytes → per-channel speech chunks as Whisper log-mel features.

This is the CPU half of transcription: decode (PyAV/FFmpeg), resample to 16 kHz, split or mix
channels, find speech with Silero VAD, pack speech into chunks of at most ``chunk_length_s``
and compute each chunk's log-mel features. Doing the features here, on CPU tasks, keeps the
accelerator actors doing nothing but the model: on an H100 the feature extraction of one
chunk costs more than its encoder pass.

Every failure of an item is classified into one error code from ``schemas.errors``; nothing
here raises for bad input.
"""

from __future__ import annotations

import io
import math
import time
from dataclasses import dataclass, field
from typing import Any

import av
import numpy as np
from faster_whisper.feature_extractor import FeatureExtractor
from faster_whisper.vad import VadOptions, get_speech_timestamps

from schemas import ErrorCode

SAMPLE_RATE = 16_000
# Frames per second of Whisper features (hop length 160 at 16 kHz).
FRAMES_PER_SECOND = 100

# Magic numbers of audio containers we expect; a decode failure on one of these is a corrupt
# file, on anything else the bytes were not audio in the first place.
_AUDIO_MAGIC: tuple[tuple[int, bytes], ...] = (
    (0, b"RIFF"),
    (0, b"fLaC"),
    (0, b"ID3"),
    (0, b"OggS"),
    (0, b"#!AMR"),
    (0, b"\x1a\x45\xdf\xa3"),  # Matroska / WebM
    (4, b"ftyp"),  # MP4 / M4A
    (0, b"FORM"),  # AIFF
    (0, b".snd"),  # AU
)


@dataclass(frozen=True)
class AudioOptions:
    """How recordings become chunks. Every field is recorded in the row's ``options``."""

    chunk_length_s: int = 30
    vad: bool = True
    vad_threshold: float = 0.5
    # Silence that splits speech. Plain faster-whisper's 2000 ms keeps short pauses inside a
    # clip; BatchedInferencePipeline's 160 ms cut every pause out, and on 600 synthesized
    # calls that cost 0.18 WER points and 20% more model time (README Benchmarks).
    vad_min_silence_ms: int = 2000
    # Split-channel calls: one channel's pause is the other party's turn, so pauses must
    # split clips well below ``turn_gap_s`` for the dialogue to come back in order.
    vad_min_silence_split_ms: int = 160
    vad_speech_pad_ms: int = 400
    split_channels: bool = False
    # Split calls: more channels than this fail with too_many_channels; each channel costs
    # its own VAD pass and features, a full mono decode's memory.
    max_channels: int = 8
    max_duration_s: float = 4 * 3600.0
    # Decode, VAD and features of one recording, checked between frames and chunks: a file
    # that decodes pathologically slowly ends as decode_timeout instead of holding its task.
    decode_timeout_s: float = 900.0
    feature_size: int = 80
    # Split-channel calls: a pause longer than this on one channel ends a dialogue turn.
    turn_gap_s: float = 1.0


@dataclass
class Chunk:
    """Up to ``chunk_length_s`` seconds of speech of one channel.

    ``clips`` are the original (start, end) seconds of the speech the chunk concatenates, so
    times inside the chunk map back to the recording's timeline.
    """

    channel: int
    clips: list[tuple[float, float]]
    features: np.ndarray  # (feature_size, frames) float32, not padded

    @property
    def duration_s(self) -> float:
        return sum(end - start for start, end in self.clips)


@dataclass
class DecodedAudio:
    duration_s: float = 0.0
    speech_s: float = 0.0
    num_channels: int = 0
    chunks: list[Chunk] = field(default_factory=list)
    error_code: str | None = None
    error_message: str | None = None


class AudioError(Exception):
    def __init__(self, code: ErrorCode, message: str):
        super().__init__(message)
        self.code = code


def _looks_like_audio(data: bytes) -> bool:
    if any(data[offset : offset + len(magic)] == magic for offset, magic in _AUDIO_MAGIC):
        return True
    # MPEG audio frame sync without an ID3 tag.
    return len(data) > 1 and data[0] == 0xFF and (data[1] & 0xE0) == 0xE0


def decode(
    data: bytes,
    *,
    split_channels: bool,
    max_duration_s: float,
    max_channels: int = 8,
    deadline: float = math.inf,
) -> tuple[np.ndarray, float]:
    """Decode to float32 16 kHz: shape (channels, samples); channels == 1 unless split.

    A mono mix-down includes every channel; a split keeps every channel, up to
    ``max_channels``. ``deadline`` is a ``time.monotonic()`` value.

    Raises AudioError with the reason code.
    """
    if not data:
        raise AudioError(ErrorCode.EMPTY_FILE, "the file is empty (0 bytes)")
    try:
        container = av.open(io.BytesIO(data), mode="r", metadata_errors="ignore")
    except av.error.FFmpegError as exc:
        code = ErrorCode.CORRUPT_AUDIO if _looks_like_audio(data) else ErrorCode.NOT_AUDIO
        raise AudioError(code, f"cannot open as audio: {exc.strerror or exc}") from None
    with container:
        if not container.streams.audio:
            raise AudioError(ErrorCode.NO_AUDIO_STREAM, "the container has no audio stream")
        stream = container.streams.audio[0]
        codec_name = stream.codec_context.name if stream.codec_context else None
        if not codec_name or codec_name == "none":
            raise AudioError(ErrorCode.UNSUPPORTED_CODEC, "the audio stream's codec has no decoder")
        # Refuse over-long recordings before spending time decoding them.
        declared = None
        if stream.duration is not None and stream.time_base is not None:
            declared = float(stream.duration * stream.time_base)
        elif container.duration is not None:
            declared = container.duration / av.time_base
        if declared is not None and declared > max_duration_s:
            raise AudioError(
                ErrorCode.TOO_LONG,
                f"recording is {declared:.0f} s long; the job's maximum is {max_duration_s:.0f} s",
            )
        channels = stream.codec_context.channels or 1
        if split_channels and channels > max_channels:
            raise AudioError(
                ErrorCode.TOO_MANY_CHANNELS,
                f"the recording has {channels} channels; the job transcribes at most "
                f"{max_channels} separately (max_channels)",
            )
        samples = _decode_samples(
            container,
            stream,
            channels,
            split_channels=split_channels,
            max_duration_s=max_duration_s,
            deadline=deadline,
        )
    if samples.shape[1] == 0:
        raise AudioError(ErrorCode.CORRUPT_AUDIO, "the audio stream holds no decodable samples")
    return samples, samples.shape[1] / SAMPLE_RATE


# A channel whose RMS stays below this (-80 dBFS, under 16-bit dither) carries no signal and
# does not count when the channels of a many-channel recording are averaged into one.
_SILENT_CHANNEL_RMS = 1e-4


def _check_deadline(deadline: float) -> None:
    if time.monotonic() > deadline:
        raise AudioError(ErrorCode.DECODE_TIMEOUT, "decoding exceeded the job's time limit")


def _decode_samples(
    container: Any,
    stream: Any,
    channels: int,
    *,
    split_channels: bool,
    max_duration_s: float,
    deadline: float,
) -> np.ndarray:
    """Decode and resample the stream; (channels, samples), one channel unless split."""
    # Mono and stereo keep FFmpeg's own layouts (the settings every benchmark was measured
    # with). Beyond two channels FFmpeg's downmix drops channels: a WAV of 3 or 16 channels
    # has no standard layout and comes out silent, a 5.1 file loses its LFE channel. Those
    # are resampled in their own layout and mixed here, so speech on any channel survives.
    native = channels > 2
    if native:
        layout: Any = stream.codec_context.layout
        width = channels
    else:
        layout = "stereo" if split_channels and channels == 2 else "mono"
        width = 2 if layout == "stereo" else 1
    mix = native and not split_channels
    # Packed float: PyAV's to_ndarray crashes on planar frames of more than 8 channels.
    resampler = av.AudioResampler(format="flt", layout=layout, rate=SAMPLE_RATE)
    pieces: list[np.ndarray] = []
    energy = np.zeros(width, dtype=np.float64)
    samples = 0
    max_samples = int(max_duration_s * SAMPLE_RATE)

    def add(frames: list[Any]) -> None:
        nonlocal samples
        for out in frames:
            arr = out.to_ndarray().reshape(-1, width)
            samples += arr.shape[0]
            if mix:
                # Summed per frame so memory stays that of one channel; divided at the end.
                energy[:] += np.square(arr, dtype=np.float64).sum(axis=0)
                pieces.append(arr.sum(axis=1, dtype=np.float32).reshape(-1, 1))
            else:
                pieces.append(arr)

    try:
        for frame in container.decode(stream):
            frame.pts = None  # let the resampler re-time frames; some files carry bad pts
            add(resampler.resample(frame))
            _check_deadline(deadline)
            if samples > max_samples:
                raise AudioError(
                    ErrorCode.TOO_LONG,
                    f"recording is longer than the job's maximum of {max_duration_s:.0f} s",
                )
        add(resampler.resample(None))
    except av.error.FFmpegError as exc:
        raise AudioError(
            ErrorCode.CORRUPT_AUDIO, f"decoding failed: {exc.strerror or exc}"
        ) from None
    if not pieces:
        return np.zeros((1, 0), dtype=np.float32)
    audio = np.concatenate(pieces).T.copy()
    if mix:
        # The mean over the channels that carry signal: speech recorded on one channel of
        # sixteen reaches VAD and Whisper at the level it was recorded, not 24 dB down.
        rms = np.sqrt(energy / max(samples, 1))
        audio /= max(1, int((rms > _SILENT_CHANNEL_RMS).sum()))
    return audio


def speech_clips(
    channel_audio: np.ndarray, options: AudioOptions, split: bool = False
) -> list[tuple[int, int]]:
    """Speech regions in samples; the whole channel when VAD is off."""
    if not options.vad:
        return [(0, channel_audio.shape[0])] if channel_audio.size else []
    vad = VadOptions(
        threshold=options.vad_threshold,
        min_silence_duration_ms=(
            options.vad_min_silence_split_ms if split else options.vad_min_silence_ms
        ),
        speech_pad_ms=options.vad_speech_pad_ms,
        max_speech_duration_s=options.chunk_length_s,
    )
    return [(c["start"], c["end"]) for c in get_speech_timestamps(channel_audio, vad)]


def pack_clips(
    clips: list[tuple[int, int]], chunk_samples: int, max_gap_samples: int | None = None
) -> list[list[tuple[int, int]]]:
    """Group consecutive clips into chunks of at most ``chunk_samples``; split longer clips.

    With ``max_gap_samples``, a longer pause also starts a new chunk: in a split-channel call
    a pause on one channel is the other party's turn, and a chunk must not span two turns or
    the dialogue cannot be put back in order.
    """
    chunks: list[list[tuple[int, int]]] = []
    current: list[tuple[int, int]] = []
    current_len = 0
    for start, end in clips:
        if current and max_gap_samples is not None and start - current[-1][1] > max_gap_samples:
            chunks.append(current)
            current, current_len = [], 0
        # A clip longer than a chunk (VAD off, or VAD's own hard cut) is cut into pieces.
        while end - start > chunk_samples:
            if current:
                chunks.append(current)
                current, current_len = [], 0
            chunks.append([(start, start + chunk_samples)])
            start += chunk_samples
        if current_len + (end - start) > chunk_samples and current:
            chunks.append(current)
            current, current_len = [], 0
        if end > start:
            current.append((start, end))
            current_len += end - start
    if current:
        chunks.append(current)
    return chunks


class AudioChunker:
    """Holds the feature extractor; call it on bytes. One per decode task process."""

    def __init__(self, options: AudioOptions):
        self.options = options
        self._features = FeatureExtractor(feature_size=options.feature_size)

    def __call__(self, data: bytes, *, split_channels: bool | None = None) -> DecodedAudio:
        opts = self.options
        split = opts.split_channels if split_channels is None else split_channels
        deadline = time.monotonic() + opts.decode_timeout_s
        try:
            audio, duration = decode(
                data,
                split_channels=split,
                max_duration_s=opts.max_duration_s,
                max_channels=opts.max_channels,
                deadline=deadline,
            )
            return self._chunks(audio, duration, deadline)
        except AudioError as exc:
            message = (
                f"{exc} ({opts.decode_timeout_s:.0f} s)"
                if exc.code == ErrorCode.DECODE_TIMEOUT
                else str(exc)
            )
            return DecodedAudio(error_code=exc.code.value, error_message=message)

    def _chunks(self, audio: np.ndarray, duration: float, deadline: float) -> DecodedAudio:
        opts = self.options
        result = DecodedAudio(duration_s=duration, num_channels=audio.shape[0])
        chunk_samples = opts.chunk_length_s * SAMPLE_RATE
        max_gap = int(opts.turn_gap_s * SAMPLE_RATE) if audio.shape[0] > 1 else None
        for channel, channel_audio in enumerate(audio):
            clips = speech_clips(channel_audio, opts, split=audio.shape[0] > 1)
            for group in pack_clips(clips, chunk_samples, max_gap):
                _check_deadline(deadline)
                speech = np.concatenate([channel_audio[s:e] for s, e in group])
                # Same framing as faster-whisper's batched pipeline: drop the last frame.
                feats = self._features(speech)[..., :-1].astype(np.float32, copy=False)
                seconds = [(s / SAMPLE_RATE, e / SAMPLE_RATE) for s, e in group]
                result.chunks.append(Chunk(channel=channel, clips=seconds, features=feats))
        result.speech_s = sum(c.duration_s for c in result.chunks)
        return result


def to_original_time(clips: list[tuple[float, float]], t: float) -> float:
    """Map a time inside a chunk (seconds of concatenated speech) to the recording's time."""
    elapsed = 0.0
    for start, end in clips:
        length = end - start
        if t <= elapsed + length:
            return start + (t - elapsed)
        elapsed += length
    return clips[-1][1] if clips else t
