"""The report's figures: the ledgers and run summaries of many outputs, grouped and summed.

The grouping runs in DuckDB over the Arrow tables that ``load`` reads (only the columns the
report needs, only the ``run_date=`` partitions of ``--since``/``--until``, through
``jobs.dataset.storage``, so object storage needs nothing of DuckDB's own). DuckDB rather
than Polars: one wheel without dependencies (66 MB installed, Polars 180 MB in two), SQL with
``GROUPING SETS`` and window functions for the ledger's roles, and the same engine the views of
``overnight views --engine duckdb`` and the README's examples use. On the 30 nights x 100,000 calls
history of ``scripts/bench_history.py`` (9 million ledger rows), ``scripts/bench_report.py``
measures it against the former Python loops over every row (docs/reading-outputs.md and the
README have the figures).

Exact sums. Every money and time figure must equal ``math.fsum`` of its ledger rows bit for
bit, which no engine's floating-point ``sum`` promises (DuckDB's ``fsum`` is Kahan-Babuska:
close, not correctly rounded). So each float column is split into its integer mantissa and
binary exponent (``numpy.frexp``, exact), the engine sums the mantissas per group and exponent
as 128-bit integers (exact), and the few resulting rows are added as Python integers and
rounded once (``_Exact``): the correctly rounded exact sum, which is what ``math.fsum`` gives.

An item's audio counts once, on the row that states it (its model row, else its row with the
most audio), in the groups that row belongs to; a result row counts once per (run, item), the
first read.
"""

from __future__ import annotations

import io
import math
import operator
import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from fractions import Fraction
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from overnight.jobs.accounting.ledger import with_attempts
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
    "source_uri",
    "tenant",
    "submission_id",
    "status",
    "error_code",
    "model",
    "processed_at",
    "analytics",  # transcripts of split-channel calls (schema 3); absent elsewhere
    PARTITION,  # the run's date, from the path; null in flat files
]
# The ledger columns the report reads (``resource`` and prices are not needed).
_LEDGER_COLUMNS = [
    "item_id",
    "run_id",
    "tenant",
    "submission_id",
    "stage",
    "seconds",
    "units",
    "cost_usd",
    "audio_s",
    "input_tokens",
    "output_tokens",
    "recorded_at",
    "model_stage",
    "work",
    PARTITION,
]
# The jobs whose result rows the report reads (a probe's rows are in probes/, not read): only
# their summaries are compared with the rows (``_Engine._forgotten``).
_RESULT_KINDS = ("transcribe", "process")
_LISTED = pa.schema([("item_id", pa.string()), ("source_uri", pa.string())])  # listed_uris
NONE_LABEL = "(none)"
_ORDER = "_ord"  # the order rows were read in: the first of repeated rows is the one kept


# -- sources ----------------------------------------------------------------------------------


@dataclass
class Sources:
    """Everything a report reads, from one or many outputs, as Arrow tables in read order."""

    outputs: list[str]
    ledger: pa.Table  # _LEDGER_COLUMNS, rows given twice included (the report counts them once)
    results: pa.Table  # _RESULT_COLUMNS of transcripts/ and results/
    summaries: dict[str, dict[str, Any]]
    # The output each summary was read from: where its run's manifest is (``listed_uris``).
    run_outputs: dict[str, storage.Location] = field(default_factory=dict)
    # A run's key -> its run id, where the two differ: the run id of a run of one output that
    # another output's run also has, keyed "<run id> (<output>)" (``load``).
    run_ids: dict[str, str] = field(default_factory=dict)
    # The runs whose summary was skipped (figures out of range, a warning named each).
    skipped: set[str] = field(default_factory=set)


def _with_order(table: pa.Table) -> pa.Table:
    return table.append_column(_ORDER, pa.array(np.arange(table.num_rows, dtype=np.int64)))


def _complete(table: pa.Table | None, columns: list[str], schema: pa.Schema) -> pa.Table:
    """``columns`` of ``table`` (null where no file had one), typed as ``schema`` has them."""
    n = 0 if table is None else table.num_rows
    kinds = {f.name: f.type for f in schema}
    kinds[PARTITION] = pa.date32()
    cols = [
        table[c] if table is not None and c in table.column_names else pa.nulls(n, kinds[c])
        for c in columns
    ]
    return pa.table(cols, names=columns)


def _identity(loc: storage.Location) -> str:
    """What tells two OUTPUTs apart. One folder under two paths (a symlink) is one output, whose
    rows the report counts once; two outputs are two, whatever their runs are called."""
    return loc.canonical().url()


def summary_problem(summary: dict[str, Any]) -> str | None:
    """Why a run summary's figures cannot go into a report, or None when they can: plan's
    checks (``run_problem``), and those of the figures only the report reads. Unchecked, a
    text figure was a TypeError traceback, NaN a ValueError one, and a negative one a
    negative reserved cost and utilization printed as figures."""
    from overnight.jobs.ops.plan import check_number, run_problem

    why = run_problem(summary)
    if why is not None:
        return why
    try:
        for key in ("reserved_cost_usd", "pipeline_seconds"):
            if summary.get(key) is not None:
                check_number(summary[key], key)
    except ConfigError as exc:
        return str(exc)
    return None


@dataclass
class _Output:
    """What ``load`` read of one OUTPUT, before its runs are keyed."""

    identity: str
    shown: str
    loc: storage.Location
    ledgers: list[pa.Table]
    results: list[pa.Table]
    summaries: list[dict[str, Any]]

    def run_ids(self) -> set[str]:
        ids = {s["run_id"] for s in self.summaries}
        for table in (*self.ledgers, *self.results):
            ids.update(r for r in pc.unique(table["run_id"]).to_pylist() if r is not None)
        return ids


def _rekey(table: pa.Table, keys: dict[str, str]) -> pa.Table:
    """``table`` with each run id of ``keys`` replaced by its key."""
    if not keys or not table.num_rows:
        return table
    column = table["run_id"]
    old = pa.array(list(keys), column.type)
    new = pa.array(list(keys.values()), column.type)
    keyed = pc.coalesce(pc.take(new, pc.index_in(column, value_set=old)), column)
    return table.set_column(table.schema.get_field_index("run_id"), "run_id", keyed)


