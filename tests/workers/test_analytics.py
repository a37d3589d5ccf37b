"""Specifications for workers.analytics: call measures from word timings, by construction."""

from __future__ import annotations

import pyarrow as pa
import pytest

from overnight.schemas.tables import CALL_ANALYTICS
from overnight.workers.analytics import call_analytics


def _words(start: float, end: float, word_s: float = 0.3, gap_s: float = 0.1) -> list[dict]:
    """Words of ``word_s`` with ``gap_s`` pauses, exactly filling [start, end]."""
    words, t = [], start
    while t + word_s <= end + 1e-9:
        words.append({"word": "w", "start": round(t, 3), "end": round(t + word_s, 3)})
        t += word_s + gap_s
    words[-1]["end"] = end
    return words


def _segment(speaker: str, start: float, end: float) -> dict:
    return {"speaker": speaker, "start": start, "end": end, "words": _words(start, end)}


# agent 0-5 s, customer cuts in at 4.5 s (0.5 s overlap) and talks to 8 s; 2 s of silence;
# agent 10-12 s, customer 11.9-13 s (0.1 s overlap: overtalk, but too short to interrupt);
# the call lasts 15 s.
CALL = [
    _segment("agent", 0.0, 5.0),
    _segment("customer", 4.5, 8.0),
    _segment("agent", 10.0, 12.0),
    _segment("customer", 11.9, 13.0),
]


def test_talk_silence_and_overtalk_match_the_construction():
    a = call_analytics(CALL, 15.0)
    by = {s["speaker"]: s for s in a["speakers"]}
    assert by["agent"]["talk_s"] == pytest.approx(7.0, abs=0.01)
    assert by["customer"]["talk_s"] == pytest.approx(4.6, abs=0.01)
    assert a["overtalk_s"] == pytest.approx(0.6, abs=0.01)
    assert a["non_talk_s"] == pytest.approx(4.0, abs=0.01)  # 8-10 and 13-15
    assert a["longest_silence_s"] == pytest.approx(2.0, abs=0.01)
    assert by["agent"]["talk_ratio"] == pytest.approx(7.0 / 15.0, abs=1e-3)


def test_an_interruption_needs_a_real_overlap_and_is_counted_by_whom_of_whom():
    a = call_analytics(CALL, 15.0)
    assert a["interruptions"] == [{"by": "customer", "of": "agent", "count": 1}]
    by = {s["speaker"]: s for s in a["speakers"]}
    assert (by["customer"]["interruptions_made"], by["customer"]["interrupted"]) == (1, 0)
    assert (by["agent"]["interruptions_made"], by["agent"]["interrupted"]) == (0, 1)


def test_turns_words_per_minute_and_the_longest_monologue():
    a = call_analytics(CALL, 15.0)
    by = {s["speaker"]: s for s in a["speakers"]}
    assert (by["agent"]["turns"], by["customer"]["turns"]) == (2, 2)
    assert by["agent"]["words"] == len(CALL[0]["words"]) + len(CALL[2]["words"])
    assert by["agent"]["words_per_minute"] == pytest.approx(by["agent"]["words"] / (7.0 / 60), 0.01)
    assert by["agent"]["longest_monologue_s"] == pytest.approx(5.0, abs=0.01)
    assert by["customer"]["longest_monologue_s"] == pytest.approx(3.5, abs=0.01)


def test_pauses_shorter_than_half_a_second_are_still_talking_and_longer_ones_are_not():
    words = _words(0.0, 2.0) + _words(2.4, 3.0) + _words(4.0, 5.0)  # pauses 0.4 s and 1.0 s
    a = call_analytics([{"speaker": "agent", "start": 0, "end": 5, "words": words}], 5.0)
    assert a["speakers"][0]["talk_s"] == pytest.approx(4.0, abs=0.01)
    assert a["longest_silence_s"] == pytest.approx(1.0, abs=0.01)
    # one speaker, pauses under 3 s: one monologue over the whole call
    assert a["speakers"][0]["longest_monologue_s"] == pytest.approx(5.0, abs=0.01)


def test_segments_without_words_stand_for_their_speech_and_count_their_words():
    segs = [
        {"channel": 0, "start": 1.0, "end": 3.0, "text": "hello there"},
        {"channel": 1, "start": 2.5, "end": 4.0, "text": "hi"},
    ]
    a = call_analytics(segs, 6.0)
    assert [s["speaker"] for s in a["speakers"]] == ["ch0", "ch1"]
    assert [s["words"] for s in a["speakers"]] == [2, 1]
    assert a["interruptions"] == [{"by": "ch1", "of": "ch0", "count": 1}]
    assert a["non_talk_s"] == pytest.approx(3.0)


def test_a_silent_call_has_all_of_its_time_as_silence():
    a = call_analytics([], 12.5)
    assert a["speakers"] == [] and a["interruptions"] == []
    assert a["non_talk_s"] == a["longest_silence_s"] == 12.5


def test_the_result_fits_the_declared_arrow_struct():
    rows = [call_analytics(CALL, 15.0), call_analytics([], 3.0)]
    arr = pa.array(rows, type=CALL_ANALYTICS)
    assert arr.to_pylist()[0]["speakers"][0]["speaker"] == "agent"
