"""Prices, cost apportioning, the cost ledger and run summaries (writing and reading the
datasets is ``jobs.dataset.commits``; ``read_results`` is imported here for the ledger's readers).

Stages measure (``jobs.run.stage`` writes each stage's time, resource and units into its rows);
this module only prices what they measured. The ledger is a pure function of the result
rows' timing columns, the plan's stages' costs (``Cost``: which columns are which ledger
stage) and the price table, so it can be recomputed and audited.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from overnight.jobs.dataset import storage
from overnight.jobs.dataset.commits import CommittedDataset
from overnight.schemas import COSTS, RUNS, SCHEMA_VERSION


@dataclass(frozen=True)
class Cost:
    """What a stage costs, as its record (``jobs.run.stage.Stage``) declares it: the ledger's
    name for it, the result columns its time is kept in, and what it holds while it runs.

    The runner writes the columns (``Stage.apply``); the ledger prices them.

    name: the ledger's stage ("transcribe").
    columns: the prefix of its result columns: ``<columns>_s`` (seconds), and, where the
    result schema has them, ``<columns>_resource`` and ``<columns>_units``; without them a
    row is priced as one unit of ``cpu``.
    resource: the price-table key of what each task or actor holds; None: the kind of GPU the
    actor finds (``workers.devices.detect_gpu_kind``).
    units: how many of ``resource`` that is (GPUs or CPU cores).
    timed_by_worker: the worker writes ``<columns>_s`` of each row itself, finer than the
    runner's time of the whole call can be: its share of a model batch, by audio or tokens,
    or the item's own fetch and decode. Otherwise the runner shares the call's time evenly.
    parts: ledger stages inside this one that the worker times into ``<part>_s``, priced at
    this stage's resource and units (the fetch inside decode and extract).
    bought: what its seconds bought, for the ledger's ``audio_s`` (the row's ``duration_s``)
    or ``input_tokens``/``output_tokens``; None: neither.
    model: the job's model stage (the actor pool): its seconds are the run's busy time.
    ``Stage.on_pool`` sets it; nothing else should.
    work: what its job is measured in (the ledger's ``work``: cost per audio minute or per
    document); None: audio where it bought audio, documents otherwise.
    """

    name: str
    columns: str
    resource: str | None = "cpu"
    units: float = 1.0
    timed_by_worker: bool = False
    parts: tuple[str, ...] = ()
    bought: Literal["audio", "tokens"] | None = "audio"
    model: bool = False
    work: Literal["audio", "documents"] | None = None

    @property
    def unit_of_work(self) -> Literal["audio", "documents"]:
        if self.work is not None:
            return self.work
        return "audio" if self.bought == "audio" else "documents"

    @property
    def seconds(self) -> str:
        return f"{self.columns}_s"

    @property
    def resource_column(self) -> str:
        return f"{self.columns}_resource"

    @property
    def units_column(self) -> str:
        return f"{self.columns}_units"

    def timings(self) -> tuple[tuple[str, str], ...]:
        """(ledger stage, seconds column) of each ledger stage it holds: its parts, then
        itself."""
        return (*((part, f"{part}_s") for part in self.parts), (self.name, self.seconds))


# What the ledger reads of a result row besides its stages' columns: who, and how much.
_WHO_AND_HOW_MUCH = (
    "item_id",
    "run_id",
    "tenant",
    "submission_id",
    "duration_s",
    "input_tokens",
    "output_tokens",
)


def columns(costs: Sequence[Cost]) -> list[str]:
    """The columns of a result row that ``build_ledger`` reads for these stages' costs."""
    read = [*_WHO_AND_HOW_MUCH]
    for cost in costs:
        read += [seconds for _, seconds in cost.timings()]
        read += [cost.resource_column, cost.units_column]
    return list(dict.fromkeys(read))


def price(prices: dict[str, float], resource: str | None) -> float:
    """USD per hour of one unit; an unknown accelerator is priced as the generic 'gpu'."""
    if resource is None:
        return 0.0
    if resource in prices:
        return prices[resource]
    return prices.get("gpu", 0.0) if resource != "cpu" else prices.get("cpu", 0.0)


