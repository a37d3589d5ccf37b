"""Decoding, channel handling, VAD packing and time mapping."""

from __future__ import annotations

import io
from dataclasses import replace

import numpy as np
import pytest

from overnight.jobs.ops.demo import noise, silence, write_wav
from overnight.workers.audio import (
    SAMPLE_RATE,
    AudioChunker,
    AudioOptions,
    features_of,
    pack_clips,
    quiet_gain,
    to_original_time,
)


def wav(audio: np.ndarray) -> bytes:
    buf = io.BytesIO()
    write_wav(buf, audio)
    return buf.getvalue()


def tone(seconds: float, hz: float = 220.0) -> np.ndarray:
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def test_errors_are_classified_not_raised():
    chunker = AudioChunker(AudioOptions())
    assert chunker(b"").error_code == "empty_file"
    assert chunker(b"hello, this is a text file, not audio").error_code == "not_audio"
    assert chunker(b"fLaC" + bytes(500)).error_code == "corrupt_audio"
    assert (
        AudioChunker(AudioOptions(max_duration_s=1.0))(wav(silence(3.0))).error_code == "too_long"
    )


def test_stereo_is_mixed_down_unless_split():
    stereo = np.stack([tone(2.0), silence(2.0)])
    mixed = AudioChunker(AudioOptions(vad=False))(wav(stereo))
    split = AudioChunker(AudioOptions(vad=False, split_channels=True))(wav(stereo))
    assert mixed.num_channels == 1 and {c.channel for c in mixed.chunks} == {0}
    assert split.num_channels == 2 and {c.channel for c in split.chunks} == {0, 1}
    assert mixed.duration_s == split.duration_s == 2.0


def test_a_dual_mono_export_split_is_one_channel_and_a_call_with_echo_stays_two():
    # Softphone and some PBX exports put the whole call on both channels. Split, each channel
    # gave the same transcript and the analytics 100% overtalk; as one channel it is a mono
    # call, which --diarize diarizes (its samples kept for the speaker encoder).
    from overnight.jobs.ops.demo import stereo_dialogue

    dialogue, _ = stereo_dialogue()
    call = dialogue.sum(axis=0)
    rng = np.random.default_rng(0)
    lossy = call + rng.normal(0, 0.002, call.size).astype(np.float32)  # -40 dB or so
    split = AudioOptions(split_channels=True, keep_speech=True)
    for same in (np.stack([call, call]), np.stack([call, lossy]), np.stack([call, -0.5 * call])):
        decoded = AudioChunker(split)(wav(same))
        assert decoded.error_code is None and decoded.num_channels == 1
        assert {c.channel for c in decoded.chunks} == {0} and decoded.voice is not None
    # Two parties, each line carrying the other's echo 20 dB down: two channels.
    echo = np.stack([dialogue[0] + 0.1 * dialogue[1], dialogue[1] + 0.1 * dialogue[0]])
    for stereo in (dialogue, echo):
        decoded = AudioChunker(split)(wav(stereo))
        assert decoded.num_channels == 2 and {c.channel for c in decoded.chunks} == {0, 1}
        assert decoded.voice is None
    # Unsplit, any stereo file is mixed down as before.
    assert AudioChunker(AudioOptions())(wav(np.stack([call, call]))).num_channels == 1


def _float_wav(audio: np.ndarray) -> bytes:
    """A 32-bit IEEE float WAV (format 3), which can hold NaN and infinite samples."""
    import struct

    data = audio.astype("<f4").tobytes()
    fmt = struct.pack("<IHHIIHH", 16, 3, 1, SAMPLE_RATE, 4 * SAMPLE_RATE, 4, 32)
    riff = struct.pack("<I", 36 + len(data))
    return b"RIFF" + riff + b"WAVE" + b"fmt " + fmt + b"data" + struct.pack("<I", len(data)) + data


def test_samples_that_are_not_numbers_are_silence_not_a_chunk_of_nan_features():
    # 10 NaN samples of a float WAV made its whole chunk's features NaN (the log-mel's floor
    # comes from its maximum), and the job wrote an ok row reading "))))))))".
    from overnight.jobs.ops.demo import speak

    speech = speak("Thank you for calling, how can I help you today?")
    chunker = AudioChunker(AudioOptions())
    zeroed = speech.copy()
    zeroed[20_000:20_030] = 0.0
    expected = chunker(_float_wav(zeroed))
    for bad in (np.nan, np.inf, -np.inf):
        broken = speech.copy()
        broken[20_000:20_030] = bad
        decoded = chunker(_float_wav(broken))
        assert decoded.error_code is None and len(decoded.chunks) == len(expected.chunks) > 0
        for got, want in zip(decoded.chunks, expected.chunks, strict=True):
            assert np.isfinite(got.features).all()
            assert np.array_equal(got.features, want.features)


