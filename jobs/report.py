"""Cost reports over the ledgers and run summaries of one or many runs.

``overnight report OUTPUT... [--by day|tenant|submission|model|run] [--since DATE]
[--format table|html|csv|parquet] [--out PATH]``

Sources, per OUTPUT (a folder or an object-storage prefix):

* ``costs/*.parquet``: the cost ledger (``schemas.COSTS``), one row per item and stage. Every
  money figure of a report is a sum of its ``cost_usd``; nothing is re-priced.
* ``transcripts/`` and ``results/``: the result rows, for status, error codes and ``model``.
* ``runs/*.json``: the run summaries, for what the ledger cannot know: the reserved
  accelerator time (actors x pipeline wall), the reserved cost and the pipeline wall time.

Definitions (each figure is computed per group and once more for the totals):

* audio: each item's audio counts once, from its ``transcribe`` ledger row (an item's
  fetch/decode rows repeat the same ``audio_s``); an item without one counts the largest
  ``audio_s`` among its rows.
* audio cost: the ``decode`` and ``transcribe`` rows, and the ``fetch`` rows of items that
  have speech rows; document cost: the ``extract`` and ``generate`` rows and the other
  ``fetch`` rows. Together they are exactly the ledger's total.
* cost per audio minute = audio cost / audio minutes; per document = document cost /
  documents (items with document rows); per million tokens = document cost / (input +
  output tokens) x 1e6.
* accelerator busy hours: the ``transcribe`` and ``generate`` rows' seconds; reserved hours,
  reserved cost and pipeline wall come from each run's summary and are split between groups
  in proportion to the busy seconds each group has in that run (by items when the run was
  never busy). Utilization = busy / reserved, counted over runs that have a summary (a run
  killed before its summary has priced rows but no reserved time).
* rtfx = audio seconds / pipeline wall seconds (of transcription runs); busy_rtfx = audio seconds / speech-model busy
  seconds (what one worker does while busy: the number ``plan`` sizes with).
* day: the UTC date the ledger row was recorded (the end of its run); result rows take their
  item's ledger day, else their ``processed_at``.

Sums use ``math.fsum``, which is exact up to the final rounding and independent of order, so
a group's figure equals any independent ``fsum`` of the same ledger rows bit for bit.
Ledger rows repeated across the given outputs (the same output given twice) count once.

Formats: ``table`` prints the grouped table, failures and totals; ``csv`` and ``parquet``
write every table of the report into the folder ``--out`` (``by_<group>``, ``failures``,
``by_day``, ``by_tenant``, ``by_run``, ``totals``); ``html`` writes one self-contained file
(inline CSS and SVG charts, no script, no network) to ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import html
import io
import json
import math
import re
import sys
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from jobs import storage
from jobs.errors import ConfigError, InputNotFound
from jobs.ledger import read_results

GROUPS = ("day", "tenant", "submission", "model", "run")
FORMATS = ("table", "html", "csv", "parquet")
MODEL_STAGES = ("transcribe", "generate")
AUDIO_STAGES = ("decode", "transcribe")
DOCUMENT_STAGES = ("extract", "generate")
_RESULT_DIRS = ("transcripts", "results")
_RESULT_COLUMNS = [
    "item_id",
    "run_id",
    "tenant",
    "submission_id",
    "status",
    "error_code",
    "model",
    "processed_at",
]
NONE_LABEL = "(none)"


# -- sources ----------------------------------------------------------------------------------


@dataclass
class Sources:
    """Everything a report reads, from one or many outputs."""

    outputs: list[str]
    ledger: pa.Table
    results: list[dict[str, Any]]
    summaries: dict[str, dict[str, Any]]
    duplicate_ledger_rows: int = 0


def _empty_ledger() -> pa.Table:
    from schemas import COSTS

    return pa.Table.from_pylist([], schema=COSTS)


def load(outputs: list[str]) -> Sources:
    """Read the ledgers, result rows and run summaries under each OUTPUT."""
    from jobs.plan import read_summaries

    if not outputs:
        raise ConfigError("give at least one OUTPUT folder or prefix to report on")
    seen: set[str] = set()
    ledgers, results, summaries, shown = [], [], {}, []
    for url in outputs:
        loc = storage.resolve(url)
        if loc.url() in seen:
            continue
        seen.add(loc.url())
        shown.append(storage.redact(url))
        costs = read_results(loc.join("costs"))
        found = costs is not None
        if costs is not None and costs.num_rows:
            ledgers.append(costs)
        for name in _RESULT_DIRS:
            table = read_results(loc.join(name), _RESULT_COLUMNS)
            if table is not None:
                found = True
                results.extend(table.to_pylist())
        for s in read_summaries(loc):
            found = True
            summaries[s["run_id"]] = s
        if not found:
            raise InputNotFound(
                f"{storage.redact(url)!r} holds no costs/, transcripts/, results/ or runs/"
            )
    ledger = pa.concat_tables(ledgers, promote_options="default") if ledgers else _empty_ledger()
    before = ledger.num_rows
    ledger = _dedupe(ledger)
    return Sources(shown, ledger, results, summaries, before - ledger.num_rows)


def _dedupe(ledger: pa.Table) -> pa.Table:
    if ledger.num_rows == 0:
        return ledger
    keys = list(
        zip(
            ledger["run_id"].to_pylist(),
            ledger["item_id"].to_pylist(),
            ledger["stage"].to_pylist(),
            strict=True,
        )
    )
    if len(set(keys)) == len(keys):
        return ledger
    seen: set[tuple] = set()
    keep = []
    for i, k in enumerate(keys):
        if k not in seen:
            seen.add(k)
            keep.append(i)
    return ledger.take(pa.array(keep, pa.int64()))


def parse_since(text: str | None, now: datetime | None = None) -> datetime | None:
    """``2026-12-01``, an ISO date-time, or a span back from now (``7d``, ``12h``); UTC."""
    if text is None:
        return None
    if re.fullmatch(r"\s*\d+(\.\d+)?\s*[dhm]\s*", text):
        from jobs.plan import parse_duration

        return (now or datetime.now(UTC)) - timedelta(seconds=parse_duration(text, "--since"))
    try:
        parsed = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError(
            f"--since {text!r}: write a date (2026-12-01), a date-time, or a span like 7d"
        ) from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


# -- aggregation ------------------------------------------------------------------------------


@dataclass
class _Cell:
    """What one group holds of one run."""

    costs: list[float] = field(default_factory=list)
    audio_costs: list[float] = field(default_factory=list)
    document_costs: list[float] = field(default_factory=list)
    busy: list[float] = field(default_factory=list)
    speech_busy: list[float] = field(default_factory=list)
    audio_by_item: dict[str, float] = field(default_factory=dict)
    documents: set[str] = field(default_factory=set)
    items: set[str] = field(default_factory=set)
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass
class _Group:
    cells: dict[str, _Cell] = field(default_factory=lambda: defaultdict(_Cell))
    result_items: set[tuple[str, str]] = field(default_factory=set)
    succeeded: int = 0
    failed: int = 0
    errors: Counter = field(default_factory=Counter)


@dataclass
class _Prepared:
    """Ledger columns as Python lists plus per-item facts, computed once per report."""

    n: int
    col: dict[str, list[Any]]
    day: list[str]
    audio_item: dict[tuple[str, str], float]
    audio_items: set[tuple[str, str]]
    info: dict[tuple[str, str], dict[str, Any]]
    item_time: dict[tuple[str, str], datetime]
    run_busy: dict[str, float]
    run_items: dict[str, int]
    summaries: dict[str, dict[str, Any]]
    results: list[dict[str, Any]]


def _prepare(sources: Sources) -> _Prepared:
    ledger = sources.ledger
    col = ledger.to_pydict()
    n = ledger.num_rows
    day = pc.strftime(ledger["recorded_at"], "%Y-%m-%d").to_pylist() if n else []
    keys = list(zip(col["run_id"], col["item_id"], strict=True))
    audio_item: dict[tuple[str, str], float] = {}
    from_model_row: set[tuple[str, str]] = set()
    audio_items: set[tuple[str, str]] = set()
    run_busy_rows: dict[str, list[float]] = defaultdict(list)
    run_items: dict[str, set[str]] = defaultdict(set)
    item_time: dict[tuple[str, str], datetime] = {}
    for i in range(n):
        key, stage, audio = keys[i], col["stage"][i], col["audio_s"][i]
        if stage in AUDIO_STAGES:
            audio_items.add(key)
        if audio is not None:
            if stage == "transcribe":
                audio_item[key] = audio
                from_model_row.add(key)
            elif key not in from_model_row:
                audio_item[key] = max(audio, audio_item.get(key, audio))
        if stage in MODEL_STAGES:
            run_busy_rows[key[0]].append(col["seconds"][i] or 0.0)
        run_items[key[0]].add(key[1])
        if col["recorded_at"][i] is not None:
            item_time.setdefault(key, col["recorded_at"][i])
    info = {(r["run_id"], r["item_id"]): r for r in sources.results}
    return _Prepared(
        n=n,
        col=col,
        day=day,
        audio_item=audio_item,
        audio_items=audio_items,
        info=info,
        item_time=item_time,
        run_busy={r: math.fsum(v) for r, v in run_busy_rows.items()},
        run_items={r: len(v) for r, v in run_items.items()},
        summaries=sources.summaries,
        results=sources.results,
    )


def _label(value: Any) -> str:
    return NONE_LABEL if value is None or value == "" else str(value)


def _ledger_key(by: str, p: _Prepared, i: int) -> str:
    if by == "all":
        return "all"
    if by == "day":
        return p.day[i]
    if by == "tenant":
        return _label(p.col["tenant"][i])
    if by == "submission":
        return _label(p.col["submission_id"][i])
    if by == "model":
        found = p.info.get((p.col["run_id"][i], p.col["item_id"][i]))
        return _label(found.get("model") if found else None)
    return p.col["run_id"][i]


def _result_key(by: str, p: _Prepared, row: dict[str, Any]) -> str:
    if by == "all":
        return "all"
    if by == "day":
        when = p.item_time.get((row["run_id"], row["item_id"])) or row.get("processed_at")
        return when.astimezone(UTC).strftime("%Y-%m-%d") if when else NONE_LABEL
    if by == "tenant":
        return _label(row.get("tenant"))
    if by == "submission":
        return _label(row.get("submission_id"))
    if by == "model":
        return _label(row.get("model"))
    return row["run_id"]


def _aggregate(p: _Prepared, by: str, since: datetime | None) -> dict[str, _Group]:
    groups: dict[str, _Group] = defaultdict(_Group)
    c = p.col
    for i in range(p.n):
        if since is not None and (c["recorded_at"][i] is None or c["recorded_at"][i] < since):
            continue
        run, item, stage, cost = (
            c["run_id"][i],
            c["item_id"][i],
            c["stage"][i],
            c["cost_usd"][i] or 0.0,
        )
        cell = groups[_ledger_key(by, p, i)].cells[run]
        cell.costs.append(cost)
        cell.items.add(item)
        if stage in AUDIO_STAGES or (stage == "fetch" and (run, item) in p.audio_items):
            cell.audio_costs.append(cost)
        else:
            cell.document_costs.append(cost)
        if stage in MODEL_STAGES:
            cell.busy.append(c["seconds"][i] or 0.0)
            if stage == "transcribe":
                cell.speech_busy.append(c["seconds"][i] or 0.0)
        if stage in DOCUMENT_STAGES:
            cell.documents.add(item)
        if stage == "generate":
            cell.input_tokens += c["input_tokens"][i] or 0
            cell.output_tokens += c["output_tokens"][i] or 0
        audio = p.audio_item.get((run, item))
        if audio is not None:
            cell.audio_by_item[item] = audio
    for row in p.results:
        key = (row["run_id"], row["item_id"])
        if since is not None:
            when = p.item_time.get(key) or row.get("processed_at")
            if when is None or when < since:
                continue
        g = groups[_result_key(by, p, row)]
        if key in g.result_items:
            continue
        g.result_items.add(key)
        if row["status"] == "ok":
            g.succeeded += 1
        else:
            g.failed += 1
            g.errors[row.get("error_code") or "unknown"] += 1
    return groups


def _ratio(num: float, den: float, scale: float = 1.0) -> float | None:
    return num / den * scale if den else None


def _row(key: str, g: _Group, p: _Prepared) -> dict[str, Any]:
    cells = g.cells
    costs = [x for cell in cells.values() for x in cell.costs]
    audio_costs = [x for cell in cells.values() for x in cell.audio_costs]
    document_costs = [x for cell in cells.values() for x in cell.document_costs]
    busy = [x for cell in cells.values() for x in cell.busy]
    speech_busy = [x for cell in cells.values() for x in cell.speech_busy]
    audio = [a for cell in cells.values() for a in cell.audio_by_item.values()]
    ledger_items = {(run, item) for run, cell in cells.items() for item in cell.items}
    documents = sum(len(cell.documents) for cell in cells.values())
    tokens_in = sum(cell.input_tokens for cell in cells.values())
    tokens_out = sum(cell.output_tokens for cell in cells.values())
    reserved_s: list[float] = []
    reserved_cost: list[float] = []
    reserved_audio_cost: list[float] = []
    busy_summarized: list[float] = []
    speech_pipeline_s: list[float] = []
    audio_summarized: list[float] = []
    for run, cell in cells.items():
        summary = p.summaries.get(run)
        if summary is None:
            continue
        run_busy = p.run_busy.get(run, 0.0)
        share = (
            math.fsum(cell.busy) / run_busy
            if run_busy
            else len(cell.items) / max(p.run_items.get(run, 1), 1)
        )
        reserved_s.append(share * (summary.get("accelerator_reserved_seconds") or 0.0))
        cost = share * (summary.get("reserved_cost_usd") or 0.0)
        reserved_cost.append(cost)
        busy_summarized.extend(cell.busy)
        if summary.get("kind") != "process":
            reserved_audio_cost.append(cost)
            speech_pipeline_s.append(share * (summary.get("pipeline_seconds") or 0.0))
            audio_summarized.extend(cell.audio_by_item.values())
    audio_s = math.fsum(audio)
    audio_cost = math.fsum(audio_costs)
    document_cost = math.fsum(document_costs)
    reserved = math.fsum(reserved_s)
    return {
        "group": key,
        "runs": len(cells),
        "items": len(ledger_items | g.result_items),
        "succeeded": g.succeeded,
        "failed": g.failed,
        "audio_items": len(audio),
        "audio_seconds": audio_s,
        "audio_hours": audio_s / 3600.0,
        "documents": documents,
        "input_tokens": tokens_in,
        "output_tokens": tokens_out,
        "cost_usd": math.fsum(costs),
        "audio_cost_usd": audio_cost,
        "document_cost_usd": document_cost,
        "cost_per_audio_minute_usd": _ratio(audio_cost, audio_s / 60.0),
        "cost_per_document_usd": _ratio(document_cost, documents),
        "cost_per_million_tokens_usd": _ratio(document_cost, tokens_in + tokens_out, 1e6),
        "reserved_cost_usd": math.fsum(reserved_cost) if reserved_cost else None,
        "reserved_cost_per_audio_minute_usd": _ratio(math.fsum(reserved_audio_cost), audio_s / 60.0)
        if reserved_audio_cost
        else None,
        "accelerator_busy_hours": math.fsum(busy) / 3600.0,
        "accelerator_reserved_hours": reserved / 3600.0 if reserved_s else None,
        "utilization": _ratio(math.fsum(busy_summarized), reserved),
        "rtfx": _ratio(math.fsum(audio_summarized), math.fsum(speech_pipeline_s))
        if audio_summarized
        else None,
        "busy_rtfx": _ratio(audio_s, math.fsum(speech_busy)),
    }


REPORT_SCHEMA = pa.schema(
    [
        pa.field("group", pa.string()),
        pa.field("runs", pa.int64()),
        pa.field("items", pa.int64()),
        pa.field("succeeded", pa.int64()),
        pa.field("failed", pa.int64()),
        pa.field("audio_items", pa.int64()),
        pa.field("audio_seconds", pa.float64()),
        pa.field("audio_hours", pa.float64()),
        pa.field("documents", pa.int64()),
        pa.field("input_tokens", pa.int64()),
        pa.field("output_tokens", pa.int64()),
        pa.field("cost_usd", pa.float64()),
        pa.field("audio_cost_usd", pa.float64()),
        pa.field("document_cost_usd", pa.float64()),
        pa.field("cost_per_audio_minute_usd", pa.float64()),
        pa.field("cost_per_document_usd", pa.float64()),
        pa.field("cost_per_million_tokens_usd", pa.float64()),
        pa.field("reserved_cost_usd", pa.float64()),
        pa.field("reserved_cost_per_audio_minute_usd", pa.float64()),
        pa.field("accelerator_busy_hours", pa.float64()),
        pa.field("accelerator_reserved_hours", pa.float64()),
        pa.field("utilization", pa.float64()),
        pa.field("rtfx", pa.float64()),
        pa.field("busy_rtfx", pa.float64()),
    ]
)
FAILURES_SCHEMA = pa.schema(
    [
        pa.field("group", pa.string()),
        pa.field("error_code", pa.string()),
        pa.field("items", pa.int64()),
    ]
)


def _table(
    rows: list[dict[str, Any]], group_name: str, schema: pa.Schema = REPORT_SCHEMA
) -> pa.Table:
    table = pa.Table.from_pylist(rows, schema=schema)
    return table.rename_columns([group_name if n == "group" else n for n in table.column_names])


@dataclass
class Report:
    by: str
    since: datetime | None
    outputs: list[str]
    tables: dict[str, pa.Table]  # name -> table, in display order
    generated_at: datetime
    first_recorded: datetime | None
    last_recorded: datetime | None
    notes: list[str]

    @property
    def main(self) -> pa.Table:
        return self.tables[f"by_{self.by}"]

    @property
    def totals(self) -> dict[str, Any]:
        return self.tables["totals"].to_pylist()[0]


def grouped(p: _Prepared, by: str, since: datetime | None) -> tuple[pa.Table, pa.Table]:
    """The table grouped ``by`` and its failures by error code."""
    groups = _aggregate(p, by, since)
    rows = [_row(key, groups[key], p) for key in sorted(groups)]
    failures = [
        {"group": key, "error_code": code, "items": count}
        for key in sorted(groups)
        for code, count in sorted(groups[key].errors.items())
    ]
    name = "group" if by == "all" else by
    return _table(rows, name), _table(failures, name, FAILURES_SCHEMA)


def build_report(sources: Sources, by: str = "day", since: datetime | None = None) -> Report:
    if by not in GROUPS:
        raise ConfigError(f"--by {by!r}: choose one of {', '.join(GROUPS)}")
    p = _prepare(sources)
    tables: dict[str, pa.Table] = {}
    main, failures = grouped(p, by, since)
    tables[f"by_{by}"] = main
    tables["failures"] = failures
    for extra in ("day", "tenant", "run"):
        if extra != by:
            tables[f"by_{extra}"] = grouped(p, extra, since)[0]
    totals, _ = grouped(p, "all", since)
    if totals.num_rows == 0:
        totals = _table([_row("all", _Group(), p)], "group")
    tables["totals"] = totals
    times = [
        t for t in p.col.get("recorded_at", []) if t is not None and (since is None or t >= since)
    ]
    notes = []
    if sources.duplicate_ledger_rows:
        notes.append(
            f"{sources.duplicate_ledger_rows} ledger rows given twice (the same output listed twice) were counted once"
        )
    unsummarized = sorted({r for r in p.run_items if r not in p.summaries})
    if unsummarized:
        notes.append(
            f"{len(unsummarized)} run(s) without a summary (killed before the end; their items were priced by a later run): "
            "their busy time is not in the utilization"
        )
    return Report(
        by,
        since,
        sources.outputs,
        tables,
        datetime.now(UTC),
        min(times) if times else None,
        max(times) if times else None,
        notes,
    )


# -- rendering --------------------------------------------------------------------------------


def money(value: float | None) -> str:
    """Dollars with as many decimals as small unit costs need ($0.000151, $12.34, $1,234)."""
    if value is None:
        return "–"
    if value == 0:
        return "$0"
    size = abs(value)
    if size >= 100:
        return f"${value:,.0f}"
    if size >= 1:
        return f"${value:,.2f}"
    decimals = min(10, -math.floor(math.log10(size)) + 2)
    return f"${value:.{decimals}f}"


def _num(value: float | None, fmt: str = ",.2f") -> str:
    return "–" if value is None else format(value, fmt)


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


# (column, heading, formatter) shown in the text and HTML tables; csv/parquet keep all columns.
_SHOWN: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("items", "items", lambda v: _num(v, ",d")),
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


def _text_grid(headers: list[str], rows: list[list[str]]) -> str:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    lines = [
        "  ".join(
            h.ljust(w) if i == 0 else h.rjust(w)
            for i, (h, w) in enumerate(zip(headers, widths, strict=True))
        )
    ]
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        lines.append(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
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
    out += ["", *report.notes] if report.notes else []
    return "\n".join(out)


def _scope_line(report: Report) -> str:
    span = ""
    if report.first_recorded and report.last_recorded:
        span = (
            f", {report.first_recorded:%Y-%m-%d %H:%M} to {report.last_recorded:%Y-%m-%d %H:%M} UTC"
        )
    since = f", since {report.since:%Y-%m-%d %H:%M} UTC" if report.since else ""
    return f"cost report by {report.by} over {', '.join(report.outputs)}{span}{since}"


# SVG charts: small, dependency-free, readable without JavaScript.
_PALETTE = ("#2563eb", "#f59e0b", "#10b981", "#ef4444", "#8b5cf6", "#64748b")
_W, _H, _L, _R, _T, _B = 560, 260, 70, 16, 28, 58


def _nice_max(value: float) -> float:
    """Top of an axis with four ticks at round numbers."""
    if value <= 0:
        return 1.0
    step = value / 4
    exp = 10 ** math.floor(math.log10(step))
    for m in (1, 2, 2.5, 5, 10):
        if step <= m * exp * (1 + 1e-12):
            return 4 * m * exp
    return 40 * exp


def _axis(ymax: float, fmt: Callable[[float], str]) -> list[str]:
    parts = []
    for k in range(5):
        v = ymax * k / 4
        y = _T + (_H - _T - _B) * (1 - k / 4)
        parts.append(f'<line x1="{_L}" x2="{_W - _R}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        parts.append(
            f'<text x="{_L - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">{html.escape(fmt(v))}</text>'
        )
    return parts


def _xlabels(labels: list[str], xs: list[float]) -> list[str]:
    step = max(1, math.ceil(len(labels) / 12))
    out = []
    for i, (label, x) in enumerate(zip(labels, xs, strict=True)):
        if i % step == 0:
            short = label if len(label) <= 14 else label[:13] + "…"
            out.append(
                f'<text x="{x:.1f}" y="{_H - _B + 14}" class="tick" text-anchor="end" '
                f'transform="rotate(-30 {x:.1f} {_H - _B + 14})">{html.escape(short)}</text>'
            )
    return out


def _legend(names: list[str]) -> list[str]:
    out = []
    x = _L
    for i, name in enumerate(names):
        out.append(
            f'<rect x="{x}" y="8" width="10" height="10" fill="{_PALETTE[i % len(_PALETTE)]}"/>'
        )
        out.append(f'<text x="{x + 14}" y="17" class="tick">{html.escape(name)}</text>')
        x += 24 + 7 * len(name)
    return out


def _svg(chart_id: str, title: str, body: list[str], empty: bool) -> str:
    if empty:
        body = [f'<text x="{_W / 2}" y="{_H / 2}" text-anchor="middle" class="tick">no data</text>']
    return (
        f'<figure class="chart" id="{chart_id}"><figcaption>{html.escape(title)}</figcaption>'
        f'<svg viewBox="0 0 {_W} {_H}" width="{_W}" height="{_H}" role="img" aria-label="{html.escape(title)}">'
        + "".join(body)
        + "</svg></figure>"
    )


def bar_chart(
    chart_id: str,
    title: str,
    labels: list[str],
    series: list[tuple[str, list[float | None]]],
    fmt: Callable[[float], str],
) -> str:
    """Grouped vertical bars, one group per label, one bar per series."""
    values = [v or 0.0 for _, vs in series for v in vs]
    ymax = _nice_max(max(values, default=0.0))
    plot_w, plot_h = _W - _L - _R, _H - _T - _B
    slot = plot_w / max(len(labels), 1)
    bar = max(2.0, slot * 0.8 / max(len(series), 1))
    body = _axis(ymax, fmt) + (_legend([n for n, _ in series]) if len(series) > 1 else [])
    centers = []
    for i, label in enumerate(labels):
        x0 = _L + i * slot + slot * 0.1
        centers.append(x0 + slot * 0.4)
        for j, (name, vs) in enumerate(series):
            v = vs[i] or 0.0
            h = plot_h * v / ymax
            body.append(
                f'<rect class="bar" x="{x0 + j * bar:.1f}" y="{_T + plot_h - h:.1f}" width="{bar - 1:.1f}" '
                f'height="{h:.1f}" fill="{_PALETTE[j % len(_PALETTE)]}"><title>{html.escape(f"{label} {name}: {fmt(v)}")}'
                "</title></rect>"
            )
    body += _xlabels(labels, centers)
    return _svg(chart_id, title, body, not labels)


def line_chart(
    chart_id: str,
    title: str,
    labels: list[str],
    series: list[tuple[str, list[float | None]]],
    fmt: Callable[[float], str],
) -> str:
    """Lines with a dot per point; a missing value breaks the line."""
    values = [v for _, vs in series for v in vs if v is not None]
    ymax = _nice_max(max(values, default=0.0))
    plot_w, plot_h = _W - _L - _R, _H - _T - _B
    xs = [_L + plot_w * (i + 0.5) / max(len(labels), 1) for i in range(len(labels))]
    body = _axis(ymax, fmt) + _legend([n for n, _ in series])
    for j, (name, vs) in enumerate(series):
        color = _PALETTE[j % len(_PALETTE)]
        points = [
            (x, _T + plot_h * (1 - v / ymax), v, label)
            for x, v, label in zip(xs, vs, labels, strict=True)
            if v is not None
        ]
        if len(points) > 1:
            d = " ".join(
                f"{'M' if k == 0 else 'L'}{x:.1f},{y:.1f}" for k, (x, y, _, _) in enumerate(points)
            )
            body.append(
                f'<path class="line" d="{d}" fill="none" stroke="{color}" stroke-width="2"/>'
            )
        for x, y, v, label in points:
            body.append(
                f'<circle class="point" cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{color}">'
                f"<title>{html.escape(f'{label} {name}: {fmt(v)}')}</title></circle>"
            )
    body += _xlabels(labels, xs)
    return _svg(chart_id, title, body, not values)


def hbar_chart(
    chart_id: str, title: str, labels: list[str], values: list[float], fmt: Callable[[float], str]
) -> str:
    """Horizontal bars, largest first (for categories such as tenants)."""
    pairs = sorted(zip(labels, values, strict=True), key=lambda kv: -kv[1])[:15]
    h_row = 22
    height = max(_T + 12 + h_row * len(pairs), 80)
    left = 130
    vmax = _nice_max(max((v for _, v in pairs), default=0.0))
    body = []
    for i, (label, v) in enumerate(pairs):
        y = _T + i * h_row
        w = (_W - left - 90) * v / vmax
        short = label if len(label) <= 18 else label[:17] + "…"
        body.append(
            f'<text x="{left - 6}" y="{y + 15}" class="tick" text-anchor="end">{html.escape(short)}</text>'
        )
        body.append(
            f'<rect class="bar" x="{left}" y="{y + 3}" width="{max(w, 1):.1f}" height="{h_row - 6}" '
            f'fill="{_PALETTE[0]}"><title>{html.escape(f"{label}: {fmt(v)}")}</title></rect>'
        )
        body.append(
            f'<text x="{left + w + 6:.1f}" y="{y + 15}" class="tick">{html.escape(fmt(v))}</text>'
        )
    if not pairs:
        body = [f'<text x="{_W / 2}" y="40" text-anchor="middle" class="tick">no data</text>']
    return (
        f'<figure class="chart" id="{chart_id}"><figcaption>{html.escape(title)}</figcaption>'
        f'<svg viewBox="0 0 {_W} {height}" width="{_W}" height="{height}" role="img" aria-label="{html.escape(title)}">'
        + "".join(body)
        + "</svg></figure>"
    )


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;color:#0f172a;margin:24px;max-width:1180px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}
.scope{color:#475569;margin:0 0 16px}
.kpis{display:flex;flex-wrap:wrap;gap:12px;margin:12px 0}
.kpi{border:1px solid #e2e8f0;border-radius:8px;padding:10px 14px;min-width:150px}
.kpi b{display:block;font-size:20px}.kpi span{color:#64748b;font-size:12px}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:16px}
figure.chart{margin:0;border:1px solid #e2e8f0;border-radius:8px;padding:8px}
figcaption{font-weight:600;margin:0 0 4px}
svg .grid{stroke:#e2e8f0;stroke-width:1}svg .tick{font-size:11px;fill:#475569}
table{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums}
th,td{padding:4px 8px;border-bottom:1px solid #e2e8f0;text-align:right;white-space:nowrap}
th:first-child,td:first-child{text-align:left}th{background:#f8fafc}
tr.total td{font-weight:700;border-top:2px solid #94a3b8}
.notes{color:#475569;font-size:12px}
"""