def load(
    outputs: list[str], since: datetime | None = None, until: datetime | None = None
) -> Sources:
    """Read the ledgers, result rows and run summaries under each OUTPUT.

    With ``since``/``until``, the ``run_date=`` partitions of run dates outside them are not
    opened: a row of a partition counts on its run's date (a backfill of an older night stays
    in that night, see ``Scope``). Flat files of older outputs are always read. A tenant is
    not a partition (docs/explanation/how-it-works.md, Layout at scale): ``--tenant`` filters rows.

    A run is told apart by its output and run id: two outputs can each hold a run of the same
    id (``--run-id`` is the user's), and keyed by run id alone their rows were counted once as
    if given twice and one summary priced both. Such runs are keyed "<run id> (<output>)".
    A summary whose figures are out of range is skipped with a warning naming it.
    """
    dates = Scope(since, until).dates()
    from overnight.jobs.ops.plan import read_summaries
    from overnight.jobs.run import console
    from overnight.schemas import COSTS, TRANSCRIPTS

    if not outputs:
        raise ConfigError("give at least one OUTPUT folder or prefix to report on")
    seen: set[str] = set()
    read: list[_Output] = []
    for url in outputs:
        loc = storage.resolve(url)
        if loc.url() in seen:
            continue
        seen.add(loc.url())
        shown = storage.scrub_secrets(url)
        storage.refuse_a_file_as_output(loc, shown)
        out = _Output(_identity(loc), shown, loc, [], [], [])
        costs = CommittedDataset(loc.join("costs")).read_results(_LEDGER_COLUMNS, dates=dates)
        found = costs is not None
        if costs is not None and costs.num_rows:
            out.ledgers.append(_complete(costs, _LEDGER_COLUMNS, COSTS))
        for name in _RESULT_DIRS:
            table = CommittedDataset(loc.join(name)).read_results(_RESULT_COLUMNS, dates=dates)
            if table is not None:
                found = True
                if table.num_rows:
                    # results/ has no ``analytics``: typed as transcripts/ has it, null
                    out.results.append(_complete(table, _RESULT_COLUMNS, TRANSCRIPTS))
        for s in read_summaries(loc):
            found = True
            out.summaries.append(s)
        if not found:
            raise InputNotFound(f"{shown!r} holds no costs/, transcripts/, results/ or runs/")
        read.append(out)
    # The runs of one id in more than one output, each keyed by its output's first name.
    names: dict[str, str] = {}
    ids_of: dict[str, set[str]] = defaultdict(set)
    for out in read:
        names.setdefault(out.identity, out.shown)
        ids_of[out.identity] |= out.run_ids()
    counts: dict[str, int] = defaultdict(int)
    for ids in ids_of.values():
        for run in ids:
            counts[run] += 1
    ledgers, results, summaries, where, run_ids = [], [], {}, {}, {}
    skipped: set[str] = set()
    for out in read:
        keys = {
            run: f"{run} ({names[out.identity]})" for run in ids_of[out.identity] if counts[run] > 1
        }
        ledgers += [_rekey(t, keys) for t in out.ledgers]
        results += [_rekey(t, keys) for t in out.results]
        for s in out.summaries:
            run = s["run_id"]
            key = keys.get(run, run)
            if key != run:
                run_ids[key] = run
            s = with_attempts(s)  # a run id run again: its attempts' reserved time, summed
            why = summary_problem(s)
            if why is not None:
                if key not in skipped:  # the same output given twice: one warning
                    console.event(
                        "skipped_run",
                        f"warning: skipped the summary of run {run} in {out.shown}: {why}; "
                        "its reserved time and cost are not in the report",
                        level="warning",
                        run_id=run,
                        source=out.shown,
                    )
                skipped.add(key)
                continue
            summaries[key] = s
            where[key] = out.loc
    ledger = (
        pa.concat_tables(ledgers, promote_options="default")
        if ledgers
        else _complete(None, _LEDGER_COLUMNS, COSTS)
    )
    result = (
        pa.concat_tables(results, promote_options="permissive")
        if results
        else _complete(None, _RESULT_COLUMNS, TRANSCRIPTS)
    )
    return Sources(
        [out.shown for out in read],
        _with_order(ledger),
        _with_order(result),
        summaries,
        where,
        run_ids,
        skipped,
    )


def listed_uris(sources: Sources, wanted: dict[str, list[str]]) -> pa.Table:
    """The source URIs of items without any result row (``wanted``: run -> item ids), from
    the manifests of their runs (``_manifests/<run_id>.parquet``), as (item_id, source_uri).

    Such an item's error row was replaced under another id: a recording missing when it was
    listed had its ``fetch_failed`` row under its "missing" id (``jobs.dataset.manifest``),
    and the ``--retry-errors`` run that found it back wrote its row under its real one. No row
    names the missing id's URI any more, and the report counted it as a source of its own.
    Best effort: the items of a run without a readable manifest count by their id."""
    out = []
    for run, ids in sorted(wanted.items()):
        output = sources.run_outputs.get(run)
        if output is None:
            continue
        try:
            run_id = sources.run_ids.get(run, run)  # its manifest is named by its run id
            data = storage.read_location(output.join("_manifests", f"{run_id}.parquet"))
            table = pq.read_table(io.BytesIO(data), columns=["item_id", "uri"])
        except FileNotFoundError:
            continue  # an older output's run, or a vacuumed one's
        except (pa.ArrowException, ValueError):
            continue  # not readable as a manifest: a cost report does not stop for it
        table = table.filter(pc.is_in(table["item_id"], value_set=pa.array(ids, pa.string())))
        out.append(table.rename_columns(_LISTED.names).cast(_LISTED))
    return pa.concat_tables(out) if out else _LISTED.empty_table()


