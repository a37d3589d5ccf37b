"""The report's aggregation before #38 (Python loops over every ledger row), kept only so that
scripts/bench_report.py can time it against jobs/ops/report/aggregate.py and the tests can check
that both give the same tables. Not part of the product; do not import it from overnight."""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from overnight.jobs.choices import REPORT_GROUPS as GROUPS
from overnight.jobs.dataset import storage
from overnight.jobs.dataset.commits import PARTITION, CommittedDataset
from overnight.jobs.errors import ConfigError, InputNotFound
from overnight.jobs.ops.report.analytics import analytics_table

# Ledgers before schema 6 do not say which stage was the model and what unit its job
# works in (``model_stage``, ``work``): for those rows only, the stage names of that time.
_LEGACY_MODEL_STAGES = ("transcribe", "generate")
_LEGACY_AUDIO_STAGES = ("decode", "transcribe", "redact", "probe")
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
    "analytics",  # transcripts of split-channel calls (schema 3); absent elsewhere
    PARTITION,  # the run's date, from the path; null in flat files
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
    from overnight.schemas import COSTS

    return pa.Table.from_pylist([], schema=COSTS)


def load(
    outputs: list[str], since: datetime | None = None, until: datetime | None = None
) -> Sources:
    """Read the ledgers, result rows and run summaries under each OUTPUT.

    With ``since``/``until``, the ``run_date=`` partitions of run dates outside them are not
    opened: a row of a partition counts on its run's date (a backfill of an older night stays
    in that night, see ``Scope``). Flat files of older outputs are always read. A tenant is
    not a partition (see README, Layout at scale): ``--tenant`` filters rows.
    """
    dates = Scope(since, until).dates()
    from overnight.jobs.ops.plan import read_summaries
    from overnight.schemas import COSTS

    if not outputs:
        raise ConfigError("give at least one OUTPUT folder or prefix to report on")
    seen: set[str] = set()
    ledgers, results, summaries, shown = [], [], {}, []
    for url in outputs:
        loc = storage.resolve(url)
        if loc.url() in seen:
            continue
        seen.add(loc.url())
        shown.append(storage.scrub_secrets(url))
        costs = CommittedDataset(loc.join("costs")).read_results(
            [*COSTS.names, PARTITION], dates=dates
        )
        found = costs is not None
        if costs is not None and costs.num_rows:
            ledgers.append(costs)
        for name in _RESULT_DIRS:
            table = CommittedDataset(loc.join(name)).read_results(_RESULT_COLUMNS, dates=dates)
            if table is not None:
                found = True
                results.extend(table.to_pylist())
        for s in read_summaries(loc):
            found = True
            summaries[s["run_id"]] = s
        if not found:
            raise InputNotFound(
                f"{storage.scrub_secrets(url)!r} holds no costs/, transcripts/, results/ or runs/"
            )
    ledger = pa.concat_tables(ledgers, promote_options="default") if ledgers else _empty_ledger()
    before = ledger.num_rows
    ledger = _with_roles(_dedupe(ledger))
    return Sources(shown, ledger, results, summaries, before - ledger.num_rows)


def _with_roles(ledger: pa.Table) -> pa.Table:
    """``model_stage`` and ``work`` filled on rows of ledgers written before schema 6."""
    for name, kind in (("model_stage", pa.bool_()), ("work", pa.string())):
        if name not in ledger.column_names:  # no file read had it
            ledger = ledger.append_column(name, pa.nulls(ledger.num_rows, kind))
    if ledger.num_rows == 0 or (
        ledger["model_stage"].null_count == 0 and ledger["work"].null_count == 0
    ):
        return ledger
    stage, run, item = (ledger[c].to_pylist() for c in ("stage", "run_id", "item_id"))
    model, work = ledger["model_stage"].to_pylist(), ledger["work"].to_pylist()
    audio = {
        (r, i) for s, r, i in zip(stage, run, item, strict=True) if s in ("decode", "transcribe")
    }
    for k, name in enumerate(stage):
        if model[k] is None:
            model[k] = name in _LEGACY_MODEL_STAGES
        if work[k] is None:
            # A fetch was decode's (audio) or extract's (documents): its item tells which.
            is_audio = name in _LEGACY_AUDIO_STAGES or (
                name == "fetch" and (run[k], item[k]) in audio
            )
            work[k] = "audio" if is_audio else "documents"
    at = ledger.schema.get_field_index
    ledger = ledger.set_column(at("model_stage"), "model_stage", pa.array(model, pa.bool_()))
    return ledger.set_column(at("work"), "work", pa.array(work, pa.string()))


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


