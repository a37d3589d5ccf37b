"""Redaction on a mono call that the job diarized: the corpus's card calls with both sides
mixed to one channel, the job's decode-stage diarization (``jobs.transcribe._diarize``), the
real tiny.en worker giving words their speakers, then the redactor, which sees speakers only
as diarization found them. No digits of the card may be left. The whole corpus's figures in
the three modes (split, mono, diarized) are ``scripts/eval_redaction.py --channels``'s."""

from __future__ import annotations

import pytest

from overnight.jobs.ops.demo import espeak_available
from tests.conftest import load_script

pytestmark = pytest.mark.skipif(not espeak_available(), reason="espeak-ng not installed")


def test_a_card_read_on_a_diarized_mono_call_leaves_no_digits_and_the_dialogue_keeps_speakers():
    module = load_script("redaction_corpus")
    cards = [
        c
        for c in module.build_corpus()
        if not c.clean and any(t.type == "card_number" for t in c.truths)
    ][:2]
    rows = module.transcribe(cards, channels="diarized")
    for call in cards:
        row = rows[call.name]
        assert row["status"] == "ok", row["error_message"]
        # Diarized: every segment carries a speaker and the text is dialogue.
        assert row["segments"] and all(s["speaker"] for s in row["segments"])
        assert row["text"].startswith("SPEAKER_00: ")
    scores = module.evaluate(cards, rows)
    report = scores.table() + "\n" + "\n".join(scores.misses + scores.false_alarms)
    assert scores.truths["card_number"] >= 2
    assert scores.recall("card_number") == 1.0, report
