"""Call analytics from a transcript's timings: no model, pure arithmetic on time spans.

For a split-channel call (one speaker a channel), per call and per speaker: talk time and
ratio, non-talk time and the longest silence, overtalk, interruptions (who interrupted whom),
turns, words per minute and the longest monologue, the measures AWS Transcribe Call Analytics
reports. Word timings give the spans when the transcript has them; otherwise each segment's
start/end stands for its speech (coarser: a segment holds the pauses inside it).

Definitions (each one a choice a reader of the numbers needs to know):

- An *utterance* is a speaker's words joined across pauses shorter than ``join_gap_s``
  (0.5 s): a breath between words is still talking.
- *Talk time* is the length of a speaker's utterances; *non-talk time* is the part of the call
  where nobody talks (leading and trailing silence included), and the *longest silence* is its
  longest stretch.
- *Overtalk* is the time when two or more speakers talk at once.
- An *interruption* is an utterance that starts while another speaker's utterance is running
  and overlaps it by at least ``min_overlap_s`` (0.3 s), so a word that only touches the end of
  the other's turn is not counted; it is counted as the newcomer interrupting the one talking.
- A *turn* starts whenever the floor passes to a speaker: utterances in order of start, a new
  turn each time the speaker differs from the previous utterance's.
- A *monologue* is a run of one speaker's utterances that no other speaker's utterance starts
  within, with pauses shorter than ``monologue_gap_s`` (3 s); its length is first start to
  last end.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

JOIN_GAP_S = 0.5
MIN_OVERLAP_S = 0.3
MONOLOGUE_GAP_S = 3.0


def speaker_names_problem(names: Sequence[str]) -> str | None:
    """Why ``names`` (channel labels or speaker roles, one a speaker) cannot name speakers, or
    None. Talk time, turns and interruptions are keyed by name, and the text's dialogue lines
    are prefixed with it: two speakers given one name became one speaker with exit 0 (a
    2-speaker call with roles ``agent,agent`` came out as one turn of one speaker)."""
    seen: dict[str, str] = {}
    for name in names:
        key = name.strip().casefold()
        if not key:
            return f"a speaker name is empty in {list(names)!r}"
        if key in seen:
            return (
                f"speaker names must differ: {name.strip()!r} and {seen[key]!r} would make "
                "two speakers one"
            )
        seen[key] = name.strip()
    return None


@dataclass(frozen=True)
class Span:
    speaker: str
    start: float
    end: float
    words: int = 1


def speech_spans(segments: Iterable[Mapping[str, Any]]) -> list[Span]:
    """One span a word (or a segment without words), labelled by speaker (or channel)."""
    spans: list[Span] = []
    for seg in segments:
        speaker = seg.get("speaker") or f"ch{seg.get('channel') or 0}"
        words = seg.get("words") or []
        if words:
            spans.extend(
                Span(speaker, float(w["start"]), float(w["end"]))
                for w in words
                if w.get("end") is not None and float(w["end"]) > float(w["start"])
            )
        elif float(seg["end"]) > float(seg["start"]):
            count = len(str(seg.get("text") or "").split())
            spans.append(Span(speaker, float(seg["start"]), float(seg["end"]), count))
    return spans


def utterances(spans: Iterable[Span], join_gap_s: float = JOIN_GAP_S) -> list[Span]:
    """Each speaker's spans joined across pauses shorter than ``join_gap_s``, in start order."""
    by_speaker: dict[str, list[Span]] = {}
    for s in spans:
        by_speaker.setdefault(s.speaker, []).append(s)
    out: list[Span] = []
    for speaker, mine in by_speaker.items():
        mine.sort(key=lambda s: s.start)
        start, end, words = mine[0].start, mine[0].end, mine[0].words
        for s in mine[1:]:
            if s.start - end < join_gap_s:
                end, words = max(end, s.end), words + s.words
            else:
                out.append(Span(speaker, start, end, words))
                start, end, words = s.start, s.end, s.words
        out.append(Span(speaker, start, end, words))
    return sorted(out, key=lambda s: (s.start, s.speaker))


