"""Redaction on the synthesized corpus (scripts/redaction_corpus.py): 40 calls carrying PII
and 40 clean ones, spoken by espeak-ng voices at several rates, some over an 8 kHz telephone
band or with noise, numbers read in every way callers read them, transcribed by the real
tiny.en with word timestamps in one cross-call batched run, redacted with every type on.

Issue #34's targets: no 4 digits in a row of a card, SSN or account number left anywhere in
the row on at least 99% of them (here: all), at most 5% of the clean calls touched; the
other types keep a floor against regressions (a seed holds 4 of most, and tiny.en loses or
garbles some cue words on telephone-band calls).

Seed 17 is the seed the rules were written against, so the targets are asserted on its
transcripts as recorded (``corpus_seed17_tiny_en.json.gz``, written by
``scripts/eval_redaction.py --cache``): tiny.en words the same audio differently on another
CPU (CTranslate2's and OpenBLAS's kernels), and one call's words decide a card. On this
seed, transcripts made with other features (two BLAS threads, before ``features_of`` fixed
one) left one card of 12 and flagged 3 clean calls of 40. So the live transcription asserts
the whole chain within one such change: at most one card, SSN or account number left, at
most 3 clean calls flagged. ``scripts/eval_redaction.py`` prints the same table, and the
README the figures on seeds no rule was written against."""

from __future__ import annotations

from pathlib import Path

import pytest

from overnight.jobs.ops.demo import espeak_available
from tests.conftest import load_script

RECALL = {"card_number": 0.99, "ssn": 0.99, "bank_account": 0.99}
OTHER_RECALL = 0.5
CLEAN_SHARE = 0.05
# The seed-17 transcripts of 2026-12-07 (AMD EPYC, AVX2; one BLAS thread for the features).
RECORDED = Path(__file__).with_name("corpus_seed17_tiny_en.json.gz")


def report(scores) -> str:
    return scores.table() + "\n" + "\n".join(scores.misses + scores.false_alarms)


@pytest.fixture(scope="session")
def corpus():
    if not espeak_available():
        pytest.skip("espeak-ng not installed")
    module = load_script("redaction_corpus")
    calls = module.build_corpus()
    return module, calls, module.transcribe(calls)


def test_corpus_has_forty_pii_calls_of_every_type_and_forty_clean_ones():
    module = load_script("redaction_corpus")
    calls = module.build_corpus()
    pii = [c for c in calls if not c.clean]
    assert len(pii) >= 40 and len(calls) - len(pii) >= 40
    kinds = {t.type for c in pii for t in c.truths}
    from overnight.workers.redact import TYPES

    assert kinds == set(TYPES)
    cards = [t.value for c in pii for t in c.truths if t.type == "card_number"]
    assert any(module.luhn_ok(v) for v in cards) and any(not module.luhn_ok(v) for v in cards)


def test_the_rules_meet_the_targets_on_the_recorded_transcripts_they_were_written_against():
    module = load_script("redaction_corpus")
    calls = module.build_corpus()
    rows = module.load_rows(RECORDED)
    assert set(rows) == {c.name for c in calls}
    scores = module.evaluate(calls, rows)
    for kind, total in scores.truths.items():
        assert total, kind
        assert scores.recall(kind) >= RECALL.get(kind, OTHER_RECALL), report(scores)
    assert scores.clean_share <= CLEAN_SHARE, report(scores)


@pytest.mark.slow
def test_live_transcripts_leave_at_most_one_number_and_flag_at_most_three_clean_calls(corpus):
    module, calls, rows = corpus
    scores = module.evaluate(calls, rows)
    numbers = [k for k in RECALL if scores.truths.get(k)]
    assert len(numbers) == len(RECALL), report(scores)
    left = sum(scores.truths[k] - scores.found.get(k, 0) for k in numbers)
    assert left <= 1, report(scores)
    for kind in scores.truths.keys() - RECALL.keys():
        assert scores.recall(kind) >= OTHER_RECALL, report(scores)
    assert scores.clean_redacted <= 3, report(scores)
