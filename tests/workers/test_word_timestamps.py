"""Word timestamps through the cross-recording batched path agree with plain faster-whisper.

The worker aligns words per model batch, with recordings of different lengths and leading
silences side by side, on VAD-trimmed chunks; plain ``WhisperModel.transcribe(...,
word_timestamps=True)`` aligns one whole file at a time. Both on the real tiny.en model.
"""

from __future__ import annotations

import difflib
import io
import re
import statistics
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from overnight.jobs.ops.demo import espeak_available, silence, speak, write_wav
from overnight.schemas.stages import DECODED
from overnight.workers.audio import AudioChunker, AudioOptions
from overnight.workers.whisper import WhisperOptions, WhisperWorker, WhisperWorkerConfig
from overnight.workers.whisper_models import bundled_model_path

# What the issue asks of the batched words: within 100 ms of plain faster-whisper, median.
MEDIAN_LIMIT_S = 0.1

TEXTS = [
    "Please cancel my order from last week.",
    "The package arrived damaged and I want a refund.",
    "Can you call me back after five o'clock?",
    "My account number is on the letter you sent.",
    "I would like to upgrade my internet plan.",
]


def _decoded(sources: list[bytes]) -> pa.Table:
    chunker = AudioChunker(AudioOptions())
    rows = []
    for i, data in enumerate(sources):
        d = chunker(data)
        rows.append(d.record(f"item{i}", f"mem://{i}"))
    return pa.Table.from_pylist(rows, schema=DECODED)


def _wav(audio: np.ndarray) -> bytes:
    buf = io.BytesIO()
    write_wav(buf, audio)
    return buf.getvalue()


def _key(word: str) -> str:
    return re.sub(r"[^\w']", "", word.lower())


def boundary_errors(plain: list[tuple[str, float, float]], batched: list[dict]) -> list[float]:
    """|start - start'| and |end - end'| of the words both say, matched by normalized text in
    order (a word only one of them heard has no counterpart and is left out)."""
    a = [_key(w) for w, _, _ in plain]
    b = [_key(w["word"]) for w in batched]
    errors = []
    for block in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_matching_blocks():
        for k in range(block.size):
            _, start, end = plain[block.a + k]
            got = batched[block.b + k]
            errors += [abs(start - got["start"]), abs(end - got["end"])]
    return errors


@pytest.fixture(scope="module")
def word_worker():
    return WhisperWorker(
        WhisperWorkerConfig(
            whisper=WhisperOptions(batch_size=8, beam_size=5, cpu_threads=2, word_timestamps=True)
        )
    )


@pytest.fixture(scope="module")
def plain_model():
    from faster_whisper import WhisperModel

    return WhisperModel(bundled_model_path(), device="cpu", compute_type="int8", cpu_threads=2)


def plain_words(model, audio) -> list[tuple[str, float, float]]:
    segments, _ = model.transcribe(audio, beam_size=5, word_timestamps=True)
    return [(w.word, w.start, w.end) for s in segments for w in s.words or []]


def agree(worker, model, sources: list[bytes], plain_inputs: list) -> list[float]:
    out = worker(_decoded(sources)).to_pylist()
    errors: list[float] = []
    said = 0
    for row, plain_input in zip(out, plain_inputs, strict=True):
        assert row["status"] == "ok"
        words = [w for s in row["segments"] for w in s["words"]]
        reference = plain_words(model, plain_input)
        said += len(reference)
        errors += boundary_errors(reference, words)
        for w in words:
            assert w["start"] <= w["end"] and 0 <= w["probability"] <= 1 and w["word"].strip()
        for s in row["segments"]:
            assert all(s["start"] - 0.01 <= w["start"] <= s["end"] + 0.01 for w in s["words"])
    # Most words plain faster-whisper heard have a batched counterpart, so the median below
    # is over the words, not a lucky few. (Plain decoding of a whole file with 1.8 s of
    # leading silence heard "I can't where he's ..." for "My account number is ...".)
    assert len(errors) / 2 >= 0.75 * said
    return errors


def test_words_on_the_shared_recordings_agree_with_plain_faster_whisper(
    shared_audio: Path, word_worker, plain_model
):
    files = sorted(shared_audio.glob("*.wav"))
    files = [f for f in files if f.name[0].isdigit()] + [shared_audio / "jfk.flac"]
    assert len(files) == 4
    errors = agree(
        word_worker, plain_model, [f.read_bytes() for f in files], [str(f) for f in files]
    )
    median, p90 = statistics.median(errors), float(np.percentile(errors, 90))
    print(f"shared recordings: {len(errors)} boundaries, median {median:.3f} s, p90 {p90:.3f} s")
    assert median <= MEDIAN_LIMIT_S


@pytest.mark.skipif(not espeak_available(), reason="espeak-ng not installed")
def test_words_of_batched_synthesized_calls_are_in_recording_time_and_agree(
    word_worker, plain_model
):
    # Leading silences of 0 to 2.4 s: the VAD trims them, so the words' times only come out
    # right if they are mapped back from the chunk to the recording.
    audios = [
        np.concatenate([silence(0.6 * i), speak(t), silence(0.5)]) for i, t in enumerate(TEXTS)
    ]
    errors = agree(word_worker, plain_model, [_wav(a) for a in audios], audios)
    median, p90 = statistics.median(errors), float(np.percentile(errors, 90))
    print(f"synthesized calls: {len(errors)} boundaries, median {median:.3f} s, p90 {p90:.3f} s")
    assert median <= MEDIAN_LIMIT_S


def test_a_segment_edge_in_silence_moves_to_the_speech_and_inner_words_stay():
    from overnight.workers.whisper import trim_to_speech, voiced_frames

    # 1 s of quiet, 2 s loud, 1 s quiet (log-mel levels, 100 frames a second).
    level = np.r_[np.full(100, -1.0), np.full(200, 0.5), np.full(100, -1.0)]
    voiced = voiced_frames(np.tile(level, (80, 1)))
    words = [
        {"word": "hello", "start": 0.6, "end": 1.5},  # absorbed 0.4 s of the silence
        {"word": "there", "start": 1.5, "end": 2.2},
        {"word": "friend", "start": 2.2, "end": 3.5},  # ran 0.5 s into the silence
    ]
    trim_to_speech(words, voiced)
    assert [(w["start"], w["end"]) for w in words] == [(1.0, 1.5), (1.5, 2.2), (2.2, 3.0)]
    # A chunk all one level gives no mask, and nothing moves.
    assert voiced_frames(np.zeros((80, 300))) is None