def test_a_quiet_call_is_heard_and_quiet_noise_stays_silence():
    # The VAD's -60 dBFS noise floor masked speech peaking below about -45 dBFS: such a call
    # was an ok row of "no speech", where Whisper reads even a -60 dBFS copy word for word.
    # The VAD hears a quiet channel raised to a -20 dBFS peak; the chunks keep its samples.
    from overnight.jobs.ops.demo import speak

    speech = speak("Thank you for calling, how can I help you today?")
    speech = speech / np.abs(speech).max()
    chunker = AudioChunker(AudioOptions(keep_speech=True))
    loud = chunker(wav(speech * 10 ** (-20 / 20)))
    for db in (-50.0, -60.0):
        quiet = speech * 10 ** (db / 20)
        decoded = chunker(wav(quiet))
        assert decoded.speech_s >= 0.9 * loud.speech_s > 0, db
        assert decoded.voice is not None and decoded.voice[1], db  # the diarizer's regions
        assert np.abs(decoded.voice[0]).max() < 2 * 10 ** (db / 20)  # never raised itself
    rng = np.random.default_rng(1)
    for db in (-45.0, -55.0, -70.0):
        hiss = rng.standard_normal(8 * SAMPLE_RATE)
        hum = np.sin(2 * np.pi * 50 * np.arange(8 * SAMPLE_RATE) / SAMPLE_RATE)
        for quiet_noise in (hiss, hum):
            level = 10 ** (db / 20) / np.abs(quiet_noise).max()
            assert chunker(wav((quiet_noise * level).astype(np.float32))).chunks == [], db
    assert quiet_gain(0.5) == quiet_gain(0.0) == quiet_gain(1e-5) == 1.0
    assert quiet_gain(10 ** (-50 / 20)) == pytest.approx(10 ** (30 / 20))


def test_without_vad_long_audio_is_cut_into_chunks_of_at_most_the_chunk_length():
    d = AudioChunker(AudioOptions(vad=False, chunk_length_s=10))(wav(noise(25.0)))
    assert [round(c.duration_s, 3) for c in d.chunks] == [10.0, 10.0, 5.0]
    assert all(c.features.shape[0] == 80 and c.features.shape[1] <= 1000 for c in d.chunks)


def test_vad_keeps_no_chunk_for_noise():
    d = AudioChunker(AudioOptions())(wav(noise(4.0)))
    assert d.error_code is None and d.chunks == [] and d.speech_s == 0


def test_pack_clips_respects_chunk_length_and_turn_gaps():
    clips = [(0, 100), (150, 300), (1000, 1100)]
    assert pack_clips(clips, chunk_samples=1000) == [[(0, 100), (150, 300), (1000, 1100)]]
    assert pack_clips(clips, chunk_samples=1000, max_gap_samples=200) == [
        [(0, 100), (150, 300)],
        [(1000, 1100)],
    ]
    assert pack_clips([(0, 2500)], chunk_samples=1000) == [
        [(0, 1000)],
        [(1000, 2000)],
        [(2000, 2500)],
    ]


def test_times_inside_a_chunk_map_back_to_the_recording():
    clips = [(1.0, 3.0), (10.0, 11.0)]  # 2 s then 1 s of speech
    assert to_original_time(clips, 0.5) == 1.5
    assert to_original_time(clips, 2.5) == 10.5
    assert to_original_time(clips, 99) == 11.0


_UTTERANCE = "Please call me back tomorrow morning."


@pytest.fixture(scope="module")
def utterance() -> np.ndarray:
    from overnight.jobs.ops.demo import espeak_available, speak

    if not espeak_available():
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng)")
    return np.concatenate([silence(0.5), speak(_UTTERANCE), silence(0.5)])


def on_channels(speech: np.ndarray, channels: int, speaking: tuple[int, ...]) -> np.ndarray:
    audio = np.zeros((channels, speech.size), dtype=np.float32)
    audio[list(speaking)] = speech
    return audio


# FFmpeg's downmix dropped each of these: 3 and 16 channels have no standard layout, and
# channel 3 of 6 is 5.1's LFE.
_MULTICHANNEL = [(3, (2,)), (6, (3,)), (16, (3,)), (16, (12, 13, 14, 15))]