def parse_until(text: str | None, now: datetime | None = None) -> datetime | None:
    """The exclusive end of ``--until``: a date counts whole (``2026-12-01`` ends at the next
    midnight UTC); a date-time or a span back from now (``1d``) ends there."""
    end = parse_since(text, now, "--until")
    if end is not None and text is not None and re.fullmatch(r"\s*\d{4}-\d{2}-\d{2}\s*", text):
        end += timedelta(days=1)
    return end


# A span as ``plan``'s ``parse_duration`` reads one (7d, 12h, 1h30m, 90s, 7D): the report
# took only one number with d, h or m, and refused the others that plan's flags take.
_SPAN = re.compile(r"\s*(?:(?:\d+(?:\.\d*)?|\.\d+)\s*[dhms]\s*)+", re.IGNORECASE)


def parse_since(
    text: str | None, now: datetime | None = None, what: str = "--since"
) -> datetime | None:
    """``2026-12-01``, an ISO date-time, or a span back from now (``7d``, ``1h30m``); UTC."""
    if text is None:
        return None
    if _SPAN.fullmatch(text):
        from overnight.jobs.ops.plan import span_back

        return span_back(text, what, now)
    try:
        parsed = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError(
            f"{what} {text!r}: write a date (2026-12-01), a date-time, or a span like 7d"
        ) from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def stamp(when: datetime) -> str:
    """A window's bound as the header states it: to the second where it has seconds (a span
    back from now), so that the time said is the time counted."""
    return f"{when:%Y-%m-%d %H:%M:%S}" if when.second else f"{when:%Y-%m-%d %H:%M}"


@dataclass(frozen=True)
class Scope:
    """What a report counts: rows of [since, until) of one tenant, each open.

    A row of a ``run_date=`` partition is of its run's date (the night it belongs to, which
    a backfill sets: its rows are recorded today), and counts when that date is in the
    window's dates; on a night where the window starts or ends (a date-time or a span, not
    midnight), only when the row's time is inside it too: widened to whole nights, a report
    ``--since 16:03`` counted a run that ended at 16:01 under a header saying 16:03. A row of
    an older output's flat files counts by the time it was recorded. The tenant
    ``(none)``, as the report labels items without one, selects those."""

    since: datetime | None = None
    until: datetime | None = None  # exclusive
    tenant: str | None = None

    def __post_init__(self) -> None:
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ConfigError(
                f"--since {stamp(self.since)} UTC is not before --until "
                f"{stamp(self.until)} UTC (exclusive): no row can be in that window"
            )

    def keeps(self, when: datetime | None, tenant: str | None, night: date | None = None) -> bool:
        if self.tenant == NONE_LABEL:
            if tenant:
                return False
        elif self.tenant is not None and tenant != self.tenant:
            return False
        if self.since is None and self.until is None:
            return True
        if night is not None:
            first, last = self.dates() or (None, None)
            if (first is not None and night < first) or (last is not None and night > last):
                return False
            if when is None:  # no time to place it within its night: the night decides
                return True
            since, until = self.cuts()
            return (since is None or night != first or when >= since) and (
                until is None or night != last or when < until
            )
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

    def cuts(self) -> tuple[datetime | None, datetime | None]:
        """``since`` and ``until`` where they cut a night (not at midnight), else None."""

        def cut(when: datetime | None) -> datetime | None:
            midnight = when is not None and when.astimezone(UTC).time() == time(0)
            return None if when is None or midnight else when

        return cut(self.since), cut(self.until)


# -- aggregation ------------------------------------------------------------------------------


class _Exact:
    """An exact sum of floats: integer mantissa sums by binary exponent (see the module doc)."""

    __slots__ = ("by_exp",)

    def __init__(self) -> None:
        self.by_exp: dict[int, int] = defaultdict(int)

    def add(self, exp: int, mantissas: int) -> None:
        self.by_exp[exp] += mantissas

    def merge(self, other: _Exact) -> None:
        for e, m in other.by_exp.items():
            self.by_exp[e] += m

    def value(self) -> float:
        """The exact sum, rounded once to the nearest float (what ``math.fsum`` returns)."""
        if not self.by_exp:
            return 0.0
        low = min(self.by_exp)
        total = sum(m << (e - low) for e, m in self.by_exp.items())
        # frexp's mantissa is in [0.5, 1), scaled by 2**53 to an integer
        return float(Fraction(total) * Fraction(2) ** (low - 53))


def _split(column: pa.ChunkedArray | pa.Array) -> tuple[pa.Array, pa.Array]:
    """A float column as integer mantissas and exponents, exactly (null as 0)."""
    values = pc.fill_null(column, 0.0).to_numpy()
    mantissa, exponent = np.frexp(values)
    return pa.array(np.ldexp(mantissa, 53).astype(np.int64)), pa.array(exponent.astype(np.int16))


def _label(expr: str) -> str:
    return f"CASE WHEN {expr} IS NULL OR {expr} = '' THEN '{NONE_LABEL}' ELSE {expr} END"


def _ts(when: datetime) -> str:
    return f"TIMESTAMPTZ '{when.astimezone(UTC).isoformat(sep=' ')}'"


def _in_scope(scope: Scope, when: str, tenant: str, night: str) -> str:
    """``Scope.keeps`` as SQL (the tenant compared with the one-row table ``scope_tenant``)."""
    parts = []
    if scope.tenant == NONE_LABEL:
        parts.append(f"coalesce({tenant}, '') = ''")
    elif scope.tenant is not None:
        parts.append(f"{tenant} = (SELECT tenant FROM scope_tenant)")
    if scope.since is not None or scope.until is not None:
        first, last = scope.dates() or (None, None)
        since, until = scope.cuts()
        on_date = [f"{night} >= DATE '{first}'"] if first else []
        on_date += [f"{night} <= DATE '{last}'"] if last else []
        if since is not None:
            on_date.append(
                f"({night} <> DATE '{first}' OR {when} IS NULL OR {when} >= {_ts(since)})"
            )
        if until is not None:
            on_date.append(f"({night} <> DATE '{last}' OR {when} IS NULL OR {when} < {_ts(until)})")
        on_time = [f"{when} IS NOT NULL"]
        on_time += [f"{when} >= {_ts(scope.since)}"] if scope.since else []
        on_time += [f"{when} < {_ts(scope.until)}"] if scope.until else []
        parts.append(
            f"CASE WHEN {night} IS NOT NULL THEN {' AND '.join(on_date) or 'true'} "
            f"ELSE {' AND '.join(on_time)} END"
        )
    return f"coalesce({' AND '.join(parts)}, false)" if parts else "true"