def build_ledger(
    rows: list[dict[str, Any]], prices: dict[str, float], costs: Sequence[Cost]
) -> pa.Table:
    """One ledger row per item and ledger stage that consumed time (seconds not null)."""
    now = datetime.now(UTC)
    out = []
    for row in rows:
        for cost, (stage, seconds_col) in ((c, t) for c in costs for t in c.timings()):
            seconds = row.get(seconds_col)
            if seconds is None:
                continue
            # A result schema without the stage's resource or units column: one cpu unit.
            resource = row.get(cost.resource_column) or "cpu"
            units = float(row.get(cost.units_column) or 1.0)
            hourly = price(prices, resource)
            audio, tokens = cost.bought == "audio", cost.bought == "tokens"
            out.append(
                {
                    "item_id": row["item_id"],
                    "run_id": row["run_id"],
                    "tenant": row.get("tenant"),
                    "submission_id": row.get("submission_id"),
                    "stage": stage,
                    "resource": resource,
                    "units": units,
                    "seconds": float(seconds),
                    "price_per_hour_usd": hourly,
                    "cost_usd": float(seconds) * units * hourly / 3600.0,
                    "audio_s": row.get("duration_s") if audio else None,
                    "input_tokens": row.get("input_tokens") if tokens else None,
                    "output_tokens": row.get("output_tokens") if tokens else None,
                    "recorded_at": now,
                    # Its parts (the fetch inside decode) are not the model, and work for the
                    # same unit as it does.
                    "model_stage": cost.model and stage == cost.name,
                    "work": cost.unit_of_work,
                }
            )
    return pa.Table.from_pylist(out, schema=COSTS)


def catch_up(
    output: storage.Location, results_dir: str, prices: dict[str, float], costs: Sequence[Cost]
) -> pa.Table:
    """Write ledger rows for every result item of a flat (unpartitioned) output that has
    none yet; ``commits.publish`` prices partitioned rows as it publishes them.

    A killed run commits results without reaching its ledger step; the next run prices them,
    so every result row ends with its cost rows exactly once.
    """
    costs_loc = output.join("costs")
    results = CommittedDataset(output.join(results_dir)).read_results(
        columns(costs), flat_only=True
    )
    if results is None or results.num_rows == 0:
        return pa.Table.from_pylist([], schema=COSTS)
    priced = CommittedDataset(costs_loc).committed_ids()
    missing = [r for r in results.to_pylist() if r["item_id"] not in priced]
    ledger = build_ledger(missing, prices, costs)
    if ledger.num_rows:
        CommittedDataset(costs_loc).write_table(ledger)
    return ledger