def parse_until(text: str | None, now: datetime | None = None) -> datetime | None:
    """The exclusive end of ``--until``: a date counts whole (``2026-12-01`` ends at the next
    midnight UTC); a date-time or a span back from now (``1d``) ends there."""
    end = parse_since(text, now)
    if end is not None and text is not None and re.fullmatch(r"\s*\d{4}-\d{2}-\d{2}\s*", text):
        end += timedelta(days=1)
    return end


def parse_since(text: str | None, now: datetime | None = None) -> datetime | None:
    """``2026-12-01``, an ISO date-time, or a span back from now (``7d``, ``12h``); UTC."""
    if text is None:
        return None
    if re.fullmatch(r"\s*\d+(\.\d+)?\s*[dhm]\s*", text):
        from overnight.jobs.ops.plan import span_back

        return span_back(text, "--since", now)
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
    recorded = pc.strftime(ledger["recorded_at"], "%Y-%m-%d").to_pylist() if n else []
    nights = col.get(PARTITION) or [None] * n
    day = [r if d is None else d.isoformat() for r, d in zip(recorded, nights, strict=True)]
    keys = list(zip(col["run_id"], col["item_id"], strict=True))
    audio_item: dict[tuple[str, str], float] = {}
    from_model_row: set[tuple[str, str]] = set()
    run_busy_rows: dict[str, list[float]] = defaultdict(list)
    run_items: dict[str, set[str]] = defaultdict(set)
    item_time: dict[tuple[str, str], datetime] = {}
    for i in range(n):
        key, model, audio = keys[i], col["model_stage"][i], col["audio_s"][i]
        if audio is not None:
            # The model's row says how much audio it heard; other stages' rows only say so
            # when the model has no row of this item.
            if model and col["work"][i] == "audio":
                audio_item[key] = audio
                from_model_row.add(key)
            elif key not in from_model_row:
                audio_item[key] = max(audio, audio_item.get(key, audio))
        if model:
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
        if row.get(PARTITION) is not None:
            return row[PARTITION].isoformat()
        when = p.item_time.get((row["run_id"], row["item_id"])) or row.get("processed_at")
        return when.astimezone(UTC).strftime("%Y-%m-%d") if when else NONE_LABEL
    if by == "tenant":
        return _label(row.get("tenant"))
    if by == "submission":
        return _label(row.get("submission_id"))
    if by == "model":
        return _label(row.get("model"))
    return row["run_id"]


@dataclass(frozen=True)
class Scope:
    """What a report counts: rows of [since, until) of one tenant, each open.

    A row of a ``run_date=`` partition is of its run's date (the night it belongs to, which
    a backfill sets: its rows are recorded today), and counts when that date is in the
    window's dates; a row of an older output's flat files, of the time it was recorded."""

    since: datetime | None = None
    until: datetime | None = None  # exclusive
    tenant: str | None = None

    def keeps(self, when: datetime | None, tenant: str | None, night: date | None = None) -> bool:
        if self.tenant is not None and tenant != self.tenant:
            return False
        if self.since is None and self.until is None:
            return True
        if night is not None:
            first, last = self.dates() or (None, None)
            return (first is None or night >= first) and (last is None or night <= last)
        if when is None:
            return False
        return (self.since is None or when >= self.since) and (
            self.until is None or when < self.until
        )

    def dates(self) -> tuple[date | None, date | None] | None:
        """The run dates whose partitions can hold rows in scope."""
        if self.since is None and self.until is None:
            return None
        last = None if self.until is None else (self.until - timedelta(microseconds=1)).date()
        return (None if self.since is None else self.since.date(), last)