# What each grouping groups by, in the tables the engine builds (L: ledger rows, R: results).
_KEY = {
    "day": "g_day",
    "tenant": "g_tenant",
    "submission": "g_sub",
    "model": "g_model",
    "run": "run_id",
    "all": "'all'",
}


@dataclass
class _Cell:
    """What one group holds of one run (exact sums, counts)."""

    cost: _Exact = field(default_factory=_Exact)
    audio_cost: _Exact = field(default_factory=_Exact)
    busy: _Exact = field(default_factory=_Exact)
    speech_busy: _Exact = field(default_factory=_Exact)
    audio: _Exact = field(default_factory=_Exact)
    items: int = 0
    documents: int = 0
    audio_items: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass
class _Group:
    cells: dict[str, _Cell] = field(default_factory=lambda: defaultdict(_Cell))
    items: int = 0  # ledger and result items, each (run, item) once
    sources: int = 0  # distinct source URIs of those items (an item's id where none is known)
    succeeded: int = 0
    failed: int = 0
    errors: dict[str, int] = field(default_factory=dict)


class _Engine:
    """The sources in DuckDB, prepared once per report: roles, keys, the scope."""

    def __init__(self, sources: Sources, scope: Scope, by: str) -> None:
        import duckdb

        self.scope, self.summaries = scope, sources.summaries
        con = self.con = duckdb.connect()
        con.execute("SET TimeZone = 'UTC'").fetchall()
        ledger = sources.ledger
        ledger = ledger.append_column("busy_s", _actor_seconds(ledger, sources.summaries))
        for name in ("cost_usd", "audio_s", "busy_s"):
            mantissa, exponent = _split(ledger[name])
            ledger = ledger.append_column(f"{name}_m", mantissa).append_column(
                f"{name}_e", exponent
            )
        con.register("ledger_in", ledger)
        con.register("results_in", sources.results)
        con.register("scope_tenant", pa.table({"tenant": pa.array([scope.tenant], pa.string())}))
        self._prepare(sources, by)

    def sql(self, text: str) -> pa.Table:
        return self.con.sql(text).to_arrow_table()

    def _run(self, text: str) -> None:
        self.con.execute(text).fetchall()

    def _prepare(self, sources: Sources, by: str) -> None:
        legacy = sources.ledger.num_rows and (
            sources.ledger["model_stage"].null_count or sources.ledger["work"].null_count
        )
        flat = sources.results.num_rows and sources.results[PARTITION].null_count
        # A result row's time, where a flat file or a window cutting a night needs one: its
        # item's first ledger time (so that an item's outcome and cost fall on one side).
        timed = flat or (sources.results.num_rows and any(self.scope.cuts()))
        # Rows of ledgers before schema 6: the role by stage name; a fetch was decode's (audio)
        # or extract's (documents), which its item's other rows tell.
        is_model = f"coalesce(model_stage, stage IN {_LEGACY_MODEL_STAGES})"
        is_audio = f"coalesce(work = 'audio', stage IN {_LEGACY_AUDIO_STAGES})"
        work = (
            f"coalesce(work, CASE WHEN stage IN {_LEGACY_AUDIO_STAGES} "
            "OR (stage = 'fetch' AND items.speech) THEN 'audio' ELSE 'documents' END)"
            if legacy
            else "work"
        )
        # Per item: the model's row says how much audio it had; other rows only say so when
        # the model has no row of it (then the largest): one stage's row carries it. A result
        # row of a flat file (no run date) is of its item's first ledger time. Rows given twice
        # (an output listed twice; same run, item and stage) count once: the first read.
        self._run(f"""
            CREATE TEMP TABLE items AS
            SELECT run_id, item_id,
                   {"bool_or(stage IN ('decode', 'transcribe'))" if legacy else "NULL"} AS speech,
                   coalesce(
                       arg_max(stage, _ord) FILTER (WHERE {is_model} AND {is_audio}
                                                    AND audio_s IS NOT NULL),
                       arg_max(stage, audio_s) FILTER (WHERE audio_s IS NOT NULL)
                   ) AS carrier,
                   {"arg_min(recorded_at, _ord) FILTER (WHERE recorded_at IS NOT NULL)" if timed else "NULL"} AS t,
                   count(*) - count(DISTINCT stage) AS repeated
            FROM ledger_in GROUP BY run_id, item_id
        """)
        self.duplicates = self.sql("SELECT sum(repeated) AS n FROM items")["n"][0].as_py() or 0
        self.run_items = {
            r["run_id"]: r["n"]
            for r in self.sql("SELECT run_id, count(*) AS n FROM items GROUP BY run_id").to_pylist()
        }
        rows = "ledger_in"
        if self.duplicates:
            self._run("""
                CREATE TEMP TABLE deduped AS SELECT * FROM ledger_in
                QUALIFY row_number() OVER (PARTITION BY run_id, item_id, stage ORDER BY _ord) = 1
            """)
            rows = "deduped"
        self.repeated_results = bool(
            self.sql("""
                SELECT count(*) AS n FROM (
                    SELECT 1 FROM results_in GROUP BY run_id, item_id HAVING count(*) > 1
                )
            """)["n"][0].as_py()
        )
        model_join, g_model = "", "NULL::VARCHAR"
        if by == "model":  # a ledger row's model is its item's result row's (the last read)
            self._run(f"""
                CREATE TEMP TABLE info AS
                SELECT run_id, item_id, {_label("arg_max(model, _ord)")} AS g_model
                FROM results_in GROUP BY run_id, item_id
            """)
            model_join = "LEFT JOIN info USING (run_id, item_id)"
            g_model = f"coalesce(info.g_model, '{NONE_LABEL}')"
        # A row's day: its run's date, else (flat files) the UTC date it was recorded.
        self._run(f"""
            CREATE TEMP TABLE L AS
            SELECT _ord, run_id, item_id, recorded_at, input_tokens, output_tokens,
                   cost_usd_m, cost_usd_e, busy_s_m, busy_s_e, audio_s_m, audio_s_e,
                   {is_model} AS model_stage, {work} AS work,
                   coalesce(strftime({PARTITION}, '%Y-%m-%d'), strftime(recorded_at, '%Y-%m-%d'),
                            '{NONE_LABEL}') AS g_day,
                   {_label("tenant")} AS g_tenant, {_label("submission_id")} AS g_sub,
                   {g_model} AS g_model,
                   audio_s IS NOT NULL AND stage = items.carrier AS carries_audio,
                   {_in_scope(self.scope, "recorded_at", "tenant", PARTITION)} AS in_scope
            FROM {rows} JOIN items USING (run_id, item_id) {model_join}
        """)
        if rows == "deduped":
            self._run("DROP TABLE deduped")
        times, when = "", "processed_at"
        if timed:
            times = "LEFT JOIN items USING (run_id, item_id)"
            when = "coalesce(items.t, processed_at)"
        self._run(f"""
            CREATE TEMP TABLE R AS
            SELECT run_id, item_id, status, error_code, analytics, _ord,
                   coalesce(strftime({PARTITION}, '%Y-%m-%d'), strftime({when}, '%Y-%m-%d'),
                            '{NONE_LABEL}') AS g_day,
                   {_label("tenant")} AS g_tenant, {_label("submission_id")} AS g_sub,
                   {_label("model")} AS g_model,
                   {_in_scope(self.scope, when, "tenant", PARTITION)} AS in_scope
            FROM results_in {times}
        """)
        self._run("DROP TABLE items")
        self._forgotten(sources.results.num_rows)
        # Each item's source: its result rows' URI, else its run's manifest's (``listed_uris``).
        self.con.register("listed_in", listed_uris(sources, self.unsourced))
        self._run("""
            CREATE TEMP TABLE srcs AS
            SELECT item_id, min(source_uri) AS src
            FROM (SELECT item_id, source_uri FROM results_in
                  UNION ALL SELECT item_id, source_uri FROM listed_in)
            WHERE source_uri IS NOT NULL GROUP BY item_id
        """)

    def _forgotten(self, offset: int) -> None:
        """Put back into R, as their run's summary counts them, the error rows that a later
        run redid. ``--retry-errors`` (and a chained task whose transcript is there now)
        removes the error rows it redoes, so that an item keeps one row
        (``CommittedDataset.forget``); the run that wrote them keeps its ledger rows and its
        summary. Joined by (run, item), that run showed the item with no outcome: 2 items, 0
        failed, against a summary of 1 failed, as if the retry had rewritten its night.

        So where a run's summary counts more failures than its result rows hold, its ledger
        items without a result row of that run are those rows: failed, with the error code
        the summary has over the rows (several candidates are named together, ``a or b``).
        Where it counts fewer such failures than there are items without rows, which ones
        failed is not known and none is counted; failures with no ledger row at all (an item
        passed through without a timed stage) cannot be placed in a group. ``notes`` says both.
        ``offset``: after the result rows' read order, where these rows go in it."""
        self.forgotten = 0
        self.unplaced: dict[str, int] = {}  # run -> failures of its summary not placed
        self.unsourced: dict[str, list[str]] = {}  # run -> its placed items without any row
        runs = {r: s for r, s in self.summaries.items() if s.get("kind") in _RESULT_KINDS}
        if not runs:
            return
        failed: dict[str, int] = defaultdict(int)
        codes: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for row in self.sql("""
            SELECT run_id, error_code, count(DISTINCT item_id) AS n FROM results_in
            WHERE status IS DISTINCT FROM 'ok' GROUP BY ALL
        """).to_pylist():
            failed[row["run_id"]] += row["n"]
            codes[row["run_id"]][row["error_code"]] += row["n"]
        missing = {}
        for run, summary in runs.items():
            counted = summary.get("failed")
            if (
                run not in self.run_items
                or not isinstance(counted, int)
                or isinstance(counted, bool)
            ):
                continue  # no ledger row read (another window of dates), or no count
            if counted > failed[run]:
                missing[run] = counted - failed[run]
        if not missing:
            return
        self.con.register("short_runs", pa.table({"run_id": pa.array(sorted(missing))}))
        self._run(f"""
            CREATE TEMP TABLE forgotten AS
            SELECT run_id, item_id, arg_min(g_day, _ord) AS g_day,
                   arg_min(g_tenant, _ord) AS g_tenant, arg_min(g_sub, _ord) AS g_sub,
                   coalesce(arg_min(g_model, _ord), '{NONE_LABEL}') AS g_model,
                   arg_min(in_scope, _ord) AS in_scope, min(_ord) AS _ord
            FROM L
            WHERE run_id IN (SELECT run_id FROM short_runs)
              AND NOT EXISTS (SELECT 1 FROM results_in r
                              WHERE r.run_id = L.run_id AND r.item_id = L.item_id)
            GROUP BY run_id, item_id
        """)
        found = {
            r["run_id"]: r["n"]
            for r in self.sql(
                "SELECT run_id, count(*) AS n FROM forgotten GROUP BY ALL"
            ).to_pylist()
        }
        placed = []
        for run, n in sorted(missing.items()):
            rows = found.get(run, 0)
            if rows > n:  # more items without a row than failures: which ones is not known
                rows = 0
            elif rows:
                placed.append({"run_id": run, "code": self._code(runs[run], codes[run])})
                self.forgotten += rows
            if n > rows:
                self.unplaced[run] = n - rows
        if placed:
            self.con.register("placed", pa.Table.from_pylist(placed))
            self._run(f"""
                INSERT INTO R (run_id, item_id, status, error_code, _ord, g_day, g_tenant,
                               g_sub, g_model, in_scope)
                SELECT run_id, item_id, 'error', code, _ord + {offset}, g_day, g_tenant, g_sub,
                       g_model, in_scope
                FROM forgotten JOIN placed USING (run_id)
            """)
            for row in self.sql("""
                SELECT run_id, list(item_id ORDER BY item_id) AS ids
                FROM forgotten f SEMI JOIN placed USING (run_id)
                WHERE NOT EXISTS (SELECT 1 FROM results_in r WHERE r.item_id = f.item_id)
                GROUP BY run_id
            """).to_pylist():
                self.unsourced[row["run_id"]] = row["ids"]
        self._run("DROP TABLE forgotten")

    @staticmethod
    def _code(summary: dict[str, Any], rows: dict[str, int]) -> str:
        """The error code of a run's failures that its rows no longer hold: the summary's
        codes counted more often than in the rows (``a or b`` when more than one is)."""
        by_code = summary.get("errors_by_code")
        left = sorted(
            str(code)
            for code, n in (by_code.items() if isinstance(by_code, dict) else ())
            if isinstance(n, int) and n > rows.get(code, 0)
        )
        return " or ".join(left) if left else "unknown"

    # -- the figures of each grouping ---------------------------------------------------------

    def groups(self, names: list[str]) -> dict[str, dict[str, _Group]]:
        """Each grouping's groups, keyed by group label."""
        out: dict[str, dict[str, _Group]] = {n: defaultdict(_Group) for n in names}
        cols = sorted({_KEY[n] for n in names} - {"run_id", "'all'"})
        keys = ", ".join([*cols, "run_id"])

        def label(name: str, row: dict[str, Any]) -> str:
            return "all" if name == "all" else row[_KEY[name]]

        # Exact sums at the finest grouping, added up per grouping in Python (few rows).
        sums = self.sql(f"""
            SELECT {keys}, 'cost' AS what, work = 'audio' AS audio, cost_usd_e AS e,
                   sum(cost_usd_m)::VARCHAR AS m
            FROM L WHERE in_scope GROUP BY ALL
            UNION ALL
            SELECT {keys}, 'busy', work = 'audio', busy_s_e, sum(busy_s_m)::VARCHAR
            FROM L WHERE in_scope AND model_stage GROUP BY ALL
            UNION ALL
            SELECT {keys}, 'audio', true, audio_s_e, sum(audio_s_m)::VARCHAR
            FROM L WHERE in_scope AND carries_audio GROUP BY ALL
        """).to_pylist()
        for row in sums:
            e, m = int(row["e"]), int(row["m"])
            for name in names:
                cell = out[name][label(name, row)].cells[row["run_id"]]
                if row["what"] == "cost":
                    cell.cost.add(e, m)
                    if row["audio"]:
                        cell.audio_cost.add(e, m)
                elif row["what"] == "busy":
                    cell.busy.add(e, m)
                    if row["audio"]:
                        cell.speech_busy.add(e, m)
                else:
                    cell.audio.add(e, m)
        # One row per item and key combination in scope; with the results' items, each
        # (run, item) once per combination. An item has one combination unless its rows
        # disagree (a flat file's rows recorded either side of midnight): then, and only
        # then, counting needs DISTINCT.
        self._run(f"""
            CREATE OR REPLACE TEMP TABLE I AS
            SELECT {keys}, item_id,
                   bool_or(work IS DISTINCT FROM 'audio') AS doc,
                   bool_or(carries_audio) AS audio,
                   sum(input_tokens) FILTER (WHERE model_stage AND work = 'documents') AS i,
                   sum(output_tokens) FILTER (WHERE model_stage AND work = 'documents') AS o
            FROM L WHERE in_scope GROUP BY ALL
        """)
        self._run(f"""
            CREATE OR REPLACE TEMP TABLE U AS
            SELECT {keys}, item_id FROM I UNION SELECT {keys}, item_id FROM R WHERE in_scope
        """)
        split = self.sql("""
            SELECT count(*) AS n FROM (
                SELECT 1 FROM U GROUP BY run_id, item_id HAVING count(*) > 1
            )
        """)["n"][0].as_py()
        items = "count(DISTINCT item_id)" if split else "count(*)"
        pairs = "count(DISTINCT (run_id, item_id))" if split else "count(*)"
        sets = ", ".join(f"({c}, run_id)" for c in cols) + (", (run_id)")
        counted = self.sql(f"""
            SELECT GROUPING({keys}) AS gid, {keys}, {items} AS items,
                   {items} FILTER (WHERE doc) AS documents,
                   {items} FILTER (WHERE audio) AS audio_items,
                   sum(i) AS i, sum(o) AS o
            FROM I GROUP BY GROUPING SETS ({sets})
        """).to_pylist()
        # Items of ledger and results; the outcome of each result item, its first row's.
        set_of = {n: (f"({_KEY[n]})" if n != "all" else "()") for n in names}
        first = (
            f"SELECT DISTINCT ON (run_id, item_id) {keys}, status, error_code FROM R "
            "WHERE in_scope ORDER BY run_id, item_id, _ord"
            if self.repeated_results
            else f"SELECT {keys}, status, error_code FROM R WHERE in_scope"
        )
        union = self.sql(f"""
            WITH first AS ({first})
            SELECT 'items' AS what, GROUPING({keys}) AS gid, {keys}, NULL::VARCHAR AS code,
                   {pairs} AS n
            FROM U GROUP BY GROUPING SETS ({", ".join(dict.fromkeys(set_of.values()))})
            UNION ALL
            SELECT 'sources', GROUPING({keys}), {keys}, NULL,
                   count(DISTINCT coalesce(srcs.src, item_id))
            FROM U LEFT JOIN srcs USING (item_id)
            GROUP BY GROUPING SETS ({", ".join(dict.fromkeys(set_of.values()))})
            UNION ALL
            SELECT CASE WHEN status = 'ok' THEN 'ok' ELSE 'failed' END, GROUPING({keys}),
                   {keys}, CASE WHEN status = 'ok' THEN NULL
                                ELSE coalesce(error_code, 'unknown') END, count(*)
            FROM first GROUP BY GROUPING SETS (
                {", ".join(f"({c[1:-1]}, status, error_code)" if c != "()" else "(status, error_code)" for c in dict.fromkeys(set_of.values()))}
            )
        """).to_pylist()
        every = [*cols, "run_id"]

        def grouping_id(grouped_by: list[str]) -> int:
            # GROUPING(a, b, ...): bit set for each column left out, the first the highest
            return sum(
                1 << (len(every) - 1 - k) for k, c in enumerate(every) if c not in grouped_by
            )

        for name in names:
            col = _KEY[name]
            cell_id = grouping_id([col, "run_id"] if col not in ("run_id", "'all'") else ["run_id"])
            group_id = grouping_id([] if name == "all" else [col])
            groups = out[name]
            for row in counted:
                if row["gid"] != cell_id:
                    continue
                cell = groups[label(name, row)].cells[row["run_id"]]
                cell.items, cell.documents = row["items"], row["documents"]
                cell.audio_items = row["audio_items"]
                cell.input_tokens, cell.output_tokens = int(row["i"] or 0), int(row["o"] or 0)
            for row in union:
                if row["gid"] != group_id:
                    continue
                g = groups[label(name, row)]
                if row["what"] == "items":
                    g.items = row["n"]
                elif row["what"] == "sources":
                    g.sources = row["n"]
                elif row["what"] == "ok":
                    g.succeeded += row["n"]
                else:
                    g.failed += row["n"]
                    g.errors[row["code"]] = g.errors.get(row["code"], 0) + row["n"]
        return out

    def runs(self) -> tuple[dict[str, float], dict[str, int]]:
        """Each run's busy seconds and items, over all its rows (not only those in scope)."""
        busy: dict[str, _Exact] = defaultdict(_Exact)
        for row in self.sql("""
            SELECT run_id, busy_s_e AS e, sum(busy_s_m)::VARCHAR AS m
            FROM L WHERE model_stage GROUP BY ALL
        """).to_pylist():
            busy[row["run_id"]].add(int(row["e"]), int(row["m"]))
        return {r: b.value() for r, b in busy.items()}, self.run_items

    def recorded(self) -> tuple[datetime | None, datetime | None]:
        row = self.sql(
            "SELECT min(recorded_at) AS a, max(recorded_at) AS b FROM L WHERE in_scope"
        ).to_pylist()[0]
        return row["a"], row["b"]

    def analytics_rows(self) -> list[dict[str, Any]]:
        """Result rows with call analytics, in scope, in read order."""
        return self.sql(
            "SELECT * FROM R WHERE in_scope AND analytics IS NOT NULL ORDER BY _ord"
        ).to_pylist()


