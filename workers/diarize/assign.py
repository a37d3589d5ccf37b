"""Speakers onto a mono transcript: words by overlap with the turns, segments split where the
speaker changes, call analytics and roles from the result.

Segments and words are the Whisper worker's dicts (``schemas.tables.SEGMENT``/``WORD``):
``start``/``end`` in recording seconds, ``words`` null when the job ran without word
timestamps (then a whole segment goes to the speaker it overlaps most, and is not split).

Analytics reuse ``workers.analytics.call_analytics`` (talk time, turns, words, silences,
monologues from each word's span); two measures need another definition on a mono call:

- *Overtalk* is null: diarization gives one speaker per instant, so time when two speak at
  once is invisible (``OVERTALK_UNMEASURED``, the reason, goes beside it).
- An *interruption* is a speaker change inside the other's speech: the newcomer's first word
  starts less than ``interrupt_gap_s`` (0.1 s) after the other's last word, with no pause
  that hands the floor over. On split-channel calls it is an overlap of 0.3 s or more.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from overnight.workers.analytics import JOIN_GAP_S, call_analytics, speech_spans, utterances
from overnight.workers.diarize.diarize import Turn, speaker_label

INTERRUPT_GAP_S = 0.1
OVERTALK_UNMEASURED = (
    "mono recording: diarization gives one speaker per instant, so overlapping speech is not "
    "measured"
)
DEFAULT_ROLES = ("agent", "customer")


def _as_turns(turns: Iterable[Turn | Mapping[str, Any]]) -> list[Turn]:
    out = []
    for t in turns:
        if isinstance(t, Turn):
            out.append(t)
        else:
            out.append(Turn(str(t["speaker"]), float(t["start"]), float(t["end"])))
    return sorted(out, key=lambda t: t.start)


def speaker_at(turns: Sequence[Turn], start: float, end: float) -> str | None:
    """The speaker whose turns overlap [start, end] most; the nearest turn when none does."""
    if not turns:
        return None
    overlap: dict[str, float] = {}
    for t in turns:
        if t.end <= start or t.start >= end:
            continue
        overlap[t.speaker] = overlap.get(t.speaker, 0.0) + min(t.end, end) - max(t.start, start)
    if overlap:
        return max(overlap.items(), key=lambda kv: kv[1])[0]
    middle = (start + end) / 2
    nearest = min(turns, key=lambda t: max(t.start - middle, middle - t.end, 0.0))
    return nearest.speaker


def assign_speakers(
    segments: Iterable[Mapping[str, Any]], turns: Iterable[Turn | Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """New segments with ``speaker`` filled: each word goes to the speaker it overlaps most,
    and a segment is split wherever consecutive words change speaker. The input is not
    changed. A split piece keeps its segment's scores and flags; its text is its words."""
    ordered = _as_turns(turns)
    out: list[dict[str, Any]] = []
    for seg in segments:
        words = seg.get("words")
        if not words:
            piece = dict(seg)
            piece["speaker"] = speaker_at(ordered, float(seg["start"]), float(seg["end"]))
            out.append(piece)
            continue
        runs: list[tuple[str | None, list[Mapping[str, Any]]]] = []
        for w in words:
            who = speaker_at(ordered, float(w["start"]), float(w["end"]))
            if runs and runs[-1][0] == who:
                runs[-1][1].append(w)
            else:
                runs.append((who, [w]))
        if len(runs) == 1:
            piece = dict(seg)
            piece["speaker"] = runs[0][0]
            piece["words"] = [dict(w) for w in words]
            out.append(piece)
            continue
        for who, mine in runs:
            piece = dict(seg)
            piece.update(
                speaker=who,
                start=float(mine[0]["start"]),
                end=float(mine[-1]["end"]),
                text=" ".join(str(w["word"]).strip() for w in mine),
                words=[dict(w) for w in mine],
            )
            out.append(piece)
    return out


def dialogue_text(segments: Iterable[Mapping[str, Any]]) -> str:
    """The transcript as a split-channel call's: one ``SPEAKER: text`` line a turn."""
    lines: list[tuple[str | None, str]] = []
    for seg in segments:
        text = str(seg.get("text") or "").strip()
        if not text:
            continue
        if lines and lines[-1][0] == seg.get("speaker"):
            lines[-1] = (lines[-1][0], f"{lines[-1][1]} {text}")
        else:
            lines.append((seg.get("speaker"), text))
    return "\n".join(f"{who}: {text}" for who, text in lines)


def mono_call_analytics(
    segments: Iterable[Mapping[str, Any]],
    duration_s: float,
    *,
    interrupt_gap_s: float = INTERRUPT_GAP_S,
    join_gap_s: float = JOIN_GAP_S,
) -> dict[str, Any]:
    """``schemas.CALL_ANALYTICS`` of a diarized mono call (segments with ``speaker``):
    ``call_analytics`` with overtalk null and interruptions as defined above."""
    segments = list(segments)
    result = call_analytics(segments, duration_s, join_gap_s=join_gap_s)
    result["overtalk_s"] = None
    utts = utterances(speech_spans(segments), join_gap_s)
    counts: dict[tuple[str, str], int] = {}
    previous = None
    for u in sorted(utts, key=lambda u: u.start):
        if (
            previous is not None
            and u.speaker != previous.speaker
            and u.start - previous.end < interrupt_gap_s
        ):
            key = (u.speaker, previous.speaker)
            counts[key] = counts.get(key, 0) + 1
        if previous is None or u.end >= previous.end:
            previous = u
    result["interruptions"] = [
        {"by": by, "of": of, "count": n} for (by, of), n in sorted(counts.items())
    ]
    for s in result["speakers"]:
        s["interruptions_made"] = sum(n for (by, _), n in counts.items() if by == s["speaker"])
        s["interrupted"] = sum(n for (_, of), n in counts.items() if of == s["speaker"])
    return result


def first_speaker_roles(
    turns: Iterable[Turn | Mapping[str, Any]],
    roles: Sequence[str] = DEFAULT_ROLES,
    *,
    min_turn_s: float = 0.5,
) -> dict[str, str]:
    """Speaker → role: the first to speak (a turn of at least ``min_turn_s``, so a stray
    noise does not decide) is ``roles[0]`` (the agent greets first), the next ``roles[1]``...
    Speakers beyond ``roles`` keep their label. An LLM task over the diarized turns could
    decide from what is said instead; not built (see the README)."""
    ordered = _as_turns(turns)
    first = [t for t in ordered if t.end - t.start >= min_turn_s] or ordered
    seen: list[str] = []
    for t in first + ordered:
        if t.speaker not in seen:
            seen.append(t.speaker)
    names = {speaker: roles[i] for i, speaker in enumerate(seen[: len(roles)])}
    # An unnamed speaker keeps its label unless a role took it (roles ``agent,SPEAKER_02`` on a
    # 3-speaker call): then the next free SPEAKER_nn, so that no two speakers share a name.
    taken = set(names.values())
    free = (speaker_label(i) for i in itertools.count())
    for speaker in seen[len(roles) :]:
        label = speaker
        while label in taken:
            label = next(free)
        names[speaker] = label
        taken.add(label)
    return names


def relabel(segments: Iterable[Mapping[str, Any]], names: Mapping[str, str]) -> list[dict]:
    """Segments with each ``speaker`` renamed through ``names`` (roles)."""
    return [
        {**seg, "speaker": names.get(seg.get("speaker") or "", seg.get("speaker"))}
        for seg in segments
    ]
