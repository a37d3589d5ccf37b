"""Audio bytes → per-channel speech chunks as Whisper log-mel features.

This is the CPU half of transcription: decode (PyAV/FFmpeg), resample to 16 kHz, split or mix
channels, find speech with Silero VAD, pack speech into chunks of at most ``chunk_length_s``
and compute each chunk's log-mel features. Doing the features here, on CPU tasks, keeps the
CTranslate2 actors doing nothing but the model: on an H100 faster-whisper's (numpy) feature
extraction of one chunk costs more than its encoder pass. The torch engine on a GPU computes
them itself, with ``torch.stft`` on its device (``AudioOptions.features_on_model``): the
chunks then carry their speech samples instead, and CPU cores only decode audio.

Every failure of an item is classified into one error code from ``schemas.errors``; nothing
here raises for bad input.
"""

from __future__ import annotations

import functools
import io
import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import av
import numpy as np
from faster_whisper.feature_extractor import FeatureExtractor
from faster_whisper.vad import VadOptions, get_speech_timestamps, get_vad_model

from overnight.schemas import ErrorCode
from overnight.workers.blas import one_blas_thread

SAMPLE_RATE = 16_000
# Recordings up to this long (10 min, 38 MB a channel) are decoded once; longer ones twice.
KEEP_DECODED_SAMPLES = 10 * 60 * SAMPLE_RATE
# Channels that the first, scaled, matches but for this share of their energy (-30 dB; a
# squared correlation of 0.999) carry the same recording: copies give 0, at any gain or
# inverted, a joint-stereo codec's a little; two parties give about 1, and with each one's
# echo 20 dB down on the other's line 0.96.
DUAL_MONO_APART = 1e-3
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

# File extensions of the audio and video containers FFmpeg reads: a folder or prefix listing
# takes these as recordings by default (jobs.dataset.manifest.Selection); a manifest row or a file
# named as the input is a recording whatever its name, and is judged by its bytes.
_MEDIA = (
    ".wav .wave .flac .mp3 .mpga .mp2 .m4a .aac .ogg .oga .opus .spx .wma .amr .awb .aif .aiff "
    ".aifc .au .snd .caf .ac3 .eac3 .wv .ape .gsm .vox .mka .mkv .mp4 .m4v .m4b .mov .qt .webm "
    ".avi .wmv .asf .3gp .3g2 .flv .ts .mts .m2ts .mpg .mpeg .vob .ogv"
)
MEDIA_EXTENSIONS = frozenset(_MEDIA.split())


@dataclass(frozen=True)
class AudioOptions:
    """How recordings become chunks. Every field is recorded in the row's ``options``."""

    chunk_length_s: int = 30
    vad: bool = True
    vad_threshold: float = 0.5
    # Silence that splits speech. Plain faster-whisper's 2000 ms keeps short pauses inside a
    # clip; BatchedInferencePipeline's 160 ms cut every pause out, and on 600 synthesized
    # calls that cost 0.18 WER points and 20% more model time (docs/benchmarks.md).
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
    # Keep each chunk's speech samples beside its features (``Chunk.speech``, never in the
    # DECODED row): diarization embeds the speakers' voices from them in the same task. A
    # mono recording short enough to keep decoded also keeps its samples and finer speech
    # regions for it (``DecodedAudio.voice``): WebRTC's VAD, cut at 160 ms pauses
    # (workers.diarize.regions, which the chunks' path of a long recording uses too). On
    # telephone-band calls the transcription's regions (Silero 0.5, 2 s) missed half the
    # speech and bridged turns, and Silero at 0.3 cut at 160 ms still missed 13%: DER 29%
    # against 8.5% with WebRTC's (scripts/bench_diarize.py, seeds 1-2, fine3 vs webrtc).
    keep_speech: bool = False
    # Ship each chunk's 16 kHz float32 speech samples instead of its features (a DECODED
    # chunk with ``feature_size`` 0): the Whisper worker computes the features with its
    # engine's front end, the torch engine's ``LogMel`` on its GPU (jobs.transcribe turns
    # this on for engine torch on cuda). Twice the bytes of 80-mel features in flight
    # (64 KB against 32 KB an audio second; 51 KB with 128 mels), no feature work here.
    features_on_model: bool = False