@pytest.mark.parametrize(("channels", "speaking"), _MULTICHANNEL)
def test_speech_on_any_channel_of_a_multichannel_file_survives_mixdown(
    utterance, channels, speaking
):
    mono = AudioChunker(AudioOptions())(wav(utterance))
    mixed = AudioChunker(AudioOptions())(wav(on_channels(utterance, channels, speaking)))
    assert mixed.error_code is None and mixed.num_channels == 1
    # The same speech as the utterance alone in a mono file, at the level it was recorded.
    assert mixed.speech_s == pytest.approx(mono.speech_s, abs=0.1) and mono.speech_s > 2
    assert np.allclose(mixed.chunks[0].features, mono.chunks[0].features, atol=1e-3)


@pytest.mark.parametrize(("channels", "speaking"), _MULTICHANNEL)
def test_split_channels_keeps_every_channel_of_a_multichannel_file(utterance, channels, speaking):
    split = AudioChunker(AudioOptions(split_channels=True, max_channels=16))(
        wav(on_channels(utterance, channels, speaking))
    )
    assert split.error_code is None and split.num_channels == channels
    assert {c.channel for c in split.chunks} == set(speaking)


def test_split_channels_beyond_the_maximum_is_too_many_channels(utterance):
    data = wav(on_channels(utterance, 16, (12,)))
    split = AudioChunker(AudioOptions(split_channels=True))(data)  # the default maximum is 8
    assert split.error_code == "too_many_channels" and "16 channels" in split.error_message
    # A mono mix-down has no channel limit.
    assert AudioChunker(AudioOptions())(data).speech_s > 2


def test_a_decode_past_its_time_limit_is_decode_timeout():
    decoded = AudioChunker(AudioOptions(decode_timeout_s=1e-9))(wav(noise(3.0)))
    assert decoded.error_code == "decode_timeout" and "time limit" in decoded.error_message
    assert AudioChunker(AudioOptions(decode_timeout_s=60))(wav(noise(3.0))).error_code is None


def _whole_file_chunks(data: bytes, options: AudioOptions) -> list[tuple[int, list, np.ndarray]]:
    """The chunks as they were made before decoding streamed: the whole recording in
    memory, faster-whisper's get_speech_timestamps on each whole channel."""
    from faster_whisper.feature_extractor import FeatureExtractor

    from overnight.workers.audio import decode, speech_clips

    audio, _ = decode(data, split_channels=options.split_channels, max_duration_s=1e9)
    features = FeatureExtractor(feature_size=options.feature_size)
    max_gap = int(options.turn_gap_s * SAMPLE_RATE) if audio.shape[0] > 1 else None
    out = []
    for channel, channel_audio in enumerate(audio):
        clips = speech_clips(channel_audio, options, split=audio.shape[0] > 1)
        for group in pack_clips(clips, options.chunk_length_s * SAMPLE_RATE, max_gap):
            speech = np.concatenate([channel_audio[s:e] for s, e in group])
            seconds = [(s / SAMPLE_RATE, e / SAMPLE_RATE) for s, e in group]
            out.append((channel, seconds, features_of(features, speech)))
    return out


def test_streamed_decoding_makes_exactly_the_chunks_of_the_whole_file_decode(utterance):
    from overnight.jobs.ops.demo import stereo_dialogue

    # 330 s: Silero runs 320 s (10,000 windows) per call, and the second utterance of the
    # long recording straddles that boundary.
    long = np.zeros(330 * SAMPLE_RATE, dtype=np.float32) + noise(330.0, level=0.001)
    for at_s in (5.0, 318.5):
        start = int(at_s * SAMPLE_RATE)
        long[start : start + utterance.size] += utterance
    dialogue, _ = stereo_dialogue()
    cases = [
        (wav(long), AudioOptions()),
        (wav(dialogue), AudioOptions(split_channels=True)),
        (wav(dialogue), AudioOptions()),
        (wav(on_channels(utterance, 6, (3,))), AudioOptions()),
        (wav(noise(3.0)), AudioOptions(vad=False, chunk_length_s=10)),
    ]
    for data, options in cases:
        streamed = AudioChunker(options)(data)
        expected = _whole_file_chunks(data, options)
        assert streamed.error_code is None and len(streamed.chunks) == len(expected) > 0
        for chunk, (channel, seconds, features) in zip(streamed.chunks, expected, strict=True):
            assert (chunk.channel, chunk.clips) == (channel, seconds)
            assert np.array_equal(chunk.features, features)
    long_clips = [c.clips for c in AudioChunker(AudioOptions())(wav(long)).chunks]
    assert any(start < 320.0 < end for clips in long_clips for start, end in clips)


