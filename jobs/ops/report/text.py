"""The report as text for the terminal: the grouped table, failures and totals."""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from typing import Any

from overnight.jobs.accounting.money import money
from overnight.jobs.ops.report.aggregate import Report, stamp
from overnight.jobs.run.console import printable


def _num(value: float | None, fmt: str = ",.2f") -> str:
    return "–" if value is None else format(value, fmt)


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


# (column, heading, formatter) shown in the text and HTML tables; csv/parquet keep all columns.
_SHOWN: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("items", "items", lambda v: _num(v, ",d")),
    ("sources", "sources", lambda v: _num(v, ",d")),
    ("failed", "failed", lambda v: _num(v, ",d")),
    ("audio_hours", "audio h", lambda v: _num(v, ",.3f")),
    ("documents", "docs", lambda v: _num(v, ",d")),
    ("cost_usd", "cost", money),
    ("cost_per_audio_minute_usd", "$/audio min", money),
    ("reserved_cost_per_audio_minute_usd", "reserved $/min", money),
    ("cost_per_document_usd", "$/doc", money),
    ("cost_per_million_tokens_usd", "$/M tokens", money),
    ("accelerator_busy_hours", "busy h", lambda v: _num(v, ",.3f")),
    ("accelerator_reserved_hours", "reserved h", lambda v: _num(v, ",.3f")),
    ("utilization", "util", _pct),
    ("rtfx", "rtfx", lambda v: _num(v, ",.1f")),
)


def _width(text: str) -> int:
    """The columns ``text`` takes on a terminal: two for a wide character (CJK, emoji), none
    for a combining mark or a zero-width one. Padded by ``len``, a tenant named in CJK or
    with an emoji shifted every column after it."""
    return sum(
        0
        if unicodedata.combining(c) or unicodedata.category(c) in ("Mn", "Me", "Cf")
        else 2
        if unicodedata.east_asian_width(c) in ("W", "F")
        else 1
        for c in text
    )


def _pad(text: str, width: int, left: bool) -> str:
    fill = " " * max(0, width - _width(text))
    return text + fill if left else fill + text


def _text_grid(headers: list[str], rows: list[list[str]]) -> str:
    rows = [[printable(c) for c in r] for r in rows]  # tenants, submissions: anyone's names
    widths = [
        max(_width(h), *(_width(r[i]) for r in rows)) if rows else _width(h)
        for i, h in enumerate(headers)
    ]
    lines = [
        "  ".join(_pad(h, w, i == 0) for i, (h, w) in enumerate(zip(headers, widths, strict=True)))
    ]
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        lines.append(
            "  ".join(_pad(c, w, i == 0) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        )
    return "\n".join(lines)


def render_table(report: Report) -> str:
    key = report.by
    headers = [key] + [h for _, h, _ in _SHOWN]
    rows = [[str(r[key])] + [f(r[c]) for c, _, f in _SHOWN] for r in report.main.to_pylist()]
    t = report.totals
    rows.append(["TOTAL"] + [f(t[c]) for c, _, f in _SHOWN])
    out = [_scope_line(report), "", _text_grid(headers, rows)]
    failures = report.tables["failures"].to_pylist()
    if failures:
        out += [
            "",
            "failures by error code:",
            _text_grid(
                [key, "error_code", "items"],
                [[str(f[key]), f["error_code"], str(f["items"])] for f in failures],
            ),
        ]
    out += _call_analytics(report)
    out += ["", *report.notes] if report.notes else []
    return "\n".join(out)


# (column, heading, formatter) of the call analytics section.
_CALLS: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("calls", "calls", lambda v: _num(v, ",d")),
    ("call_minutes", "call min", lambda v: _num(v, ",.1f")),
    ("talk_ratio", "talk", _pct),
    ("non_talk_ratio", "silent", _pct),
    ("overtalk_ratio", "overtalk", _pct),
    ("interruptions_per_call", "interrupts/call", lambda v: _num(v, ",.2f")),
    ("words_per_minute", "wpm", lambda v: _num(v, ",.0f")),
    ("longest_monologue_s", "longest turn s", lambda v: _num(v, ",.1f")),
    ("cost_per_call_minute_usd", "$/call min", money),
)


def _call_analytics(report: Report) -> list[str]:
    """The split-channel and diarized calls' analytics, by the report's grouping when it is
    day or tenant, else by day; nothing when no call has analytics."""
    key = report.by if report.by in ("day", "tenant") else "day"
    table = report.tables.get(f"call_analytics_by_{key}")
    if table is None:
        return []
    rows = [
        [str(r[key]), r["speaker"]] + [f(r[c]) for c, _, f in _CALLS] for r in table.to_pylist()
    ]
    return [
        "",
        f"call analytics by {key} (split-channel and diarized calls; overtalk over the "
        "split-channel ones):",
        _text_grid([key, "speaker"] + [h for _, h, _ in _CALLS], rows),
    ]


def _scope_line(report: Report) -> str:
    span = ""
    if report.first_recorded and report.last_recorded:
        span = (
            f", {report.first_recorded:%Y-%m-%d %H:%M} to {report.last_recorded:%Y-%m-%d %H:%M} UTC"
        )
    since = f", since {stamp(report.since)} UTC" if report.since else ""
    until = f", before {stamp(report.until)} UTC" if report.until else ""
    tenant = f", tenant {report.tenant}" if report.tenant else ""
    return printable(
        f"cost report by {report.by} over {', '.join(report.outputs)}{span}{since}{until}{tenant}"
    )