@dataclass
class Chunk:
    """Up to ``chunk_length_s`` seconds of speech of one channel.

    ``clips`` are the original (start, end) seconds of the speech the chunk concatenates, so
    times inside the chunk map back to the recording's timeline.
    """

    channel: int
    clips: list[tuple[float, float]]
    # (feature_size, frames) float32, not padded; None with ``AudioOptions.features_on_model``
    # (the model computes them from ``speech``).
    features: np.ndarray | None
    # The clips' samples, concatenated (16 kHz float32), with ``features_on_model``, and with
    # ``AudioOptions.keep_speech`` where the recording itself is not kept (``DecodedAudio.voice``).
    speech: np.ndarray | None = None

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
    # ``AudioOptions.keep_speech`` on a mono recording kept in memory: its 16 kHz samples and
    # the speech regions (seconds) to find speakers in. Never in the DECODED row.
    voice: tuple[np.ndarray, list[tuple[float, float]]] | None = None

    def fields(self) -> dict[str, Any]:
        """The decode's columns of a ``schemas.stages.DECODED`` row: status, error, durations
        and chunks."""
        return {
            "status": "error" if self.error_code else "ok",
            "error_code": self.error_code,
            "error_message": self.error_message,
            "duration_s": self.duration_s,
            "speech_s": self.speech_s,
            "chunks": self.chunk_records(),
        }

    def record(self, item_id: str, uri: str, split: bool = False, **extra: Any) -> dict[str, Any]:
        """A whole DECODED row for a recording decoded outside a job (tests, evaluations):
        no fetch and no timings; ``extra`` adds manifest columns (``channel_labels``...)."""
        return {
            "item_id": item_id,
            "uri": uri,
            "fetch_s": 0.0,
            "decode_s": 0.0,
            "decode_units": 1.0,
            "_split": split,
            **self.fields(),
            **extra,
        }

    def chunk_records(self) -> list[dict]:
        """The chunks as the ``chunks`` column of ``schemas.stages.DECODED`` carries them: a
        chunk without features carries its samples, ``feature_size`` 0 (``schemas.stages``)."""
        return [
            {
                "channel": c.channel,
                "clips": [list(clip) for clip in c.clips],
                **_payload(c),
            }
            for c in self.chunks
        ]


