"""jobs.ops.wer: the one word error rate of the tests, the benchmarks and ``overnight tune``."""

from __future__ import annotations

import random

import pytest

from overnight.jobs.ops.wer import corpus_wer, normalize, wer, word_errors


def _levenshtein(ref: list[str], hyp: list[str]) -> int:
    """The hand-written word edit distance jobs.ops.wer replaced, kept here as the reference."""
    d = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, d[0] = d[0], i
        for j, h in enumerate(hyp, 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (r != h))
    return d[len(hyp)]


def test_edit_counts_agree_with_a_plain_levenshtein_distance_on_words():
    rng = random.Random(7)
    vocab = ["call", "bill", "refund", "card", "account", "week", "service", "order"]
    for _ in range(25):
        ref = [rng.choice(vocab) for _ in range(rng.randint(1, 40))]
        hyp = [w for w in ref if rng.random() > 0.2]
        hyp = [w if rng.random() > 0.15 else rng.choice(vocab) for w in hyp]
        hyp[rng.randint(0, len(hyp)) : 0] = [rng.choice(vocab)] * rng.randint(0, 3)
        assert word_errors([" ".join(ref)], [" ".join(hyp)]) == (_levenshtein(ref, hyp), len(ref))


def test_spelling_case_punctuation_and_numbers_written_either_way_are_not_errors():
    assert wer("I would like to pay fifty dollars.", "i would like to pay $50") == 0.0
    assert wer("He was DISHONOURED, for ever.", "he was dishonored for ever") == 0.0
    assert wer("It's the colour of Mr. Smith's car", "it is the color of mister smith's car") == 0.0
    assert normalize("Hello, World!") == "hello world"


def test_one_wrong_word_in_four_is_a_quarter_and_an_empty_reference_is_all_or_nothing():
    assert wer("please cancel my order", "please cancel the order") == pytest.approx(0.25)
    assert wer("", "") == 0.0
    assert wer("", "stray words") == 1.0
    assert wer("two words", "") == 1.0


def test_corpus_rate_weighs_items_by_their_words_and_counts_a_missing_transcript_as_deleted():
    refs = {"a": "Hello, World!", "b": "the cat sat down"}
    assert corpus_wer(refs, {"a": "hello world", "b": "the cat sat down"}) == (0.0, 2)
    assert corpus_wer(refs, {"a": "hello world"}) == (4 / 6, 2)
    assert corpus_wer({}, {"a": "words"}) == (None, 0)
