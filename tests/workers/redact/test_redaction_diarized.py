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


SSN_CALL = (
    ("en-us+m3", "Thank you for calling the billing department, how can I help you today?"),
    ("en-us+f4", "Hi, I want to pay my bill with my credit card please."),
    ("en-us+m3", "Sure, please read me the card number."),
    (
        "en-us+f4",
        "It is four five three two, one one one one, two two two two, three three three six.",
    ),
    ("en-us+m3", "Thank you. And for verification, your social security number?"),
    ("en-us+f4", "My social security number is one two three, four five, six seven eight nine."),
    ("en-us+m3", "Great, the payment is done. Have a nice day."),
)


def test_an_ssn_read_at_the_end_of_a_diarized_turn_leaves_no_digit_in_any_speakers_segment(
    tmp_path,
):
    # The job end to end (about 30 s): tiny.en timed the SSN's last digit, "9.", into the
    # agent's reply, which diarization then gave the agent; every digit must still be masked.
    import re

    import numpy as np

    from overnight.jobs.cli import main
    from overnight.jobs.ops.demo import SAMPLE_RATE, speak, write_wav
    from tests.jobs.test_transcribe import rows

    gap = np.zeros(int(0.6 * SAMPLE_RATE), np.float32)
    parts = []
    for voice, text in SSN_CALL:
        parts += [speak(text, voice=voice) * 0.8, gap]
    calls = tmp_path / "calls"
    calls.mkdir()
    write_wav(calls / "m2.wav", np.concatenate(parts))
    out = tmp_path / "out"
    args = ["transcribe", str(calls), str(out), "--diarize", "--speakers", "2"]
    args += ["--speaker-roles", "agent,customer", "--redact", "pci,ssn"]
    assert main(args) == 0
    (row,) = rows(out)
    assert row["status"] == "ok", row["error_message"]
    for seg in row["segments"]:
        said = " ".join([seg["text"], *(w["word"] for w in seg["words"])])
        assert not re.search(r"\d", said), (seg["speaker"], said)
    assert not re.search(r"\d", row["text"]), row["text"]
    assert [e["type"] for e in row["entities"]] == ["card_number", "ssn"]