def actor_units(summary: dict[str, Any]) -> float | None:
    """What one model actor of the run held (GPUs or CPU cores): the summary's
    ``accelerator_units``, or for summaries before it, its options' per-actor share."""
    units = summary.get("accelerator_units")
    if units is None:
        options = summary.get("options") or {}
        on_cpu = summary.get("accelerator") == "cpu" or summary.get("device") == "cpu"
        units = options.get("cpus_per_actor" if on_cpu else "gpus_per_actor")
    return float(units) if isinstance(units, int | float) and units > 0 else None


def _actor_seconds(ledger: pa.Table, summaries: dict[str, dict[str, Any]]) -> pa.Array:
    """Each ledger row's seconds in actor-seconds, as the run summary counts busy time: an
    actor running two model batches at once (``model_workers``) records each batch's seconds
    at its share of the actor's units, and summed whole they counted the actor twice (the
    report showed a run at 71% that its summary gave 36%, and a resumed one at 140%). A row
    without units, or of a run without a summary, keeps its seconds."""
    runs = sorted(summaries)
    whole = pa.array([actor_units(summaries[r]) for r in runs], pa.float64())
    # Column operations, not a Python loop: a ledger holds a row per item and stage.
    actor = pc.take(whole, pc.index_in(ledger["run_id"], value_set=pa.array(runs, pa.string())))
    seconds = _floats(pc.fill_null(ledger["seconds"], 0.0))
    share = _floats(ledger["units"]) / _floats(actor)
    ok = np.isfinite(share) & (share > 0)
    return pa.array(np.where(ok, seconds * share, seconds), pa.float64())


