"""What counts as a degenerate decode, and how one is cut (workers.whisper_guard). The real
model's fallback on a looping call is tests/jobs/test_transcribe.py; that its samples are
reproducible is the last test here."""

from __future__ import annotations

import pytest

from overnight.workers.whisper_guard import check, cut_repetition, looks_degenerate

# What tiny.en wrote on number-heavy calls (issue #34), each a loop.
AMOUNT_LOOP = "My social security number is $200,000, " + "$10,000, " * 40
LOOPS = [
    (AMOUNT_LOOP, "My social security number is $200,000, $10,000"),
    ("It is 1-3-3-3-3-3-3-3-3-3-3-3-3-3-3-3-3-3-3-3-3-3-3-3-3.", "It is 1-3."),
    ("It is time for one free, " + "free, " * 30 + "free.", "It is time for one free."),
    (
        "My social security number is 200," + "000," * 30 + "000",
        "My social security number is 200,000",
    ),
    (
        "I am 99,000, 99,000, 99,000, 99,000, 99,000, 99,000, 42,000, 3D, spring field.",
        "I am 99,000 42,000, 3D, spring field.",
    ),
]


@pytest.mark.parametrize(("looped", "cut"), LOOPS)
def test_a_loop_is_degenerate_and_is_cut_to_one_saying_of_its_unit(looped, cut):
    assert looks_degenerate(looped, speech_s=8.0)
    assert cut_repetition(looped) == cut
    assert not looks_degenerate(cut, speech_s=8.0)


@pytest.mark.parametrize(
    "said",
    [
        "My social security number is two hundred ninety zero nine thousand nine hundred "
        "ninety nine and I live at forty two elm street",
        "It is 5413 3333 3333 3333.",
        "three three three three, three three three three",
        "no no no no, I said blue, blue, and then red",
        "Can you call me back? Can you call me back?",
        "The card number is 4-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1.",
        "It is time for 1-3-3-3-3-3-3-3-3-3-3-3-3-3-3-3.",  # 15 of one digit: a card's worth
    ],
)
def test_what_speech_says_is_not_degenerate(said):
    assert check(said, None, speech_s=6.0) is None
    assert cut_repetition(said) == said


def test_more_tokens_than_the_speech_can_hold_is_degenerate():
    words = "one two three four five six seven eight nine ten"
    assert check(words, 20, speech_s=3.0) is None
    assert check(words, 80, speech_s=3.0) == "too_many_tokens"
    assert check("", 0, speech_s=0.0) is None


def test_a_segment_that_looped_on_every_attempt_keeps_the_words_of_its_cut_text_and_is_marked():
    from overnight.workers.whisper import _cut

    said = ["It", "is", "$200,000,"] + ["$10,000,"] * 12
    words = [{"word": " " + w, "start": k * 0.3, "end": k * 0.3 + 0.25} for k, w in enumerate(said)]
    seg = {"text": " " + " ".join(said), "start": 0.0, "end": 6.0, "words": words}
    cut = _cut(seg)
    assert cut["text"] == " It is $200,000, $10,000" and cut["degenerate"] is True
    assert [w["word"].strip() for w in cut["words"]] == ["It", "is", "$200,000,", "$10,000,"]
    assert seg["text"].startswith(" It is $200,000, $10,000, $10,000")  # the decode's own


def test_a_looping_chunk_sampled_again_is_worded_the_same_by_a_rerun_with_the_same_seed(
    monkeypatch,
):
    """The fallback samples (``SamplingModel``). Unseeded, CTranslate2 drew from
    ``std::random_device``, and both calls here came out worded differently on each of 3
    runs in one process; with ``seed`` every model starts its draws from it. (Two calls:
    CTranslate2's kernels differ by CPU, and one loop may not recur on another machine.)"""
    from overnight.jobs.ops.demo import espeak_available
    from overnight.workers import whisper
    from tests.conftest import load_script

    if not espeak_available():
        pytest.skip("espeak-ng not installed")
    sampled = []

    class Counted(whisper.SamplingModel):
        def __init__(self, *args, **kwargs):
            sampled.append(args[1])  # the temperature
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(whisper, "SamplingModel", Counted)
    corpus = load_script("redaction_corpus")
    # Seed 17's calls that tiny.en loops on: an SSN read out ("6-5-3-3-2-2-2-..."), and a
    # clean call's amounts.
    calls = [c for c in corpus.build_corpus() if c.name in ("pii_033", "clean_031")]
    texts = []
    for _ in range(2):  # a new worker each time: its own model, as a rerun's actor has
        rows = corpus.transcribe(calls)
        texts.append({name: row["text"] for name, row in rows.items()})
    assert sampled, "neither call loops any more: choose others for this test"
    assert texts[0] == texts[1]