def _payload(chunk: Chunk) -> dict[str, Any]:
    if chunk.features is not None:
        return {"feature_size": chunk.features.shape[0], "features": chunk.features.tobytes()}
    assert chunk.speech is not None  # AudioChunker keeps it when it computes no features
    return {"feature_size": 0, "features": chunk.speech.astype(np.float32, copy=False).tobytes()}


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
    ``max_channels``. ``deadline`` is a ``time.monotonic()`` value. The whole recording in
    memory: AudioChunker reads it block by block instead (``Source``).

    Raises AudioError with the reason code.
    """
    source = Source(data, split_channels, max_duration_s, max_channels, deadline)
    audio = np.concatenate(list(source.blocks()), axis=1)
    return audio, audio.shape[1] / SAMPLE_RATE


# A channel whose RMS stays below this (-80 dBFS, under 16-bit dither) carries no signal and
# does not count when the channels of a many-channel recording are averaged into one.
_SILENT_CHANNEL_RMS = 1e-4


def _check_deadline(deadline: float) -> None:
    if time.monotonic() > deadline:
        raise AudioError(ErrorCode.DECODE_TIMEOUT, "decoding exceeded the job's time limit")


def _open(data: bytes) -> tuple[Any, Any]:
    """The container and its first audio stream; AudioError when there is none to decode."""
    if not data:
        raise AudioError(ErrorCode.EMPTY_FILE, "the file is empty (0 bytes)")
    try:
        container = av.open(io.BytesIO(data), mode="r", metadata_errors="ignore")
    except av.error.FFmpegError as exc:
        code = ErrorCode.CORRUPT_AUDIO if _looks_like_audio(data) else ErrorCode.NOT_AUDIO
        raise AudioError(code, f"cannot open as audio: {exc.strerror or exc}") from None
    try:
        if not container.streams.audio:
            raise AudioError(ErrorCode.NO_AUDIO_STREAM, "the container has no audio stream")
        stream = container.streams.audio[0]
        codec_name = stream.codec_context.name if stream.codec_context else None
        if not codec_name or codec_name == "none":
            raise AudioError(ErrorCode.UNSUPPORTED_CODEC, "the audio stream's codec has no decoder")
    except AudioError:
        container.close()
        raise
    return container, stream


class Source:
    """The decoded, 16 kHz channels of one recording, read block by block (one decoded frame
    at a time), as many times as needed: each pass decodes again from the bytes, so memory
    stays a frame's whatever the recording's length (a 4-hour call held 1 GB per hour).

    Checks what it can before decoding (type, codec, declared duration, channels). Mono and
    stereo keep FFmpeg's own layouts (the settings every benchmark was measured with).
    Beyond two channels FFmpeg's downmix drops channels: a WAV of 3 or 16 channels has no
    standard layout and comes out silent, a 5.1 file loses its LFE channel. Those are
    resampled in their own layout and mixed here, so speech on any channel survives.
    """

    def __init__(
        self,
        data: bytes,
        split_channels: bool,
        max_duration_s: float,
        max_channels: int = 8,
        deadline: float = math.inf,
    ):
        self.data, self.max_duration_s, self.deadline = data, max_duration_s, deadline
        container, stream = _open(data)
        with container:
            # Refuse over-long recordings before spending time decoding them.
            declared = None
            if stream.duration is not None and stream.time_base is not None:
                declared = float(stream.duration * stream.time_base)
            elif container.duration is not None:
                declared = container.duration / av.time_base
            channels = stream.codec_context.channels or 1
        if declared is not None and declared > max_duration_s:
            raise AudioError(
                ErrorCode.TOO_LONG,
                f"recording is {declared:.0f} s long; the job's maximum is {max_duration_s:.0f} s",
            )
        if split_channels and channels > max_channels:
            raise AudioError(
                ErrorCode.TOO_MANY_CHANNELS,
                f"the recording has {channels} channels; the job transcribes at most "
                f"{max_channels} separately (max_channels)",
            )
        self.native = channels > 2
        self.mix = self.native and not split_channels
        if self.native:
            self.width = channels
        else:
            self.width = 2 if split_channels and channels == 2 else 1
        self.channels = 1 if self.mix else self.width
        self.divisor = np.float32(1.0)
        if self.mix:
            # The mean over the channels that carry signal: speech recorded on one channel
            # of sixteen reaches VAD and Whisper at the level it was recorded, not 24 dB
            # down. Which channels carry signal takes a pass of its own.
            energy = np.zeros(self.width, dtype=np.float64)
            samples = 0
            for arr in self._frames():
                energy += np.square(arr, dtype=np.float64).sum(axis=0)
                samples += arr.shape[0]
            rms = np.sqrt(energy / max(samples, 1))
            self.divisor = np.float32(max(1, int((rms > _SILENT_CHANNEL_RMS).sum())))

    def blocks(self) -> Iterator[np.ndarray]:
        """(channels, samples) float32 blocks in order; AudioError when decoding fails or the
        recording holds no samples."""
        any_samples = False
        for arr in self._frames():
            any_samples = any_samples or arr.shape[0] > 0
            if self.mix:
                yield (arr.sum(axis=1, dtype=np.float32) / self.divisor).reshape(1, -1)
            else:
                yield arr.T
        if not any_samples:
            raise AudioError(ErrorCode.CORRUPT_AUDIO, "the audio stream holds no decodable samples")

    def _frames(self) -> Iterator[np.ndarray]:
        """Resampled frames as (samples, width) float32."""
        container, stream = _open(self.data)
        if self.native:
            layout: Any = stream.codec_context.layout
        else:
            layout = "stereo" if self.width == 2 else "mono"
        # Packed float: PyAV's to_ndarray crashes on planar frames of more than 8 channels.
        resampler = av.AudioResampler(format="flt", layout=layout, rate=SAMPLE_RATE)
        samples = 0
        max_samples = int(self.max_duration_s * SAMPLE_RATE)
        with container:
            try:
                for frame in container.decode(stream):
                    frame.pts = None  # let the resampler re-time frames; some carry bad pts
                    for out in resampler.resample(frame):
                        arr = _finite(out.to_ndarray().reshape(-1, self.width))
                        samples += arr.shape[0]
                        yield arr
                    _check_deadline(self.deadline)
                    if samples > max_samples:
                        raise AudioError(
                            ErrorCode.TOO_LONG,
                            "recording is longer than the job's maximum of "
                            f"{self.max_duration_s:.0f} s",
                        )
                for out in resampler.resample(None):
                    yield _finite(out.to_ndarray().reshape(-1, self.width))
            except av.error.FFmpegError as exc:
                raise AudioError(
                    ErrorCode.CORRUPT_AUDIO, f"decoding failed: {exc.strerror or exc}"
                ) from None


def _finite(samples: np.ndarray) -> np.ndarray:
    """Samples that are not numbers (NaN or infinite, which a float WAV can hold and the
    resampler spreads to its neighbours) as silence. Left in, one of them made its whole
    chunk's features NaN (the log-mel's floor is taken from its maximum), and 10 such samples
    of a 6 s float WAV came out as an ok row reading "))))))))"."""
    if np.isfinite(samples).all():
        return samples
    return np.nan_to_num(samples, nan=0.0, posinf=0.0, neginf=0.0)


# Silero VAD as faster-whisper runs it (faster_whisper.vad.SileroVADModel): 512-sample
# windows, each with the previous window's last 64 samples as context, 10,000 windows per
# model call with the recurrent state carried between calls. Calling it on the same batches
# gives the same probabilities as on the whole recording at once.
_VAD_WINDOW = 512
_VAD_CONTEXT = 64
_VAD_BATCH = 10_000
# Silero's input, never Whisper's, gets a noise floor in the telephone band (300-3,400 Hz) at
# -60 dBFS, the level of a phone line's comfort noise. Without it Silero misses most
# telephone-band speech between stretches of digital silence (VoIP recordings with silence
# suppression): on 2-speaker calls of real voices (scripts/bench_diarize.py's mixes, telephone
# copies, seeds 3 and 5) it passed 0.16 of the speech windows, against 0.93 of the same calls
# in wideband. With the floor: 0.58-0.68 (wideband unchanged), and 0.01-0.02 of the silence.
# White noise at that level made it worse (0.02): Silero takes energy above 4 kHz for "not
# speech" here. The floor is one fixed 4.1 s pattern repeated, so a channel streamed in
# blocks gets the same floor as when it is whole. Figures: docs/explanation/how-it-works.md,
# "Speech detection on telephone audio".
VAD_NOISE_FLOOR_DBFS = -60.0
_FLOOR_PERIOD = 1 << 16


@functools.cache
def _vad_floor() -> np.ndarray:
    spectrum = np.fft.rfft(np.random.default_rng(0).standard_normal(_FLOOR_PERIOD))
    freqs = np.fft.rfftfreq(_FLOOR_PERIOD, 1 / SAMPLE_RATE)
    spectrum[(freqs < 300) | (freqs > 3400)] = 0
    floor = np.fft.irfft(spectrum, _FLOOR_PERIOD)  # circular: the pattern repeats seamlessly
    floor *= 10 ** (VAD_NOISE_FLOOR_DBFS / 20) / np.sqrt(np.mean(floor**2))
    return floor.astype(np.float32)


def vad_input(samples: np.ndarray, offset: int = 0) -> np.ndarray:
    """``samples`` (starting at sample ``offset`` of their channel) with the VAD's floor."""
    floor = _vad_floor()
    first = offset % _FLOOR_PERIOD
    reps = (first + samples.size) // _FLOOR_PERIOD + 1
    return samples + np.tile(floor, reps)[first : first + samples.size]