def _flac_silence(path, hours: float) -> None:
    import av

    with av.open(str(path), "w", format="flac") as out:
        stream = out.add_stream("flac", rate=SAMPLE_RATE, layout="mono")
        minute = np.zeros((1, 60 * SAMPLE_RATE), dtype=np.int16)
        for _ in range(round(hours * 60)):
            frame = av.AudioFrame.from_ndarray(minute, format="s16", layout="mono")
            frame.sample_rate = SAMPLE_RATE
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def _decode_peak_mb(path) -> dict:
    """Chunk one file in a fresh process; its result and peak resident memory."""
    import json
    import subprocess
    import sys

    from tests.conftest import REPO

    # The peak resident size, which counts FFmpeg's and onnxruntime's buffers as well as
    # Python's and numpy's: the process's own VmHWM, not getrusage's ru_maxrss. Linux
    # carries the parent's high-water mark into a child started by vfork and exec, as
    # subprocess does, so in a full suite run the pytest process's 1.5-2.1 GB read as this
    # decode's peak (0.4 GB alone; 2.6 GB under a parent holding 2.5 GB). (tracemalloc, which
    # this test also read until 2026-12-07, made the 4-hour decode 30 s slower: 75 s against 45 s.)
    code = (
        "import json, re, sys\n"
        "from overnight.workers.audio import AudioChunker, AudioOptions\n"
        "chunker = AudioChunker(AudioOptions())\n"
        "data = open(sys.argv[1], 'rb').read()\n"
        "r = chunker(data)\n"
        "status = open('/proc/self/status').read()\n"
        "hwm_kb = int(re.search(r'VmHWM:\\s+(\\d+) kB', status).group(1))\n"
        "print(json.dumps({'error': r.error_code, 'duration_s': r.duration_s,\n"
        "    'chunks': len(r.chunks), 'peak_mb': hwm_kb / 1024}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        env={**__import__("os").environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return json.loads(done.stdout)


@pytest.mark.slow
def test_a_four_hour_recording_decodes_in_the_memory_of_a_twenty_minute_one(tmp_path):
    _flac_silence(tmp_path / "4h.flac", 4.0)  # 2.7 MB
    _flac_silence(tmp_path / "20min.flac", 1 / 3)
    assert (tmp_path / "4h.flac").stat().st_size < 4 * 2**20
    four_hours, twenty_minutes = (
        _decode_peak_mb(tmp_path / "4h.flac"),
        _decode_peak_mb(tmp_path / "20min.flac"),
    )
    assert (four_hours["error"], four_hours["duration_s"], four_hours["chunks"]) == (None, 14400, 0)
    # Measured: 399-406 MB resident for 4 h and 365-376 MB for 20 min (the whole-file decode
    # took 3.78 GB for the 4 hours). Memory is one decoded block and one VAD batch, whatever
    # the length: what the decode allocates does not grow with the hours.
    assert four_hours["peak_mb"] < twenty_minutes["peak_mb"] + 100, (four_hours, twenty_minutes)
    assert four_hours["peak_mb"] < 1024


def test_features_on_model_ships_each_chunks_samples_instead_of_its_features(utterance):
    """The decode stage for a model that computes its own features (the torch engine on a
    GPU): each chunk carries its speech samples, exactly the clips' length, marked by
    ``feature_size`` 0; the features the worker computes from them on the host
    (``features_of``) are the ones the decode stage would have shipped."""
    from faster_whisper.feature_extractor import FeatureExtractor

    from overnight.workers.audio import features_of

    audio = np.concatenate([utterance, silence(3.0), utterance, silence(0.5)])
    stereo = np.stack([audio, np.roll(audio, SAMPLE_RATE)])
    for data, split in [(wav(audio), False), (wav(stereo), True)]:
        options = AudioOptions(split_channels=split, chunk_length_s=5)
        shipped = AudioChunker(options)(data)
        samples = AudioChunker(replace(options, features_on_model=True))(data)
        assert samples.error_code is None and len(samples.chunks) == len(shipped.chunks) > 1
        extractor = FeatureExtractor(feature_size=80)
        records = samples.chunk_records()
        for chunk, record, expected in zip(samples.chunks, records, shipped.chunks, strict=True):
            assert chunk.features is None and chunk.speech is not None
            assert (chunk.channel, chunk.clips) == (expected.channel, expected.clips)
            length = sum(round(e * SAMPLE_RATE) - round(s * SAMPLE_RATE) for s, e in chunk.clips)
            assert chunk.speech.dtype == np.float32 and chunk.speech.shape == (length,)
            assert record["feature_size"] == 0 and len(record["features"]) == 4 * length
            assert np.array_equal(features_of(extractor, chunk.speech), expected.features)


# --- the VAD on telephone-band audio ------------------------------------------------------


def telephone_wav(audio: np.ndarray) -> bytes:
    """A phone line's copy: 300-3,400 Hz, 8 kHz samples, G.711 mu-law, as a 16-bit WAV."""
    import wave

    spectrum = np.fft.rfft(audio)
    freqs = np.fft.rfftfreq(audio.size, 1 / SAMPLE_RATE)
    spectrum[(freqs < 300) | (freqs > 3400)] = 0
    narrow = np.clip(np.fft.irfft(spectrum, audio.size)[::2] * 0.9, -1, 1)
    mu = 255.0
    coded = np.round((np.sign(narrow) * np.log1p(mu * np.abs(narrow)) / np.log1p(mu) + 1) * 127.5)
    level = coded / 127.5 - 1
    line = np.sign(level) * np.expm1(np.abs(level) * np.log1p(mu)) / mu
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes((line * 32767).astype(np.int16).tobytes())
    return buf.getvalue()


def covered(spans: list[tuple[float, float]], clips: list[tuple[float, float]]) -> float:
    """The share of ``spans``' seconds that ``clips`` cover."""
    grid = np.arange(0, max(e for _, e in spans), 0.01)

    def inside(ranges: list[tuple[float, float]]) -> np.ndarray:
        return np.any([(grid >= s) & (grid < e) for s, e in ranges], axis=0)

    return float(np.mean(inside(clips)[inside(spans)]))


def test_the_vad_finds_telephone_band_speech_between_digital_silences():
    """A real voice on a phone line, its phrases 0.5 s apart with digital silence between (a
    VoIP recording with silence suppression): Silero alone passed 38-57% of this speech; with
    the VAD's in-band noise floor the chunks hold nearly all of it."""
    from faster_whisper.audio import decode_audio

    from tests.conftest import SHARED_DATA

    source = SHARED_DATA / "audio" / "multilingual.mp3"
    if not source.is_file():
        pytest.skip("needs ../shared/data/audio/multilingual.mp3 (a real voice)")
    voice = decode_audio(str(source), sampling_rate=SAMPLE_RATE)[: 28 * SAMPLE_RATE]
    gap = np.zeros(SAMPLE_RATE // 2, np.float32)
    parts, spans, t = [gap], [], 0.5
    for start in range(0, len(voice), 2 * SAMPLE_RATE):
        piece = voice[start : start + 2 * SAMPLE_RATE]
        parts += [piece, gap]
        spans.append((t, t + len(piece) / SAMPLE_RATE))
        t += len(piece) / SAMPLE_RATE + 0.5
    decoded = AudioChunker(AudioOptions())(telephone_wav(np.concatenate(parts)))
    clips = [clip for chunk in decoded.chunks for clip in chunk.clips]
    assert covered(spans, clips) >= 0.9


def test_the_vads_noise_floor_never_reaches_the_samples_the_models_get():
    audio = np.concatenate([silence(0.5), tone(1.0), silence(0.5)])
    decoded = AudioChunker(AudioOptions(keep_speech=True))(wav(audio))
    samples, _ = decoded.voice
    expected = np.frombuffer(wav(audio)[44:], np.int16).astype(np.float32) / 32768
    np.testing.assert_allclose(samples, expected, atol=1e-4)
    assert not np.any(samples[: SAMPLE_RATE // 4])  # the digital silence stays silent


def test_a_chunks_features_are_the_same_bits_whatever_blas_threads_the_process_has():
    # A Ray decode task has one BLAS thread and the Whisper actor or an in-process run has
    # the machine's cores; OpenBLAS rounds the mel product differently per thread count,
    # which changed tiny.en's words on some calls of the redaction corpus.
    from faster_whisper.feature_extractor import FeatureExtractor
    from threadpoolctl import threadpool_limits

    speech = np.random.default_rng(5).standard_normal(30 * SAMPLE_RATE).astype(np.float32) * 0.1
    extractor = FeatureExtractor(feature_size=80)
    got = []
    for threads in (1, 2, 4):
        with threadpool_limits(limits=threads, user_api="blas"):
            got.append(features_of(extractor, speech))
    assert got[0].shape == (80, 3000)
    assert all(np.array_equal(got[0], other) for other in got[1:])