def _union(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _overtalk(utts: Sequence[Span]) -> float:
    """Seconds during which at least two speakers talk: a sweep over span boundaries."""
    events = sorted([(u.start, 1) for u in utts] + [(u.end, -1) for u in utts])
    talking, last, total = 0, 0.0, 0.0
    for t, delta in events:
        if talking >= 2:
            total += t - last
        talking += delta
        last = t
    return total


def _monologues(utts: Sequence[Span], gap_s: float) -> dict[str, float]:
    longest: dict[str, float] = {}
    run: Span | None = None
    for u in utts:  # in start order
        if run is not None and u.speaker == run.speaker and u.start - run.end < gap_s:
            run = Span(run.speaker, run.start, max(run.end, u.end))
        else:
            if run is not None:
                longest[run.speaker] = max(longest.get(run.speaker, 0.0), run.end - run.start)
            run = u
    if run is not None:
        longest[run.speaker] = max(longest.get(run.speaker, 0.0), run.end - run.start)
    return longest


def call_analytics(
    segments: Iterable[Mapping[str, Any]],
    duration_s: float,
    *,
    join_gap_s: float = JOIN_GAP_S,
    min_overlap_s: float = MIN_OVERLAP_S,
    monologue_gap_s: float = MONOLOGUE_GAP_S,
) -> dict[str, Any]:
    """The analytics struct of one call (``schemas.CALL_ANALYTICS``)."""
    utts = utterances(speech_spans(segments), join_gap_s)
    duration = max(float(duration_s or 0.0), max((u.end for u in utts), default=0.0))
    talking = _union((u.start, u.end) for u in utts)
    gaps = []
    cursor = 0.0
    for start, end in talking:
        gaps.append(start - cursor)
        cursor = end
    gaps.append(duration - cursor)
    interruptions: dict[tuple[str, str], int] = {}
    for i, u in enumerate(utts):
        for other in utts[:i]:
            if (
                other.speaker != u.speaker
                and other.start < u.start
                and min(other.end, u.end) - u.start >= min_overlap_s
            ):
                key = (u.speaker, other.speaker)
                interruptions[key] = interruptions.get(key, 0) + 1
                break  # one interruption per utterance, of the earliest speaker it cut into
    turns: dict[str, int] = {}
    previous = None
    for u in utts:
        if u.speaker != previous:
            turns[u.speaker] = turns.get(u.speaker, 0) + 1
        previous = u.speaker
    monologues = _monologues(utts, monologue_gap_s)
    speakers = []
    for speaker in sorted({u.speaker for u in utts}):
        mine = [u for u in utts if u.speaker == speaker]
        talk = sum(u.end - u.start for u in mine)
        words = sum(u.words for u in mine)
        speakers.append(
            {
                "speaker": speaker,
                "talk_s": round(talk, 3),
                "talk_ratio": round(talk / duration, 4) if duration else None,
                "turns": turns.get(speaker, 0),
                "words": words,
                "words_per_minute": round(words / (talk / 60.0), 1) if talk else None,
                "longest_monologue_s": round(monologues.get(speaker, 0.0), 3),
                "interruptions_made": sum(
                    n for (by, _), n in interruptions.items() if by == speaker
                ),
                "interrupted": sum(n for (_, of), n in interruptions.items() if of == speaker),
            }
        )
    return {
        "duration_s": round(duration, 3),
        "talk_s": round(sum(b - a for a, b in talking), 3),
        "non_talk_s": round(sum(gaps), 3),
        "longest_silence_s": round(max(gaps), 3),
        "overtalk_s": round(_overtalk(utts), 3),
        "interruptions": [
            {"by": by, "of": of, "count": n} for (by, of), n in sorted(interruptions.items())
        ],
        "speakers": speakers,
    }