# A channel whose loudest sample is below -40 dBFS (and above -80 dBFS, a few steps of 16-bit
# audio: silence and dither) has its speech found at a -20 dBFS peak.
QUIET_PEAK = 10 ** (-40 / 20)
SILENT_PEAK = 10 ** (-80 / 20)
HEARD_PEAK = 10 ** (-20 / 20)


def quiet_gain(peak: float, quiet: float = QUIET_PEAK) -> float:
    """The gain the VAD hears a channel with: 1 unless its peak is below ``quiet`` (and not
    below ``SILENT_PEAK``), then what raises the peak to ``HEARD_PEAK``. Speech peaking at
    -45 dBFS passed 32% of its windows through the floored VAD and at -50 dBFS none; raised,
    82%, as at normal level. The transcript's samples are never changed (Whisper read the
    -50 and -60 dBFS copies right)."""
    if not SILENT_PEAK <= peak < quiet:
        return 1.0
    return HEARD_PEAK / peak


class StreamingVad:
    """Speech probabilities of one channel fed block by block, in one batch's memory."""

    def __init__(self) -> None:
        self._session = get_vad_model().session
        self._h = np.zeros((1, 1, 128), dtype=np.float32)
        self._c = np.zeros((1, 1, 128), dtype=np.float32)
        self._context = np.zeros(_VAD_CONTEXT, dtype=np.float32)
        self._pending: list[np.ndarray] = []
        self._pending_n = 0
        self._probs: list[np.ndarray] = []
        self.samples = 0

    def feed(self, audio: np.ndarray) -> None:
        audio = vad_input(audio, self.samples)
        self._pending.append(audio)
        self._pending_n += audio.size
        self.samples += audio.size
        batch = _VAD_BATCH * _VAD_WINDOW
        if self._pending_n >= batch:
            buf = np.concatenate(self._pending)
            full = buf.size // batch * batch
            for start in range(0, full, batch):
                self._run(buf[start : start + batch])
            self._pending = [buf[full:]]
            self._pending_n = buf.size - full

    def finish(self) -> np.ndarray:
        """Probabilities of every window, the last one padded with zeros as faster-whisper
        pads (a whole window when the length is a multiple of 512)."""
        buf = np.concatenate(self._pending) if self._pending else np.zeros(0, np.float32)
        self._run(np.pad(buf, (0, _VAD_WINDOW - buf.size % _VAD_WINDOW)))
        self._pending, self._pending_n = [], 0
        return np.concatenate(self._probs).reshape(-1)

    def _run(self, audio: np.ndarray) -> None:
        windows = audio.reshape(-1, _VAD_WINDOW)
        context = np.concatenate([self._context[None, :], windows[:-1, -_VAD_CONTEXT:]])
        self._context = windows[-1, -_VAD_CONTEXT:].copy()
        batched = np.concatenate([context, windows], axis=1)
        out, self._h, self._c = self._session.run(
            None, {"input": batched, "h": self._h, "c": self._c}
        )
        self._probs.append(out)