def _html_table(headers: list[str], rows: list[list[str]], total: list[str] | None = None) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows
    )
    if total:
        body += (
            '<tr class="total">' + "".join(f"<td>{html.escape(c)}</td>" for c in total) + "</tr>"
        )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_html(report: Report) -> str:
    """One self-contained page: inline CSS and SVG, no script, no external reference."""
    t = report.totals
    day = report.tables["by_day"].to_pylist()
    tenant = report.tables["by_tenant"].to_pylist()
    days = [r["day"] for r in day]
    charts = [
        line_chart(
            "chart-cost-per-minute",
            "Cost per audio minute by day (USD)",
            days,
            [
                ("busy", [r["cost_per_audio_minute_usd"] for r in day]),
                ("reserved", [r["reserved_cost_per_audio_minute_usd"] for r in day]),
            ],
            money,
        ),
        hbar_chart(
            "chart-cost-by-tenant",
            "Cost by tenant (USD)",
            [r["tenant"] for r in tenant],
            [r["cost_usd"] for r in tenant],
            money,
        ),
        bar_chart(
            "chart-utilization",
            "Accelerator hours by day: busy vs reserved",
            days,
            [
                ("busy h", [r["accelerator_busy_hours"] for r in day]),
                ("reserved h", [r["accelerator_reserved_hours"] for r in day]),
            ],
            lambda v: f"{v:,.3g}",
        ),
        bar_chart(
            "chart-throughput",
            "Throughput by day: audio hours processed",
            days,
            [("audio h", [r["audio_hours"] for r in day])],
            lambda v: f"{v:,.3g}",
        ),
    ]
    kpis = [
        (money(t["cost_usd"]), "total cost (busy)"),
        (money(t["reserved_cost_usd"]), "reserved cost"),
        (money(t["cost_per_audio_minute_usd"]), "per audio minute"),
        (_num(t["audio_hours"], ",.2f"), "audio hours"),
        (_num(t["documents"], ",d"), "documents"),
        (money(t["cost_per_document_usd"]), "per document"),
        (_pct(t["utilization"]), "accelerator utilization"),
        (_num(t["failed"], ",d"), "failed items"),
    ]
    key = report.by
    headers = [key] + [h for _, h, _ in _SHOWN]
    rows = [[str(r[key])] + [f(r[c]) for c, _, f in _SHOWN] for r in report.main.to_pylist()]
    total = ["TOTAL"] + [f(t[c]) for c, _, f in _SHOWN]
    failures = report.tables["failures"].to_pylist()
    failure_html = (
        _html_table(
            [key, "error code", "items"],
            [[str(f[key]), f["error_code"], f"{f['items']:,d}"] for f in failures],
        )
        if failures
        else "<p>No failed items.</p>"
    )
    notes = "".join(f"<p>{html.escape(n)}</p>" for n in report.notes)
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>overnight cost report by {html.escape(key)}</title><style>{_CSS}</style></head><body>"
        "<h1>overnight cost report</h1>"
        f'<p class="scope">{html.escape(_scope_line(report))}. Generated {report.generated_at:%Y-%m-%d %H:%M} UTC.</p>'
        '<div class="kpis">'
        + "".join(
            f'<div class="kpi"><b>{html.escape(v)}</b><span>{html.escape(k)}</span></div>'
            for v, k in kpis
        )
        + "</div>"
        '<h2>Charts</h2><div class="charts">' + "".join(charts) + "</div>"
        f"<h2>By {html.escape(key)}</h2>"
        + _html_table(headers, rows, total)
        + "<h2>Failures by error code</h2>"
        + failure_html
        + '<h2>Definitions</h2><div class="notes"><p>Busy cost: the ledger (each item\'s measured seconds x units x '
        "price per hour). Reserved cost: the run summaries (actors hold their device for the whole pipeline, "
        "busy or not), split between groups by busy time. Utilization = busy / reserved accelerator hours. "
        "rtfx = audio seconds / pipeline wall seconds.</p>" + notes + "</div></body></html>"
    )


