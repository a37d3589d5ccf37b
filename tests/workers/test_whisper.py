"""The Whisper worker on the real tiny.en model: cross-recording batches, reassembly, timing."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pyarrow as pa
import pytest

from overnight.jobs.dataset.commits import Provenance, with_provenance
from overnight.jobs.ops.demo import espeak_available, noise, silence, speak
from overnight.schemas import TRANSCRIPTS
from overnight.schemas.stages import DECODED, WHISPER_OUTPUT
from overnight.workers.audio import AudioChunker, AudioOptions
from overnight.workers.whisper import (
    ContinuousBatcher,
    WhisperOptions,
    WhisperWorker,
    WhisperWorkerConfig,
    _ChunkRef,
    encode_in_parts,
    plan_batches,
    repeats_itself,
)
from overnight.workers.whisper_models import ModelLoadError
from tests.conftest import wer

pytestmark = pytest.mark.skipif(not espeak_available(), reason="espeak-ng not installed")

TEXTS = [
    "Please cancel my order from last week.",
    "The package arrived damaged and I want a refund.",
    "Can you call me back after five o'clock?",
    "My account number is on the letter you sent.",
    "I would like to upgrade my internet plan.",
]


def _wav_bytes(audio: np.ndarray) -> bytes:
    import io

    from overnight.jobs.ops.demo import write_wav

    buf = io.BytesIO()
    write_wav(buf, audio)
    return buf.getvalue()


def decoded_rows(audios: list[np.ndarray], options: AudioOptions | None = None) -> pa.Table:
    chunker = AudioChunker(options or AudioOptions())
    rows = []
    for i, audio in enumerate(audios):
        d = chunker(_wav_bytes(audio))
        rows.append(d.record(f"item{i}", f"mem://{i}.wav", size=1, etag="e"))
    return pa.Table.from_pylist(rows, schema=DECODED)


@pytest.fixture(scope="module")
def worker():
    return WhisperWorker(
        WhisperWorkerConfig(whisper=WhisperOptions(batch_size=4, beam_size=5, cpu_threads=2))
    )


def test_model_batches_are_filled_across_recordings_and_results_return_to_their_recording(
    worker, monkeypatch
):
    audios = [np.concatenate([silence(0.3), speak(t)]) for t in TEXTS]
    calls: list[int] = []
    forward = worker._forward
    monkeypatch.setattr(
        worker, "_forward", lambda part, lang: calls.append(len(part)) or forward(part, lang)
    )
    batch = decoded_rows(audios)
    out = worker(batch)
    # The worker returns its own columns; with the run's provenance they are a transcript row.
    assert out.schema.equals(WHISPER_OUTPUT) and out.num_rows == len(TEXTS)
    committed = with_provenance(batch, out, TRANSCRIPTS, Provenance(run_id="t"))
    assert committed.cast(TRANSCRIPTS).schema.equals(TRANSCRIPTS)
    assert committed["source_uri"].to_pylist() == batch["uri"].to_pylist()
    # 5 one-chunk recordings, batch size 4: two forward passes (3 + 2), not five.
    assert calls == [3, 2]
    got = [row["text"] for row in out.to_pylist()]
    for i, text in enumerate(got):
        # Each row holds its own recording's words: closest to its own reference, and close.
        assert min(range(len(TEXTS)), key=lambda j: wer(TEXTS[j], text)) == i, got
        assert wer(TEXTS[i], text) <= 0.3, (TEXTS[i], text)
    assert json.loads(out.to_pylist()[0]["options"])["batch_size"] == 4


def test_a_restarted_utterance_is_told_apart_from_ordinary_speech():
    assert repeats_itself(
        "Can you call me Mac after five o'clock? Can you call me Mac after five o'clock?"
    )
    assert repeats_itself("my card number is my card number is four")
    assert not repeats_itself("Please cancel my order from last week.")
    assert not repeats_itself("no no no, I said blue, blue, and then red")  # runs under 3 words
    assert not repeats_itself("")


def test_no_transcript_repeats_a_sentence_that_the_audio_says_once():
    # With 0.5 s and 1.0 s of leading silence, the 10 s encoder window made tiny.en say the
    # third sentence twice (its chunks now go again at the full 30 s window).
    worker = WhisperWorker(
        WhisperWorkerConfig(
            whisper=WhisperOptions(batch_size=4, beam_size=5, cpu_threads=2, window_step_s=10)
        )
    )
    for lead in (0.0, 0.5, 1.0):
        audios = [np.concatenate([silence(lead), speak(t)]) for t in TEXTS]
        got = [row["text"] for row in worker(decoded_rows(audios)).to_pylist()]
        assert not any(repeats_itself(text) for text in got), (lead, got)


def test_batch_time_is_apportioned_to_recordings_by_their_audio(worker):
    audios = [speak(TEXTS[0]), np.concatenate([speak(TEXTS[1]), speak(TEXTS[2])])]
    out = worker(decoded_rows(audios)).to_pylist()
    short, long_ = out
    assert short["asr_s"] > 0 and long_["asr_s"] > short["asr_s"]
    ratio = long_["asr_s"] / short["asr_s"]
    assert ratio == pytest.approx(long_["speech_s"] / short["speech_s"], rel=0.05)
    assert short["batch_fill"] == pytest.approx(0.5)


def test_error_rows_pass_through_and_noise_gives_empty_text(worker):
    table = decoded_rows([noise(3.0), speak(TEXTS[4])])
    rows = table.to_pylist()
    rows.insert(
        1,
        {
            **rows[1],
            "item_id": "bad",
            "status": "error",
            "error_code": "corrupt_audio",
            "error_message": "x",
            "chunks": [],
        },
    )
    out = worker(pa.Table.from_pylist(rows, schema=DECODED)).to_pylist()
    assert [r["item_id"] for r in out] == ["item0", "bad", "item1"]
    assert out[0]["status"] == "ok" and out[0]["text"] == ""
    assert (out[1]["status"], out[1]["error_code"], out[1]["text"]) == (
        "error",
        "corrupt_audio",
        None,
    )
    assert wer(TEXTS[4], out[2]["text"]) <= 0.3


def test_two_model_workers_give_the_same_rows():
    """(Each is priced at its share of the actor: ``tests/jobs/test_transcribe.py``.)"""
    audios = [np.concatenate([silence(0.3), speak(t)]) for t in TEXTS]
    table = decoded_rows(audios)
    rows = {}
    for workers in (1, 2):
        w = WhisperWorker(
            WhisperWorkerConfig(
                whisper=WhisperOptions(
                    batch_size=2, beam_size=5, cpu_threads=1, model_workers=workers, units=2.0
                )
            )
        )
        rows[workers] = w(table).to_pylist()
    assert [r["text"] for r in rows[2]] == [r["text"] for r in rows[1]]
    assert all(r["asr_s"] > 0 for r in rows[2])


def test_a_window_step_pads_short_chunks_to_its_multiple_and_long_ones_to_thirty_seconds():
    w = WhisperWorker.__new__(WhisperWorker)
    w.config = WhisperWorkerConfig(whisper=WhisperOptions(window_step_s=10))
    assert [w._window_frames(f) for f in (1, 999, 1000, 1001, 2500, 2999, 3000)] == [
        1000,
        1000,
        1000,
        2000,
        3000,
        3000,
        3000,
    ]
    w.config = WhisperWorkerConfig(whisper=WhisperOptions(window_step_s=0))
    assert w._window_frames(500) == 3000


def test_a_shorter_encoder_window_still_transcribes_and_batches_by_window(monkeypatch):
    w = WhisperWorker(
        WhisperWorkerConfig(
            whisper=WhisperOptions(batch_size=8, beam_size=5, cpu_threads=2, window_step_s=10)
        )
    )
    middle = [*TEXTS[1:5], TEXTS[1]]  # about 15 s of speech
    audios = [speak(TEXTS[0]), np.concatenate([speak(t) for t in middle]), speak(TEXTS[4])]
    shapes: list[int] = []
    pad = w._pad
    monkeypatch.setattr(
        w, "_pad", lambda feats, frames=None: shapes.append(frames) or pad(feats, frames)
    )
    out = w(decoded_rows(audios)).to_pylist()
    # The two short calls share a 10 s window; the 15 s one gets a 20 s window.
    assert sorted(shapes) == [1000, 2000]
    refs = [TEXTS[0], " ".join(middle), TEXTS[4]]
    for row, ref in zip(out, refs, strict=True):
        assert wer(ref, row["text"]) <= 0.15, (ref, row["text"])
    assert json.loads(out[0]["options"])["window_step_s"] == 10


def test_encoding_chunk_by_chunk_gives_the_whole_batch_encoding_and_the_same_rows(monkeypatch):
    audios = [np.concatenate([silence(0.3), speak(t)]) for t in TEXTS]
    table = decoded_rows(audios)
    workers = {
        n: WhisperWorker(
            WhisperWorkerConfig(
                whisper=WhisperOptions(batch_size=8, cpu_threads=2, encoder_batch_size=n)
            )
        )
        for n in (1, 8)
    }
    one, whole = workers[1], workers[8]
    chunks = [
        np.frombuffer(c["features"], dtype=np.float32).reshape(c["feature_size"], -1)[:, :1000]
        for r in table.to_pylist()
        for c in r["chunks"]
    ]
    feats = np.stack([np.pad(f, ((0, 0), (0, 1000 - f.shape[1]))) for f in chunks])
    # The real encoder, five passes of one chunk vs one pass of five: the same output.
    parts = np.asarray(encode_in_parts(whole.model.encode, feats, 1))
    at_once = np.asarray(whole.model.encode(feats))
    assert parts.shape == at_once.shape == (len(TEXTS), 500, 384)
    np.testing.assert_allclose(parts, at_once, atol=2e-2)
    passes: list[int] = []
    encode = type(one.model).__mro__[1].encode  # WhisperModel.encode, under the split
    monkeypatch.setattr(
        type(one.model).__mro__[1],
        "encode",
        lambda self, f: passes.append(len(f)) or encode(self, f),
    )
    rows_one = one(table).to_pylist()
    # One model batch of five chunks (one window), encoded one chunk per pass.
    assert passes == [1] * len(TEXTS)
    rows_whole = whole(table).to_pylist()
    assert passes[len(TEXTS) :] == [len(TEXTS)]
    assert [r["text"] for r in rows_one] == [r["text"] for r in rows_whole]
    assert json.loads(rows_one[0]["options"])["encoder_batch_size"] == 1


def chunk_refs(seconds: list[float], language: str = "en") -> list[_ChunkRef]:
    return [
        _ChunkRef(i, 0, [(0.0, s)], np.zeros((80, int(s * 100)), np.float32), language)
        for i, s in enumerate(seconds)
    ]


def window_of(step_s: int):
    return lambda c: min(3000, -(-c.frames // (step_s * 100)) * step_s * 100)


def test_planned_batches_hold_every_chunk_once_within_the_batch_size_and_sized_evenly():
    chunks = chunk_refs([float(1 + i % 29) for i in range(70)])
    batches = plan_batches(chunks, batch_size=16, workers=2, window=window_of(10))
    assert sorted(id(c) for _, b in batches for c in b) == sorted(id(c) for c in chunks)
    assert max(len(b) for _, b in batches) <= 16
    for _, batch in batches:  # batch-mates share one encoder window
        assert len({window_of(10)(c) for c in batch}) == 1
    # Within a window group the batches differ by at most one chunk: no lone stragglers.
    by_window: dict[int, list[int]] = {}
    for _, batch in batches:
        by_window.setdefault(window_of(10)(batch[0]), []).append(len(batch))
    assert all(max(sizes) - min(sizes) <= 1 for sizes in by_window.values())
    # The pool takes the costliest first, so a call's last batches are the short ones.
    costs = [window_of(10)(b[0]) * len(b) for _, b in batches]
    assert costs == sorted(costs, reverse=True)


def test_a_call_with_fewer_batches_than_model_workers_is_split_so_none_idles():
    chunks = chunk_refs([20.0] * 12)
    assert [len(b) for _, b in plan_batches(chunks, 32, workers=1, window=window_of(30))] == [12]
    assert [len(b) for _, b in plan_batches(chunks, 32, workers=2, window=window_of(30))] == [6, 6]
    assert len(plan_batches(chunk_refs([5.0]), 32, workers=4, window=window_of(30))) == 1
    assert plan_batches([], 32, workers=2, window=window_of(30)) == []


def test_batches_never_mix_languages():
    chunks = chunk_refs([10.0] * 5, "en") + chunk_refs([10.0] * 3, "de")
    batches = plan_batches(chunks, 4, workers=1, window=window_of(30))
    assert sorted((lang, len(b)) for lang, b in batches) == [("de", 3), ("en", 2), ("en", 3)]
    assert all({c.language for c in b} == {lang} for lang, b in batches)


class GatedForward:
    """A fake model for the batcher's orchestration: records each batch (as chunk rows),
    holds the first one until ``release`` is set, and answers each chunk with its row."""

    def __init__(self, fail_on: int | None = None):
        self.batches: list[list[int]] = []
        self.release = threading.Event()
        self.fail_on = fail_on

    def __call__(self, part, language, failed):
        self.batches.append([c.row for c in part])
        if len(self.batches) == 1:
            assert self.release.wait(10)
        if self.fail_on is not None and len(self.batches) == self.fail_on:
            raise RuntimeError("engine died")
        time.sleep(0.01)
        return [[{"row": c.row}] for c in part]


def run_calls(batcher, calls: list[list[_ChunkRef]]) -> tuple[list, list, list]:
    results: list = [None] * len(calls)
    errors: list = [None] * len(calls)

    def go(k):
        try:
            results[k] = batcher.run(calls[k])
        except Exception as exc:
            errors[k] = exc

    threads = [threading.Thread(target=go, args=(k,), daemon=True) for k in range(len(calls))]
    threads[0].start()
    time.sleep(0.2)  # the first call's batch is running (and held) before the others queue
    for t in threads[1:]:
        t.start()
    time.sleep(0.2)
    return results, errors, threads


def test_chunks_of_calls_in_flight_share_model_batches_and_each_result_returns_to_its_call():
    forward = GatedForward()
    batcher = ContinuousBatcher(forward, batch_size=8, workers=1, window=window_of(30))
    calls = [chunk_refs([10.0] * 2), chunk_refs([10.0] * 3), chunk_refs([10.0] * 3)]
    for k, call in enumerate(calls):
        for c in call:
            c.row = 10 * k + c.row
    results, errors, threads = run_calls(batcher, calls)
    forward.release.set()
    for t in threads:
        t.join(10)
    assert errors == [None, None, None]
    # The first call ran alone (nothing else had come); the next two shared one batch.
    assert forward.batches[0] == [0, 1]
    assert sorted(forward.batches[1]) == [10, 11, 12, 20, 21, 22]
    for k, done in enumerate(results):
        assert sorted(d.chunk.row for d in done) == [c.row for c in calls[k]]
        assert all(d.output == [{"row": d.chunk.row}] for d in done)
        assert all(d.seconds > 0 for d in done)
    # A batch's time is shared by its chunks across calls, by their audio.
    shared = [d.seconds for done in results[1:] for d in done]
    assert max(shared) - min(shared) < 1e-9


def test_a_chunk_passed_over_by_bigger_groups_is_served_within_the_patience():
    forward = GatedForward()
    batcher = ContinuousBatcher(forward, batch_size=2, workers=1, window=window_of(10))
    lone = chunk_refs([5.0])  # a 10 s window, alone in its group
    lone[0].row = 99
    big = chunk_refs([25.0] * 40)  # 30 s windows: always the bigger group
    _, errors, threads = run_calls(batcher, [chunk_refs([25.0]), lone, big])
    forward.release.set()
    for t in threads:
        t.join(10)
    assert errors == [None, None, None]
    served = next(k for k, b in enumerate(forward.batches) if 99 in b)
    assert 1 < served <= 1 + batcher.patience + 1


def test_a_dead_engine_fails_every_call_in_flight_and_refuses_new_ones():
    forward = GatedForward(fail_on=2)
    batcher = ContinuousBatcher(forward, batch_size=8, workers=2, window=window_of(30))
    _, errors, threads = run_calls(batcher, [chunk_refs([10.0]) for _ in range(3)])
    forward.release.set()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads)  # nobody waits forever
    assert any(isinstance(e, RuntimeError) and "engine died" in str(e) for e in errors)
    with pytest.raises(RuntimeError, match="engine failed earlier"):
        batcher.run(chunk_refs([10.0]))


def test_concurrent_calls_on_the_real_model_give_the_rows_of_separate_calls():
    w = WhisperWorker(
        WhisperWorkerConfig(whisper=WhisperOptions(batch_size=8, cpu_threads=1, model_workers=2))
    )
    tables = [
        decoded_rows([np.concatenate([silence(0.3), speak(t)]) for t in TEXTS[:3]]),
        decoded_rows([np.concatenate([silence(0.5), speak(t)]) for t in TEXTS[2:]]),
    ]
    alone = [w(t).to_pylist() for t in tables]
    together: list = [None, None]

    def go(k):
        together[k] = w(tables[k]).to_pylist()

    threads = [threading.Thread(target=go, args=(k,), daemon=True) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for k in (0, 1):
        assert [r["item_id"] for r in together[k]] == [r["item_id"] for r in alone[k]]
        assert [r["text"] for r in together[k]] == [r["text"] for r in alone[k]]
        assert all(r["status"] == "ok" and r["asr_s"] > 0 for r in together[k])


def test_an_engine_that_loads_but_cannot_compute_fails_at_load_not_batch_by_batch(monkeypatch):
    import faster_whisper

    def broken(self, features):
        raise RuntimeError("Library libcublas.so.12 is not found or cannot be loaded")

    monkeypatch.setattr(faster_whisper.WhisperModel, "encode", broken)
    with pytest.raises(ModelLoadError, match=r"libcublas\.so\.12"):
        WhisperWorker(WhisperWorkerConfig(whisper=WhisperOptions(cpu_threads=1)))


def test_without_word_timestamps_segments_have_no_words_and_a_mono_call_no_analytics(worker):
    (row,) = worker(decoded_rows([speak(TEXTS[0])])).to_pylist()
    assert row["segments"] and all(s["words"] is None for s in row["segments"])
    assert row["analytics"] is None
    assert json.loads(row["options"])["word_timestamps"] is False


def test_language_detection_encodes_each_first_chunk_once_and_its_batch_decodes_from_it(
    monkeypatch,
):
    # Only the English-only tiny.en is reachable here, whose CTranslate2 model has no
    # language head: the head alone is stood in for (answering "en"); the encoder, the
    # kept outputs and the decoding are the real model's.
    w = WhisperWorker(WhisperWorkerConfig(whisper=WhisperOptions(batch_size=8, cpu_threads=2)))
    audios = [np.concatenate([silence(0.3), speak(t)]) for t in TEXTS[:3]]
    # The third recording is two chunks: only its first is encoded for detection.
    audios[2] = np.concatenate([audios[2], silence(2.5), speak(TEXTS[3])])
    table = decoded_rows(audios, AudioOptions(chunk_length_s=5))
    assert [len(r["chunks"]) for r in table.to_pylist()] == [1, 1, 2]
    encoded_rows: list[int] = []
    encode = type(w.model).__mro__[1].encode  # WhisperModel.encode, under the split
    monkeypatch.setattr(
        type(w.model).__mro__[1],
        "encode",
        lambda self, f: encoded_rows.append(len(f)) or encode(self, f),
    )
    hinted = w(table).to_pylist()  # language given: each chunk encoded in its batch
    assert sum(encoded_rows) == 4
    encoded_rows.clear()
    heads: list[tuple] = []
    monkeypatch.setattr(
        w,
        "language_scores",
        lambda enc: heads.append(tuple(enc.shape)) or [[("<|en|>", 0.9)]] * enc.shape[0],
    )
    w.multilingual = True
    detected = w(table).to_pylist()

    # Detection encoded the three first chunks once; the model batch encoded only the
    # second chunk of the third recording, the one detection had not seen: 4 chunk
    # encodings, not 3 + 4.
    assert heads == [(3, 1500, 384)]
    assert sum(encoded_rows) == 4
    assert [r["language"] for r in detected] == ["en"] * 3
    assert [r["language_probability"] for r in detected] == pytest.approx([0.9] * 3)
    # Decoded from the kept encoder outputs: the same transcripts as encoding in the batch.
    for a, b in zip(hinted, detected, strict=True):
        assert wer(a["text"], b["text"]) <= 0.05, (a["text"], b["text"])