def _aggregate(p: _Prepared, by: str, scope: Scope) -> dict[str, _Group]:
    groups: dict[str, _Group] = defaultdict(_Group)
    c = p.col
    nights = c.get(PARTITION) or [None] * p.n
    for i in range(p.n):
        if not scope.keeps(c["recorded_at"][i], c["tenant"][i], nights[i]):
            continue
        run, item, model, work, cost = (
            c["run_id"][i],
            c["item_id"][i],
            c["model_stage"][i],
            c["work"][i],
            c["cost_usd"][i] or 0.0,
        )
        cell = groups[_ledger_key(by, p, i)].cells[run]
        cell.costs.append(cost)
        cell.items.add(item)
        if work == "audio":
            cell.audio_costs.append(cost)
        else:
            cell.document_costs.append(cost)
            cell.documents.add(item)
        if model:
            cell.busy.append(c["seconds"][i] or 0.0)
            if work == "audio":
                cell.speech_busy.append(c["seconds"][i] or 0.0)
        if model and work == "documents":
            cell.input_tokens += c["input_tokens"][i] or 0
            cell.output_tokens += c["output_tokens"][i] or 0
        audio = p.audio_item.get((run, item))
        if audio is not None:
            cell.audio_by_item[item] = audio
    for row in p.results:
        key = (row["run_id"], row["item_id"])
        when = p.item_time.get(key) or row.get("processed_at")
        if not scope.keeps(when, row.get("tenant"), row.get(PARTITION)):
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
    until: datetime | None = None
    tenant: str | None = None

    @property
    def main(self) -> pa.Table:
        return self.tables[f"by_{self.by}"]

    @property
    def totals(self) -> dict[str, Any]:
        return self.tables["totals"].to_pylist()[0]


def grouped(p: _Prepared, by: str, scope: Scope) -> tuple[pa.Table, pa.Table]:
    """The table grouped ``by`` and its failures by error code."""
    groups = _aggregate(p, by, scope)
    rows = [_row(key, groups[key], p) for key in sorted(groups)]
    failures = [
        {"group": key, "error_code": code, "items": count}
        for key in sorted(groups)
        for code, count in sorted(groups[key].errors.items())
    ]
    name = "group" if by == "all" else by
    return _table(rows, name), _table(failures, name, FAILURES_SCHEMA)


def call_analytics(p: _Prepared, by: str, scope: Scope, costs: pa.Table) -> pa.Table:
    """The call analytics grouped ``by`` (day or tenant), the group's audio cost beside them
    (``costs``: the report's table grouped the same way)."""

    def in_scope(row: dict[str, Any]) -> bool:
        when = p.item_time.get((row["run_id"], row["item_id"])) or row.get("processed_at")
        return scope.keeps(when, row.get("tenant"), row.get(PARTITION))

    audio_cost = {r[by]: r["audio_cost_usd"] for r in costs.to_pylist()}
    table = analytics_table(
        [r for r in p.results if r.get("analytics") and in_scope(r)],
        lambda row: _result_key(by, p, row),
        audio_cost,
    )
    return table.rename_columns([by if n == "group" else n for n in table.column_names])


def build_report(
    sources: Sources,
    by: str = "day",
    since: datetime | None = None,
    until: datetime | None = None,
    tenant: str | None = None,
) -> Report:
    """The report over ``sources``, counting rows recorded in [since, until) of ``tenant``
    (each open). Reserved time is still split by each run's busy share over all its rows,
    so a tenant's figures are its share of what was reserved, not the whole run's."""
    if by not in GROUPS:
        raise ConfigError(f"--by {by!r}: choose one of {', '.join(GROUPS)}")
    scope = Scope(since, until, tenant)
    p = _prepare(sources)
    tables: dict[str, pa.Table] = {}
    main, failures = grouped(p, by, scope)
    tables[f"by_{by}"] = main
    tables["failures"] = failures
    for extra in ("day", "tenant", "run"):
        if extra != by:
            tables[f"by_{extra}"] = grouped(p, extra, scope)[0]
    for extra in ("day", "tenant"):
        calls = call_analytics(p, extra, scope, tables[f"by_{extra}"])
        if calls.num_rows:
            tables[f"call_analytics_by_{extra}"] = calls
    totals, _ = grouped(p, "all", scope)
    if totals.num_rows == 0:
        totals = _table([_row("all", _Group(), p)], "group")
    tables["totals"] = totals
    nights = p.col.get(PARTITION) or [None] * p.n
    times = [
        t
        for t, who, night in zip(
            p.col.get("recorded_at", []), p.col.get("tenant", []), nights, strict=True
        )
        if t is not None and scope.keeps(t, who, night)
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
        until,
        tenant,
    )