# A spreadsheet runs a cell that starts with one of these as a formula (=HYPERLINK(...)
# exfiltrates the sheet): tenant, submission and model names are tenant-controlled text.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _csv_cell(value: object) -> object:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value  # OWASP: a leading quote makes the cell text
    return value


def _csv_bytes(table: pa.Table) -> bytes:
    """CSV with floats written by ``repr`` (shortest text that round-trips exactly) and text
    that a spreadsheet would run as a formula escaped."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([_csv_cell(name) for name in table.column_names])
    for row in table.to_pylist():
        writer.writerow([_csv_cell(v) for v in row.values()])
    return buf.getvalue().encode()


def write(report: Report, fmt: str, out: str | None) -> list[str]:
    """Write the report; returns the URLs written (nothing for ``table``)."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if fmt == "table":
        return []
    if not out:
        raise ConfigError(
            f"--format {fmt} writes files: give --out (a file for html, a folder for csv/parquet)"
        )
    loc = storage.resolve(out)
    if fmt == "html":
        storage.write_bytes_atomic(loc, render_html(report).encode())
        return [loc.url()]
    written = []
    for name, table in report.tables.items():
        target = loc.join(f"{name}.{fmt}")
        if fmt == "csv":
            data = _csv_bytes(table)
        else:
            buf = io.BytesIO()
            pq.write_table(table, buf)
            data = buf.getvalue()
        storage.write_bytes_atomic(target, data)
        written.append(target.url())
    return written


# -- command line -----------------------------------------------------------------------------


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "report",
        help="cost per audio minute / document / million tokens, utilization, failures, by group",
        description="Report over the cost ledgers and run summaries of one or many outputs.",
    )
    p.add_argument(
        "outputs", nargs="+", metavar="OUTPUT", help="output folder or prefix (local, s3://, gs://)"
    )
    p.add_argument("--by", choices=GROUPS, default="day")
    p.add_argument(
        "--since",
        help="only what was recorded since: a date (2026-12-01), a date-time, or a span (7d)",
    )
    p.add_argument("--format", choices=FORMATS, default="table")
    p.add_argument("--out", help="html: the file; csv/parquet: the folder for one file per table")
    p.add_argument(
        "--json", action="store_true", help="table format: print the totals as JSON as well"
    )
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    report = build_report(load(args.outputs), by=args.by, since=parse_since(args.since))
    if args.format == "table":
        print(render_table(report))
        if args.json:
            print(json.dumps(report.totals, indent=2, default=str))
        return 0
    for url in write(report, args.format, args.out):
        print(f"[overnight] wrote {url}", file=sys.stderr)
    return 0
