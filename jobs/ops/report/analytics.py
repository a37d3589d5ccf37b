"""Call analytics in the report: the transcripts rows' ``analytics`` structs (split-channel
and diarized mono calls, ``workers.analytics``) summed per day or tenant, one row for the calls
of a group (speaker ``(all)``) and one per speaker label, with the group's audio cost beside
them.

Sums are over calls, ratios are of sums (a group's talk ratio is its speakers' talk seconds
over its calls' seconds, not a mean of per-call ratios), so a group of one long call and many
short ones weighs each second once. Overtalk is over the calls that measured it: a diarized
mono call has one speaker per instant, so its ``overtalk_s`` is null, and counting it as none
made a group's overtalk ratio smaller the more mono calls it held (a group of one stereo call
with 41% overtalk and four mono calls showed 6%). None when no call of the group measured it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

ALL_SPEAKERS = "(all)"

ANALYTICS_SCHEMA = pa.schema(
    [
        pa.field("group", pa.string()),
        pa.field("speaker", pa.string()),
        pa.field("calls", pa.int64()),
        pa.field("call_minutes", pa.float64()),
        pa.field("talk_minutes", pa.float64()),
        pa.field("talk_ratio", pa.float64()),
        # (all) rows only: both parties silent, both talking
        pa.field("non_talk_ratio", pa.float64()),
        pa.field("longest_silence_s", pa.float64()),
        pa.field("overtalk_minutes", pa.float64()),
        pa.field("overtalk_ratio", pa.float64()),
        pa.field("interruptions", pa.int64()),
        pa.field("interruptions_per_call", pa.float64()),
        pa.field("turns", pa.int64()),
        pa.field("words_per_minute", pa.float64()),
        pa.field("longest_monologue_s", pa.float64()),
        # speaker rows: interruptions this speaker made and suffered
        pa.field("interrupted", pa.int64()),
        # (all) rows: the group's audio cost from the ledger, per call minute analysed
        pa.field("audio_cost_usd", pa.float64()),
        pa.field("cost_per_call_minute_usd", pa.float64()),
    ]
)


@dataclass
class _Cell:
    calls: int = 0
    call_s: list[float] = field(default_factory=list)
    talk_s: list[float] = field(default_factory=list)
    non_talk_s: list[float] = field(default_factory=list)
    overtalk_s: list[float] = field(default_factory=list)
    overtalk_call_s: list[float] = field(default_factory=list)  # calls that measured it
    longest_silence_s: float = 0.0
    longest_monologue_s: float = 0.0
    interruptions: int = 0
    interrupted: int = 0
    turns: int = 0
    words: int = 0


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def analytics_table(
    results: list[dict[str, Any]],
    key: Callable[[dict[str, Any]], str],
    audio_cost: dict[str, float],
) -> pa.Table:
    """One row per (group, speaker) over the ok result rows that carry ``analytics``;
    ``key`` gives a row's group, ``audio_cost`` each group's audio cost (its report row)."""
    calls: dict[str, _Cell] = defaultdict(_Cell)
    speakers: dict[tuple[str, str], _Cell] = defaultdict(_Cell)
    seen: set[tuple[str, str]] = set()
    for row in results:
        a = row.get("analytics")
        if not a or row.get("status") != "ok" or (row["run_id"], row["item_id"]) in seen:
            continue
        seen.add((row["run_id"], row["item_id"]))
        group = key(row)
        duration = a.get("duration_s") or 0.0
        c = calls[group]
        c.calls += 1
        c.call_s.append(duration)
        c.talk_s.append(a.get("talk_s") or 0.0)
        c.non_talk_s.append(a.get("non_talk_s") or 0.0)
        if a.get("overtalk_s") is not None:
            c.overtalk_s.append(a["overtalk_s"])
            c.overtalk_call_s.append(duration)
        c.longest_silence_s = max(c.longest_silence_s, a.get("longest_silence_s") or 0.0)
        c.interruptions += sum(i.get("count") or 0 for i in a.get("interruptions") or [])
        for sp in a.get("speakers") or []:
            s = speakers[group, sp.get("speaker") or ""]
            s.calls += 1
            s.call_s.append(duration)
            s.talk_s.append(sp.get("talk_s") or 0.0)
            s.turns += sp.get("turns") or 0
            s.words += sp.get("words") or 0
            s.interruptions += sp.get("interruptions_made") or 0
            s.interrupted += sp.get("interrupted") or 0
            s.longest_monologue_s = max(s.longest_monologue_s, sp.get("longest_monologue_s") or 0.0)
            c.turns += sp.get("turns") or 0
            c.words += sp.get("words") or 0
            c.longest_monologue_s = max(c.longest_monologue_s, s.longest_monologue_s)
    rows = []
    for group in sorted(calls):
        c = calls[group]
        call_s, talk_s = math.fsum(c.call_s), math.fsum(c.talk_s)
        overtalk_s, measured_s = math.fsum(c.overtalk_s), math.fsum(c.overtalk_call_s)
        cost = audio_cost.get(group)
        rows.append(
            {
                "group": group,
                "speaker": ALL_SPEAKERS,
                "calls": c.calls,
                "call_minutes": call_s / 60.0,
                "talk_minutes": talk_s / 60.0,
                "talk_ratio": _ratio(talk_s, call_s),
                "non_talk_ratio": _ratio(math.fsum(c.non_talk_s), call_s),
                "longest_silence_s": c.longest_silence_s,
                "overtalk_minutes": overtalk_s / 60.0 if c.overtalk_call_s else None,
                "overtalk_ratio": _ratio(overtalk_s, measured_s) if c.overtalk_call_s else None,
                "interruptions": c.interruptions,
                "interruptions_per_call": _ratio(c.interruptions, c.calls),
                "turns": c.turns,
                "words_per_minute": _ratio(c.words, talk_s / 60.0),
                "longest_monologue_s": c.longest_monologue_s,
                "interrupted": None,
                "audio_cost_usd": cost,
                "cost_per_call_minute_usd": _ratio(cost, call_s / 60.0)
                if cost is not None
                else None,
            }
        )
        for (g, speaker), s in sorted(speakers.items()):
            if g != group:
                continue
            s_call, s_talk = math.fsum(s.call_s), math.fsum(s.talk_s)
            rows.append(
                {
                    "group": group,
                    "speaker": speaker,
                    "calls": s.calls,
                    "call_minutes": s_call / 60.0,
                    "talk_minutes": s_talk / 60.0,
                    "talk_ratio": _ratio(s_talk, s_call),
                    "non_talk_ratio": None,
                    "longest_silence_s": None,
                    "overtalk_minutes": None,
                    "overtalk_ratio": None,
                    "interruptions": s.interruptions,
                    "interruptions_per_call": _ratio(s.interruptions, s.calls),
                    "turns": s.turns,
                    "words_per_minute": _ratio(s.words, s_talk / 60.0),
                    "longest_monologue_s": s.longest_monologue_s,
                    "interrupted": s.interrupted,
                    "audio_cost_usd": None,
                    "cost_per_call_minute_usd": None,
                }
            )
    return pa.Table.from_pylist(rows, schema=ANALYTICS_SCHEMA)