def _vad_options(options: AudioOptions, split: bool) -> VadOptions:
    return VadOptions(
        threshold=options.vad_threshold,
        min_silence_duration_ms=(
            options.vad_min_silence_split_ms if split else options.vad_min_silence_ms
        ),
        speech_pad_ms=options.vad_speech_pad_ms,
        max_speech_duration_s=options.chunk_length_s,
    )


def speech_regions(probs: np.ndarray, length: int, vad: VadOptions) -> list[tuple[int, int]]:
    """Speech (start, end) samples from window probabilities: the decision rules of
    faster_whisper.vad.get_speech_timestamps (faster-whisper 1.2, MIT licence), taken apart
    from its model call so that the probabilities can come from a stream."""
    window = _VAD_WINDOW
    rate = SAMPLE_RATE
    threshold = vad.threshold
    neg_threshold = vad.neg_threshold
    min_speech_samples = rate * vad.min_speech_duration_ms / 1000
    speech_pad_samples = rate * vad.speech_pad_ms / 1000
    max_speech_samples = rate * vad.max_speech_duration_s - window - 2 * speech_pad_samples
    min_silence_samples = rate * vad.min_silence_duration_ms / 1000
    min_silence_samples_at_max_speech = rate * 98 / 1000
    if neg_threshold is None:
        neg_threshold = max(threshold - 0.15, 0.01)

    triggered = False
    speeches: list[dict[str, int]] = []
    current: dict[str, int] = {}
    temp_end = 0  # a possible end of speech (some silence is tolerated)
    prev_end = next_start = 0  # possible cut points when a segment reaches its maximum
    for i, prob in enumerate(probs):
        if prob >= threshold and temp_end:
            temp_end = 0
            if next_start < prev_end:
                next_start = window * i
        if prob >= threshold and not triggered:
            triggered = True
            current["start"] = window * i
            continue
        if triggered and window * i - current["start"] > max_speech_samples:
            if prev_end:
                current["end"] = prev_end
                speeches.append(current)
                current = {}
                # silence was reached (< neg_threshold) and speech has not resumed
                if next_start < prev_end:
                    triggered = False
                else:
                    current["start"] = next_start
                prev_end = next_start = temp_end = 0
            else:
                current["end"] = window * i
                speeches.append(current)
                current = {}
                prev_end = next_start = temp_end = 0
                triggered = False
                continue
        if prob < neg_threshold and triggered:
            if not temp_end:
                temp_end = window * i
            # do not cut in a very short silence
            if window * i - temp_end > min_silence_samples_at_max_speech:
                prev_end = temp_end
            if window * i - temp_end < min_silence_samples:
                continue
            current["end"] = temp_end
            if current["end"] - current["start"] > min_speech_samples:
                speeches.append(current)
            current = {}
            prev_end = next_start = temp_end = 0
            triggered = False
            continue
    if current and length - current["start"] > min_speech_samples:
        current["end"] = length
        speeches.append(current)

    for i, speech in enumerate(speeches):
        if i == 0:
            speech["start"] = int(max(0, speech["start"] - speech_pad_samples))
        if i != len(speeches) - 1:
            gap = speeches[i + 1]["start"] - speech["end"]
            if gap < 2 * speech_pad_samples:
                speech["end"] += int(gap // 2)
                speeches[i + 1]["start"] = int(max(0, speeches[i + 1]["start"] - gap // 2))
            else:
                speech["end"] = int(min(length, speech["end"] + speech_pad_samples))
                speeches[i + 1]["start"] = int(
                    max(0, speeches[i + 1]["start"] - speech_pad_samples)
                )
        else:
            speech["end"] = int(min(length, speech["end"] + speech_pad_samples))
    return [(s["start"], s["end"]) for s in speeches]


def speech_clips(
    channel_audio: np.ndarray, options: AudioOptions, split: bool = False
) -> list[tuple[int, int]]:
    """Speech regions in samples of a whole channel in memory; the whole channel when VAD
    is off. (AudioChunker finds the same regions from a stream.)"""
    if not options.vad:
        return [(0, channel_audio.shape[0])] if channel_audio.size else []
    vad = _vad_options(options, split)
    heard = vad_input(channel_audio)
    return [(c["start"], c["end"]) for c in get_speech_timestamps(heard, vad)]


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
        self._features = (
            None
            if options.features_on_model
            else FeatureExtractor(feature_size=options.feature_size)
        )

    def __call__(self, data: bytes, *, split_channels: bool | None = None) -> DecodedAudio:
        opts = self.options
        split = opts.split_channels if split_channels is None else split_channels
        deadline = time.monotonic() + opts.decode_timeout_s
        try:
            source = Source(data, split, opts.max_duration_s, opts.max_channels, deadline)
            return self._chunks(source, deadline)
        except AudioError as exc:
            message = (
                f"{exc} ({opts.decode_timeout_s:.0f} s)"
                if exc.code == ErrorCode.DECODE_TIMEOUT
                else str(exc)
            )
            return DecodedAudio(error_code=exc.code.value, error_message=message)

    def _chunks(self, source: Source, deadline: float) -> DecodedAudio:
        """Two passes over the decoded stream, so that memory does not grow with the
        recording: the first finds speech (VAD in one model batch's memory), the second cuts
        exactly those samples out, one chunk at a time. A recording without speech is
        decoded once; a quiet one that is not kept in memory three times (its VAD again,
        raised: ``quiet_gain``)."""
        opts = self.options
        channels = source.channels
        vads = [StreamingVad() for _ in range(channels)] if opts.vad else []
        length = 0
        # A short recording's samples are kept from the first pass, so the second one cuts
        # from memory instead of decoding and resampling it again (a third of the decode
        # stage's time on 5-30 s clips); a long one is decoded twice, in bounded memory.
        kept: list[np.ndarray] | None = []
        # How alike the other channels are to the first (their correlation, so a copy at
        # another gain or inverted counts): a "stereo" export with the call on both channels.
        energy, own, cross = 0.0, np.zeros(channels), np.zeros(channels)
        peaks = np.zeros(channels, np.float32)
        for block in source.blocks():
            length += block.shape[1]
            for channel, vad in enumerate(vads):
                vad.feed(block[channel])
            if block.shape[1]:
                peaks = np.maximum(peaks, np.abs(block).max(axis=1))
            if channels > 1:
                first, others = block[0].astype(np.float64), block[1:].astype(np.float64)
                energy += float(first @ first)
                own[1:] += np.einsum("ij,ij->i", others, others)
                cross[1:] += others @ first
            if kept is not None:
                kept.append(block)
                if length > KEEP_DECODED_SAMPLES:
                    kept = None
        if (
            channels > 1
            and energy > 0
            and np.all(own[1:] > 0)
            and np.all(cross[1:] ** 2 >= (1 - DUAL_MONO_APART) * energy * own[1:])
        ):
            # Dual mono: one recording of the whole call on every channel (softphone and
            # some PBX exports). Split, it gave every channel the same transcript and
            # 100% overtalk; it is one channel, a mono call (which ``--diarize`` diarizes).
            channels, vads = 1, vads[:1]
        gains = [quiet_gain(float(peak)) for peak in peaks[:channels]]
        for channel, gain in enumerate(gains):
            if vads and gain != 1.0:
                # A quiet channel's VAD again, its samples raised: the VAD's noise floor
                # (``vad_input``) masked speech peaking below about -45 dBFS, and such a call
                # came out as "no speech" where Whisper reads it word for word.
                vads[channel] = StreamingVad()
                _check_deadline(deadline)
                for block in source.blocks() if kept is None else kept:
                    vads[channel].feed(block[channel] * np.float32(gain))
        result = DecodedAudio(duration_s=length / SAMPLE_RATE, num_channels=channels)
        chunk_samples = opts.chunk_length_s * SAMPLE_RATE
        max_gap = int(opts.turn_gap_s * SAMPLE_RATE) if channels > 1 else None
        groups: list[list[list[tuple[int, int]]]] = []
        for channel in range(channels):
            if vads:
                vad_options = _vad_options(opts, split=channels > 1)
                probs = vads[channel].finish()
                clips = speech_regions(probs, length, vad_options)
            else:
                probs, clips = None, [(0, length)] if length else []
            groups.append(pack_clips(clips, chunk_samples, max_gap))
            if opts.keep_speech and channels == 1 and kept is not None and length:
                samples = np.concatenate(kept, axis=1)[0]
                result.voice = (samples, self._voice(samples, probs is not None))
        if any(groups):
            _check_deadline(deadline)
            # Diarization takes the chunks' samples only where it has no whole recording.
            keep = opts.keep_speech and result.voice is None
            for chunks in self._cut(source.blocks() if kept is None else kept, groups, keep):
                result.chunks.extend(chunks)
        result.speech_s = sum(c.duration_s for c in result.chunks)
        return result

    def _voice(self, samples: np.ndarray, vad: bool) -> list[tuple[float, float]]:
        """Speech regions for finding speakers (the whole recording with VAD off)."""
        if not vad:
            return [(0.0, len(samples) / SAMPLE_RATE)]
        from overnight.workers.diarize.regions import voice_regions

        return voice_regions(samples)

    def _cut(
        self,
        blocks: Iterable[np.ndarray],
        groups: list[list[list[tuple[int, int]]]],
        keep_speech: bool = False,
    ) -> list[list[Chunk]]:
        """Each channel's chunks: the samples of its current group's clips are collected as
        the blocks go by, and a complete group becomes features at once."""
        out: list[list[Chunk]] = [[] for _ in groups]
        current = [0] * len(groups)
        pieces: list[list[np.ndarray]] = [[] for _ in groups]
        pos = 0
        for block in blocks:
            n = block.shape[1]
            for channel, channel_groups in enumerate(groups):
                while current[channel] < len(channel_groups):
                    group = channel_groups[current[channel]]
                    for start, end in group:
                        lo, hi = max(start, pos), min(end, pos + n)
                        if lo < hi:
                            pieces[channel].append(block[channel, lo - pos : hi - pos].copy())
                    if group[-1][1] > pos + n:
                        break  # the group goes on in a later block
                    chunk = self._chunk(channel, group, pieces[channel], keep_speech)
                    out[channel].append(chunk)
                    pieces[channel] = []
                    current[channel] += 1
            pos += n
        if any(current[c] < len(g) for c, g in enumerate(groups)):
            # Both passes decode the same bytes the same way; a shorter second pass would
            # otherwise lose speech without a word.
            raise AudioError(ErrorCode.CORRUPT_AUDIO, "the audio decoded shorter the second time")
        return out

    def _chunk(
        self,
        channel: int,
        group: list[tuple[int, int]],
        pieces: list[np.ndarray],
        keep_speech: bool = False,
    ) -> Chunk:
        speech = np.concatenate(pieces)
        seconds = [(s / SAMPLE_RATE, e / SAMPLE_RATE) for s, e in group]
        if self._features is None:  # features_on_model: the samples go to the model
            return Chunk(channel=channel, clips=seconds, features=None, speech=speech)
        # Same framing as faster-whisper's batched pipeline: drop the last frame.
        feats = features_of(self._features, speech)
        kept = speech if keep_speech else None
        return Chunk(channel=channel, clips=seconds, features=feats, speech=kept)


def features_of(extractor: FeatureExtractor, speech: np.ndarray) -> np.ndarray:
    """A chunk's features as the Whisper worker takes them: faster-whisper's log-mel of its
    samples without the last frame (the batched pipeline's framing), float32.

    Computed with one BLAS thread, whatever the process has: OpenBLAS splits the mel product
    among its threads and rounds differently for each split, so the same samples gave other
    features in a Ray decode task (one thread) than in the Whisper actor or in-process (two
    on a 2-core machine), and tiny.en at times other words."""
    with one_blas_thread():
        return extractor(speech)[..., :-1].astype(np.float32, copy=False)


def to_original_time(clips: list[tuple[float, float]], t: float) -> float:
    """Map a time inside a chunk (seconds of concatenated speech) to the recording's time.

    A time on the seam of two clips maps to the end of the earlier one. A span's two ends
    mapped apart here can land on either side of a pause: words and segments map with
    :func:`span_to_original_time`, which keeps a span inside the clips it was spoken in."""
    elapsed = 0.0
    for start, end in clips:
        length = end - start
        if t <= elapsed + length:
            return start + (t - elapsed)
        elapsed += length
    return clips[-1][1] if clips else t


def clip_index(clips: list[tuple[float, float]], t: float, is_end: bool = False) -> int:
    """The clip a chunk time falls in. On the seam of two clips a start (``is_end`` False)
    belongs to the later clip and an end to the earlier, as faster-whisper's
    ``SpeechTimestampsMap.get_chunk_index``; times past the last clip belong to it."""
    elapsed = 0.0
    for i, (start, end) in enumerate(clips):
        elapsed += end - start
        if t < elapsed or (is_end and t == elapsed):
            return i
    return max(len(clips) - 1, 0)


def _through_clip(clips: list[tuple[float, float]], index: int, t: float) -> float:
    """Chunk time ``t`` mapped through clip ``index``, kept inside that clip: a time that
    ran past the clip's edge lands on the edge, never in the silence beside it."""
    elapsed = sum(end - start for start, end in clips[:index])
    start, end = clips[index]
    return min(max(start + (t - elapsed), start), end)


def span_to_original_time(
    clips: list[tuple[float, float]], start: float, end: float, whole: bool = False
) -> tuple[float, float]:
    """Map a span of a chunk (a word, or a segment) to the recording's time without
    stretching it across the silence the VAD cut out.

    The VAD concatenates speech clips that lie seconds apart, and Whisper's alignment places
    words on that concatenation: a word can cross the seam of two clips by a few frames.
    Mapping its start and its end apart then spans the whole gap (a 0.9 s word became a 21 s
    one, and took that speaker's turn, talk time and interruptions with it).

    - A word (``whole`` False) is mapped through one clip, the one its midpoint falls in,
      and clipped to it, as faster-whisper's ``restore_speech_timestamps`` does (it maps by
      the midpoint too, without the clipping). The midpoint's clip holds part of the word
      (at least half of one that crosses a single seam), so a word keeps a length, where the
      clip of its start would cut a word that begins on a clip's last frames to nothing; and
      a word Whisper started early, in the pause before it, goes with most of it. (A first
      word aligned mostly before the seam still stays in the earlier clip, at its end.)
    - A segment without words (``whole`` True) may rightly run over several clips: its start
      maps through the clip it falls in, its end through the clip it ends in (a seam is the
      end of the earlier clip), each kept inside its clip. Only a span whose ends fall in
      clips the wrong way round (a span of no length on a seam) maps as a word.

    Empty ``clips``: the chunk's times are the recording's."""
    if not clips:
        return start, end
    if whole:
        first, last = clip_index(clips, start), clip_index(clips, end, is_end=True)
        if first <= last:
            return _through_clip(clips, first, start), _through_clip(clips, last, end)
    index = clip_index(clips, (start + end) / 2)
    return _through_clip(clips, index, start), _through_clip(clips, index, end)
