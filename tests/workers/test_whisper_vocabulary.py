"""Vocabulary and language per job and per item, on the real tiny.en model: initial prompts
and hotwords reach the batched decode, batch-mates share one prompt, and a non-English item
on an English-only model is marked instead of passed off as English."""

from __future__ import annotations

import json
import threading

import numpy as np
import pyarrow as pa
import pytest

from overnight.jobs.ops.demo import espeak_available, silence, speak
from overnight.workers.whisper import (
    ContinuousBatcher,
    WhisperOptions,
    WhisperWorker,
    WhisperWorkerConfig,
    _ChunkRef,
    plan_batches,
)
from tests.workers.test_whisper import decoded_rows, window_of

pytestmark = pytest.mark.skipif(not espeak_available(), reason="espeak-ng not installed")

# Names tiny.en misspells without help and spells right with it. Measured (beam 5, espeak-ng
# en-us at 150 wpm): without a prompt "quite cow-ski plumbing", "maximum subscription",
# "and for real will never enter"; with the term as initial prompt, and again as hotwords, all
# three right in plain faster-whisper. This worker's batched decode is tested below with one
# of the two per name.
CASES = {
    "kwiatkowski": ("The technician from Kwiatkowski Plumbing never arrived.", "Kwiatkowski"),
    "vexorium": ("I want to cancel my Vexorium subscription today.", "Vexorium"),
    "xanthoria": (
        "My order number mentions Xanthoria Quillfeather at the warehouse.",
        "Xanthoria Quillfeather",
    ),
}


def _audio(text: str) -> np.ndarray:
    return np.concatenate([silence(0.3), speak(text), silence(0.3)])


def rows_with(table: pa.Table, **columns: list) -> pa.Table:
    """``table`` with manifest columns (initial_prompt, hotwords, language) set per row."""
    for name, values in columns.items():
        index = table.schema.get_field_index(name)
        table = table.set_column(index, table.schema.field(index), pa.array(values, pa.string()))
    return table


def chunk(row: int, prompt=(None, None), seconds: float = 10.0) -> _ChunkRef:
    features = np.zeros((80, int(seconds * 100)), np.float32)
    return _ChunkRef(row, 0, [(0.0, seconds)], features, "en", prompt)


def test_batches_never_mix_prompts_and_chunks_with_the_same_prompt_share_one():
    a, b = ("Kwiatkowski Plumbing", None), (None, "Vexorium")
    chunks = [chunk(i, a) for i in range(3)] + [chunk(3 + i, b) for i in range(2)]
    chunks += [chunk(5 + i) for i in range(2)]
    batches = plan_batches(chunks, batch_size=8, workers=1, window=window_of(30))
    assert sorted(sorted(c.row for c in part) for _, part in batches) == [[0, 1, 2], [3, 4], [5, 6]]
    assert all(len({c.prompt for c in part}) == 1 for _, part in batches)


def test_the_continuous_batcher_serves_each_prompt_group_in_batches_of_its_own():
    seen: list[tuple[set, list[int]]] = []
    lock = threading.Lock()

    def forward(part, language, failed):
        with lock:
            seen.append(({c.prompt for c in part}, sorted(c.row for c in part)))
        return [[] for _ in part]

    batcher = ContinuousBatcher(forward, batch_size=8, workers=1, window=window_of(30))
    calls = [
        [chunk(0, ("alpha", None)), chunk(1)],
        [chunk(2, ("alpha", None)), chunk(3, (None, "beta"))],
    ]
    threads = [threading.Thread(target=batcher.run, args=(c,), daemon=True) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert all(len(prompts) == 1 for prompts, _ in seen)
    assert sorted(r for _, rows in seen for r in rows) == [0, 1, 2, 3]
    # The two "alpha" chunks of different calls rode one batch when they were pending
    # together; in any case no batch held two prompts.
    assert len(seen) <= 4


@pytest.fixture(scope="module")
def audios() -> dict[str, np.ndarray]:
    return {name: _audio(text) for name, (text, _) in CASES.items()}


def test_an_initial_prompt_or_hotwords_per_item_spell_the_names_each_item_was_given(
    audios, monkeypatch
):
    """One call, three recordings, three prompts (one the job's): each recording is decoded
    with its own prompt, in a batch of its own, and its row records the prompt it got."""
    w = WhisperWorker(
        WhisperWorkerConfig(
            whisper=WhisperOptions(batch_size=8, cpu_threads=2, hotwords="Xanthoria Quillfeather")
        )
    )
    plain = WhisperWorker(WhisperWorkerConfig(whisper=WhisperOptions(batch_size=8, cpu_threads=2)))
    names = list(CASES)
    table = decoded_rows([audios[n] for n in names])
    without = {n: r["text"] for n, r in zip(names, plain(table).to_pylist(), strict=True)}
    for name, (_, term) in CASES.items():
        assert term.lower() not in without[name].lower(), without  # the case needs the prompt

    batches: list[int] = []
    forward = w._forward
    monkeypatch.setattr(
        w, "_forward", lambda part, lang: batches.append(len(part)) or forward(part, lang)
    )
    table = rows_with(
        table,
        initial_prompt=["Kwiatkowski Plumbing", None, None],
        hotwords=[None, "Vexorium", None],  # the third keeps the job's hotwords
    )
    out = {n: r for n, r in zip(names, w(table).to_pylist(), strict=True)}
    for name, (_, term) in CASES.items():
        assert term.lower() in out[name]["text"].lower(), (name, out[name]["text"])
    assert batches == [1, 1, 1]  # three prompts: three batches, never one prompt for all
    recorded = {n: json.loads(r["options"]) for n, r in out.items()}
    assert (recorded["kwiatkowski"]["initial_prompt"], recorded["kwiatkowski"]["hotwords"]) == (
        "Kwiatkowski Plumbing",
        "Xanthoria Quillfeather",
    )
    assert (recorded["vexorium"]["initial_prompt"], recorded["vexorium"]["hotwords"]) == (
        None,
        "Vexorium",
    )
    assert recorded["xanthoria"]["hotwords"] == "Xanthoria Quillfeather"
    assert all(r["task"] == "transcribe" for r in recorded.values())


def test_an_english_only_model_marks_a_german_item_instead_of_passing_it_off_as_english(audios):
    w = WhisperWorker(WhisperWorkerConfig(whisper=WhisperOptions(batch_size=8, cpu_threads=2)))
    table = rows_with(
        decoded_rows([audios["vexorium"], audios["kwiatkowski"], audios["xanthoria"]]),
        language=["de", None, "en-US"],
    )
    out = w(table).to_pylist()
    assert [r["language_mismatch"] for r in out] == [True, False, False]
    # Decoded as English (the only language the model has), and the row says what it was.
    assert all(r["status"] == "ok" and r["language"] == "en" for r in out)


def test_translate_is_refused_for_an_english_only_model():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="multilingual"):
        WhisperOptions(task="translate")
    assert WhisperOptions(task="translate", model="small").task == "translate"