def summarize_run(
    *,
    run_id: str,
    kind: str,
    rows: list[dict[str, Any]],
    ledger: pa.Table,
    listed: int,
    already_done: int,
    wall_s: float,
    pipeline_wall_s: float,
    model_actors: float,
    model_resource: str,
    model_units: float,
    prices: dict[str, float],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The run summary: counts, audio, busy vs reserved time, cost per unit."""
    mine = [r for r in ledger.to_pylist() if r["run_id"] == run_id]
    cost = sum(r["cost_usd"] for r in mine)
    # In actor-seconds: an actor running two model batches at once (model_workers) prices
    # each at half its units, so unit-weighting keeps busy <= reserved.
    busy_model_s = sum(
        r["seconds"] * (r["units"] or model_units) for r in mine if r["model_stage"]
    ) / (model_units or 1.0)
    cpu_cost = sum(r["cost_usd"] for r in mine if not r["model_stage"])
    # An actor that waits for work still holds its device: reserved = actors x wall.
    reserved_model_s = model_actors * pipeline_wall_s
    reserved_cost = (
        cpu_cost + reserved_model_s * model_units * price(prices, model_resource) / 3600.0
    )
    audio_s = sum(r.get("duration_s") or 0.0 for r in rows)
    errors = Counter(r["error_code"] for r in rows if r["status"] == "error")
    succeeded = sum(1 for r in rows if r["status"] == "ok")
    minutes = audio_s / 60.0
    summary = {
        "run_id": run_id,
        "kind": kind,
        "schema_version": SCHEMA_VERSION,
        "finished_at": datetime.now(UTC).isoformat(),
        "items_listed": listed,
        "items_already_done": already_done,
        "items": len(rows),
        "succeeded": succeeded,
        "failed": len(rows) - succeeded,
        "errors_by_code": dict(sorted(errors.items())),
        "audio_seconds": round(audio_s, 3),
        "wall_seconds": round(wall_s, 3),
        "pipeline_seconds": round(pipeline_wall_s, 3),
        "accelerator": model_resource,
        "accelerator_seconds": round(busy_model_s, 3),
        # What one actor holds (GPUs or CPU cores): the ledger's model rows carry each batch's
        # share of it, which ``report`` turns back into actor-seconds.
        "accelerator_units": model_units,
        "accelerator_reserved_seconds": round(reserved_model_s, 3),
        "utilization": round(busy_model_s / reserved_model_s, 4) if reserved_model_s else None,
        "cost_usd": round(cost, 8),
        "reserved_cost_usd": round(reserved_cost, 8),
        "cost_per_audio_minute_usd": round(cost / minutes, 8) if minutes else None,
        "reserved_cost_per_audio_minute_usd": round(reserved_cost / minutes, 8)
        if minutes
        else None,
        "rtfx": round(audio_s / pipeline_wall_s, 3) if pipeline_wall_s else None,
        "prices": prices,
    }
    tokens_in = sum(r.get("input_tokens") or 0 for r in rows)
    tokens_out = sum(r.get("output_tokens") or 0 for r in rows)
    if tokens_in or tokens_out:
        tokens = tokens_in + tokens_out
        summary.update(
            input_tokens=tokens_in,
            output_tokens=tokens_out,
            cost_per_document_usd=round(cost / len(rows), 8) if rows else None,
            reserved_cost_per_document_usd=round(reserved_cost / len(rows), 8) if rows else None,
            cost_per_million_tokens_usd=round(cost / tokens * 1e6, 6),
            reserved_cost_per_million_tokens_usd=round(reserved_cost / tokens * 1e6, 6),
            tokens_per_second=round(tokens / pipeline_wall_s, 2) if pipeline_wall_s else None,
        )
    summary.update(extra or {})
    return summary


# A run's figures that add up over its attempts (``earlier_attempts``): what reports take
# from summaries beside the ledger, whose rows of every attempt carry the run id.
ATTEMPT_SUMS = ("accelerator_reserved_seconds", "reserved_cost_usd", "pipeline_seconds")


def write_summary(
    output: storage.Location, summary: dict[str, Any], run_date: date | None = None
) -> str:
    """``runs/<run_id>.json``, and the run's row in the ``run_table/`` (one file a run, under
    its date's partition). A run id that already has a summary (a scheduled run's fixed id
    rerun with --retry-errors, a cluster job's retry, a user's reuse) is another attempt of
    that run: the earlier summaries go into this one's ``earlier_attempts``; replaced, their
    reserved time and cost left every report (25% utilization read as 42%). Returns the
    JSON's URL."""
    loc = output.join("runs", f"{summary['run_id']}.json")
    earlier = _earlier_attempts(loc, summary["run_id"])
    if earlier:
        summary["earlier_attempts"] = earlier
    storage.write_bytes_atomic(loc, json.dumps(summary, indent=2, sort_keys=True).encode())
    _write_run_row(output, summary, run_date or datetime.now(UTC).date())
    return loc.url()


def _earlier_attempts(loc: storage.Location, run_id: str) -> list[dict[str, Any]]:
    """The summaries of ``run_id``'s attempts so far, oldest first, from its summary file."""
    try:
        old = json.loads(storage.read_location(loc))
    except FileNotFoundError:
        return []
    except ValueError:  # not JSON: nothing of it can be kept
        return []
    if not isinstance(old, dict) or old.get("run_id") != run_id:
        return []
    before = [a for a in old.get("earlier_attempts") or [] if isinstance(a, dict)]
    return [*before, {k: v for k, v in old.items() if k != "earlier_attempts"}]


def with_attempts(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary with its ``ATTEMPT_SUMS`` over every attempt of its run id (itself when it
    has none), as a report counts a run. A figure that is not a number stays in the sum, for
    the report's checks to refuse it."""
    attempts = [a for a in summary.get("earlier_attempts") or [] if isinstance(a, dict)]
    if not attempts:
        return summary
    out = dict(summary)
    for key in ATTEMPT_SUMS:
        values = [s.get(key) for s in (summary, *attempts) if s.get(key) is not None]
        if values:
            try:
                out[key] = sum(values)
            except TypeError:
                out[key] = next(v for v in values if not isinstance(v, int | float))
    return out


def _write_run_row(output: storage.Location, summary: dict[str, Any], run_date: date) -> None:
    row = {name: summary.get(name) for name in RUNS.names}
    row["finished_at"] = datetime.fromisoformat(summary["finished_at"])
    row["summary_json"] = json.dumps(summary, sort_keys=True, default=str)
    table = pa.Table.from_pylist([row], schema=RUNS)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    part = output.join(
        "run_table", f"run_date={run_date.isoformat()}", f"{summary['run_id']}.parquet"
    )
    storage.write_bytes_atomic(part, sink.getvalue().to_pybytes())