def _floats(column: Any) -> np.ndarray:
    """A float column as numpy, null as NaN."""
    return pc.cast(column, pa.float64()).to_numpy(zero_copy_only=False).astype(np.float64)


def _ratio(num: float, den: float, scale: float = 1.0) -> float | None:
    return num / den * scale if den else None


def _row(
    key: str,
    g: _Group,
    run_busy: dict[str, float],
    run_items: dict[str, int],
    summaries: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    cells = g.cells
    total = {name: _Exact() for name in ("cost", "audio_cost", "busy", "speech_busy", "audio")}
    for cell in cells.values():
        for name, exact in total.items():
            exact.merge(getattr(cell, name))
    reserved_s: list[float] = []
    reserved_cost: list[float] = []
    reserved_audio_cost: list[float] = []
    busy_summarized, speech_pipeline_s, audio_summarized = _Exact(), [], _Exact()
    any_audio_summarized = False
    for run, cell in cells.items():
        summary = summaries.get(run)
        if summary is None:
            continue
        busy = run_busy.get(run, 0.0)
        share = cell.busy.value() / busy if busy else cell.items / max(run_items.get(run, 1), 1)
        reserved_s.append(share * (summary.get("accelerator_reserved_seconds") or 0.0))
        cost = share * (summary.get("reserved_cost_usd") or 0.0)
        reserved_cost.append(cost)
        busy_summarized.merge(cell.busy)
        if summary.get("kind") != "process":
            reserved_audio_cost.append(cost)
            speech_pipeline_s.append(share * (summary.get("pipeline_seconds") or 0.0))
            audio_summarized.merge(cell.audio)
            any_audio_summarized = any_audio_summarized or cell.audio_items > 0
    audio_s = total["audio"].value()
    cost_usd = total["cost"].value()
    audio_cost = total["audio_cost"].value()
    audio_exact = _Exact()
    audio_exact.merge(total["cost"])
    # document cost = cost - audio cost, exactly (the audio rows' mantissas taken out)
    for e, m in total["audio_cost"].by_exp.items():
        audio_exact.by_exp[e] -= m
    document_cost = audio_exact.value()
    documents = sum(cell.documents for cell in cells.values())
    tokens_in = sum(cell.input_tokens for cell in cells.values())
    tokens_out = sum(cell.output_tokens for cell in cells.values())
    reserved = math.fsum(reserved_s)
    return {
        "group": key,
        "runs": len(cells),
        "items": g.items,
        "sources": g.sources,
        "succeeded": g.succeeded,
        "failed": g.failed,
        "audio_items": sum(cell.audio_items for cell in cells.values()),
        "audio_seconds": audio_s,
        "audio_hours": audio_s / 3600.0,
        "documents": documents,
        "input_tokens": tokens_in,
        "output_tokens": tokens_out,
        "cost_usd": cost_usd,
        "audio_cost_usd": audio_cost,
        "document_cost_usd": document_cost,
        "cost_per_audio_minute_usd": _ratio(audio_cost, audio_s / 60.0),
        "cost_per_document_usd": _ratio(document_cost, documents),
        "cost_per_million_tokens_usd": _ratio(document_cost, tokens_in + tokens_out, 1e6),
        "reserved_cost_usd": math.fsum(reserved_cost) if reserved_cost else None,
        # Over the audio of the runs whose reserved cost is known (a summary): a killed run's
        # audio over the others' reserved cost gave less per minute than busy cost.
        "reserved_cost_per_audio_minute_usd": _ratio(
            math.fsum(reserved_audio_cost), audio_summarized.value() / 60.0
        )
        if reserved_audio_cost
        else None,
        "accelerator_busy_hours": total["busy"].value() / 3600.0,
        "accelerator_reserved_hours": reserved / 3600.0 if reserved_s else None,
        "utilization": _ratio(busy_summarized.value(), reserved),
        "rtfx": _ratio(audio_summarized.value(), math.fsum(speech_pipeline_s))
        if any_audio_summarized
        else None,
        "busy_rtfx": _ratio(audio_s, total["speech_busy"].value()),
    }


REPORT_SCHEMA = pa.schema(
    [
        pa.field("group", pa.string()),
        pa.field("runs", pa.int64()),
        pa.field("items", pa.int64()),
        pa.field("sources", pa.int64()),
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


def _nothing_selected(sources: Sources, scope: Scope) -> str:
    """The one line of a report whose scope holds no row: which scope, over what was read."""
    where = []
    if scope.since is not None:
        where.append(f"since {stamp(scope.since)} UTC")
    if scope.until is not None:
        where.append(f"before {stamp(scope.until)} UTC")
    if scope.tenant is not None:
        where.append(f"of tenant {scope.tenant!r}")
    if not where:
        return "nothing to report: the outputs hold no ledger or result row"
    hint = (
        f" (--by tenant lists the tenants; --tenant {NONE_LABEL!r} selects items without one)"
        if scope.tenant is not None
        else ""
    )
    return f"nothing to report: no ledger or result row read is {' and '.join(where)}{hint}"


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
    engine = _Engine(sources, scope, by)
    names = list(dict.fromkeys([by, "day", "tenant", "run", "all"]))
    groupings = engine.groups(names)
    run_busy, run_items = engine.runs()

    def rows(name: str) -> list[dict[str, Any]]:
        groups = groupings[name]
        return [
            _row(key, groups[key], run_busy, run_items, sources.summaries) for key in sorted(groups)
        ]

    tables: dict[str, pa.Table] = {}
    label = "group" if by == "all" else by
    tables[f"by_{by}"] = _table(rows(by), label)
    failures = [
        {"group": key, "error_code": code, "items": count}
        for key in sorted(groupings[by])
        for code, count in sorted(groupings[by][key].errors.items())
    ]
    tables["failures"] = _table(failures, label, FAILURES_SCHEMA)
    for extra in ("day", "tenant", "run"):
        if extra != by:
            tables[f"by_{extra}"] = _table(rows(extra), extra)
    analysed = engine.analytics_rows()
    for extra in ("day", "tenant"):
        costs = {r[extra]: r["audio_cost_usd"] for r in tables[f"by_{extra}"].to_pylist()}
        calls = analytics_table(analysed, operator.itemgetter(_KEY[extra]), costs)
        if calls.num_rows:
            tables[f"call_analytics_by_{extra}"] = calls.rename_columns(
                [extra if n == "group" else n for n in calls.column_names]
            )
    totals = rows("all") or [_row("all", _Group(), run_busy, run_items, sources.summaries)]
    tables["totals"] = _table(totals, "group")
    first, last = engine.recorded()
    notes = []
    if not totals[0]["runs"] and not totals[0]["items"]:
        notes.append(_nothing_selected(sources, scope))
    if engine.duplicates:
        notes.append(
            f"{engine.duplicates} ledger rows given twice (the same output listed twice) were counted once"
        )
    if engine.forgotten:
        notes.append(
            f"{engine.forgotten} error row(s) that a later run redid (--retry-errors) count as "
            "failures of the run that wrote them, with the error code of its summary"
        )
    for run, n in sorted(engine.unplaced.items()):
        notes.append(
            f"run {run}: its summary counts {n} more failed item(s) than the report can place "
            "(error rows a later run redid, whose items have no ledger row of this run): they "
            "are not in its figures"
        )
    # A run whose summary was skipped had a warning saying so, not this note's guess.
    unsummarized = sorted(
        r for r in run_items if r not in sources.summaries and r not in sources.skipped
    )
    if unsummarized:
        notes.append(
            f"{len(unsummarized)} run(s) without a summary (killed before the end; their items were priced by a later run): "
            "their busy time is not in the utilization"
        )
    return Report(
        by, since, sources.outputs, tables, datetime.now(UTC), first, last, notes, until, tenant
    )
