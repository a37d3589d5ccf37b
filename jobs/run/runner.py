"""The job runner: every overnight job runs through ``run(plan)``, once.

    claim the result dataset → publish what a killed run left staged → subtract what is
      committed (the done-index, for this input's ids only), apply max_items
      → start Ray, resolve ``auto`` device and pool (none of it when nothing is left to do)
      → record the manifest, hand Ray Data its blocks
      → task stages (map_batches) → model stage (actor pool, each batch committed with the
        run's provenance by ``jobs.run.committing.CommittingActor``; stages declared after it, such
        as redaction, run as Ray tasks on the batch before that commit)
      → execute (progress, one row per pending item; actors commit into a hidden staging
        area) → publish: staged commits compacted into OUTPUT/<dataset>/run_date=<date>/,
        priced into costs/ and added to the done-index (``jobs.dataset.commits.publish``)
      → duplicate repair and ledger catch-up of older, flat outputs
      → run summary (OUTPUT/runs/<run_id>.json)

A job is a plan factory (``jobs.transcribe``, ``jobs.process``, ``jobs.probe``): it lists the
records and declares its stages (``jobs.run.stage.Stage``: callable, contracts, placement, cost)
and result dataset; the ledger's stages are its stages' costs. The runner knows nothing about
audio, documents or models.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

import pyarrow as pa

from overnight.jobs.accounting import ledger
from overnight.jobs.dataset import commits, storage
from overnight.jobs.run import committing, on_ray, sizing
from overnight.jobs.run.stage import Stage, run_task
from overnight.jobs.spec import JobSpec
from overnight.workers.devices import resolve_device


@dataclass(frozen=True)
class Resolved:
    """What the runner resolved before the stages are built: the device and the pool."""

    device: str
    pool: sizing.Pool
    pending: int  # items this run will process (0: a no-op rerun, Ray never started)


@dataclass
class Build:
    """A plan's stages for one placement, and what the summary says about them."""

    # Each stage's ``placement`` says where it runs; in order within a placement.
    stages: list[Stage]
    model_resource: str  # price-table key of the model stage when no row names one
    model_units: float
    options: dict[str, Any]  # the summary's ``options``: the effective job options
    # JSON for the ``options`` column of rows whose worker does not report its own.
    row_options: str | None = None


@dataclass
class JobPlan:
    """Everything job-specific the runner needs."""

    spec: JobSpec
    kind: str  # the summary's ``kind``
    run_id: str
    dataset: str  # OUTPUT/<dataset>/: transcripts, results, probes
    schema: pa.Schema  # the result dataset's schema
    slim: Sequence[str]  # columns the driver gets back per committed row
    records: list[dict[str, Any]]  # every listed item, as ``manifest_schema`` rows
    manifest_schema: pa.Schema
    device: str  # auto | cpu | cuda
    size: Callable[[str, list[sizing.Node]], sizing.Pool]
    build: Callable[[Resolved], Build]
    rows_per_block: int = 8  # manifest rows per CPU task
    load_errors: tuple[type[BaseException], ...] = ()  # a model that cannot load: exit 5
    # The start-up line printed with progress, from the resolved pool.
    describe: Callable[[sizing.Pool], str] | None = None
    # Summary fields from this run's rows (counts, audio) and the listing.
    summary: Callable[[list[dict[str, Any]]], dict[str, Any]] = field(default=lambda rows: {})
    # Other datasets the stages commit to (OUTPUT/<name>/, schema), repaired like the result.
    side_datasets: Sequence[tuple[str, pa.Schema]] = ()
    # Error codes that record an upstream failure: a row of one of them is redone by any run
    # whose listing has the item fine now (a chained task once its transcript is there).
    upstream_codes: tuple[str, ...] = ()

    @functools.cached_property
    def costs(self) -> tuple[ledger.Cost, ...]:
        """What the ledger prices: the costs of the plan's stages. Their names and columns do
        not depend on where the stages run, so they are read off the stages as a run with
        nothing to do builds them (no Ray): a killed run's rows are priced at the claim,
        before this run has placed anything."""
        device = resolve_device(self.device, lambda: False)
        stages = self.build(Resolved(device, self.size(device, []), 0)).stages
        return tuple(s.cost for s in stages if s.cost is not None)


@dataclass
class Claimed:
    """What the runner knows before Ray starts: this run's claim and what is left to do."""

    dataset: storage.Location
    run_date: date
    token: str
    leftover: commits.Published  # a killed run's staged rows, published now
    todo: list[dict[str, Any]]  # listed items not committed yet
    pending: list[dict[str, Any]]  # those this run does (max_items)
    retried: int = 0  # error rows forgotten (``failures_to_redo``): their items are in todo


def claim_and_subtract(plan: JobPlan) -> Claimed:
    """Claim the dataset, finish what a killed run left staged, subtract what is done.

    Everything between the listing and Ray: what history can slow down (the done-index is
    read for this input's ids only; ``scripts/bench_history.py`` times it).
    """
    job = plan.spec.job
    output = storage.resolve(job.output)
    dataset = output.join(plan.dataset)
    token = commits.claim(dataset, plan.run_id)  # before reading what is committed: see claim
    # A killed run's staged commits (and any publish it left half done) go out first.
    leftover = commits.publish(
        dataset, plan.schema, plan.run_id, functools.partial(_price, output, plan)
    )
    commits.finish_forgetting(dataset)  # a killed run's retry of error rows
    todo, redo = left_to_do(plan, dataset)
    retried = commits.forget(dataset, redo)
    pending = todo[: job.max_items] if job.max_items is not None else todo
    run_date = job.run_date or datetime.now(UTC).date()
    return Claimed(dataset, run_date, token, leftover, todo, pending, len(retried))


def record_ids(record: dict[str, Any]) -> set[str]:
    """The ids under which a listed record's row may be committed: its own, and the id it
    had while its object was missing (``jobs.dataset.manifest``): a row recorded then is its row."""
    return {record["item_id"], record.get("missing_id") or record["item_id"]}


def left_to_do(
    plan: JobPlan, dataset: storage.Location
) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    """The listed records with no committed row once the error rows this run redoes are
    forgotten, and those rows (``failures_to_redo``). Reads only (the dry run asks too)."""
    done = commits.committed_ids(dataset, among={i for r in plan.records for i in record_ids(r)})
    redo = failures_to_redo(plan, dataset, done)
    done -= {i for rows in redo.values() for i in rows}
    return [r for r in plan.records if not record_ids(r) & done], redo


def failures_to_redo(
    plan: JobPlan, dataset: storage.Location, done: set[str]
) -> dict[str, list[str]]:
    """The error rows this run replaces, as ``commits.error_rows`` gives them (file -> item
    ids): rows of ``retry_errors``' codes, and rows of an upstream failure
    (``plan.upstream_codes``) whose item the listing has fine now. With ``max_items``, only
    as many as this run will do, so that a forgotten row is always replaced by the run that
    forgot it. Reads only (the dry run counts them too)."""
    job = plan.spec.job
    found: dict[str, set[str]] = defaultdict(set)
    asked: list[tuple[set[str], Sequence[str] | None]] = []
    if plan.upstream_codes:
        fine = {i for r in plan.records if r.get("status") != "error" for i in record_ids(r)}
        asked.append((done & fine, plan.upstream_codes))
    if job.retry_errors:
        asked.append((done, None if job.retry_errors == ["all"] else job.retry_errors))
    for among, codes in asked:
        for path, rows in commits.error_rows(dataset, among, codes).items():
            found[path].update(rows)
    failed = {i for rows in found.values() for i in rows}
    if job.max_items is not None:
        redo = [record_ids(r) & failed for r in plan.records if record_ids(r) & failed]
        waiting = sum(1 for r in plan.records if not record_ids(r) & done)
        keep = set().union(*redo[: max(0, job.max_items - waiting)])
        found = {p: rows & keep for p, rows in found.items()}
    return {p: sorted(rows) for p, rows in found.items() if rows}


def run(plan: JobPlan) -> dict[str, Any]:
    """Run the plan; returns the run summary (also written to OUTPUT/runs/<run_id>.json)."""
    started = time.monotonic()
    startup = on_ray.Startup()
    job, run_id = plan.spec.job, plan.run_id
    output = storage.resolve(job.output)
    claimed = claim_and_subtract(plan)
    dataset, run_date, token = claimed.dataset, claimed.run_date, claimed.token
    leftover, todo, pending = claimed.leftover, claimed.todo, claimed.pending
    price = functools.partial(_price, output, plan)
    startup.mark("list")

    if pending:
        on_ray.ensure_ray(job.ray_address, verbose=job.verbose)
        startup.mark("ray")
        device = resolve_device(plan.device, on_ray.cluster_has_gpu)
        nodes = sizing.nodes_of_cluster()
    else:  # nothing to do: no Ray at all (it would take most of a no-op rerun's time)
        device, nodes = resolve_device(plan.device, lambda: False), []
    pool = plan.size(device, nodes)
    if "actors" in pool.auto and 0 < len(pending) < pool.actors:
        # An actor beyond the pending items would get no work and still be started (a model
        # load, a GPU held and priced as reserved), and Ray Data warns about the pool.
        pool = dataclasses.replace(
            pool, actors=len(pending), basis=f"{pool.basis}, one per pending item"
        )
    if job.progress and pending and plan.describe is not None:
        print(f"[overnight] {plan.describe(pool)}", file=sys.stderr, flush=True)
    build = plan.build(Resolved(device, pool, len(pending)))

    outcome = on_ray.Outcome()
    progressive = _Progressive(
        functools.partial(commits.publish, dataset, plan.schema, run_id, price)
    )
    if pending:
        table = pa.Table.from_pylist(pending, schema=plan.manifest_schema)
        # At least one block per actor where the items allow it: 7 items in one block of 8
        # left the second actor of a pool idle (and Ray Data warned about it).
        per_block = max(1, min(plan.rows_per_block, math.ceil(len(pending) / pool.actors)))
        ds = on_ray.manifest_dataset(output, run_id, table, per_block)
        ds = _chain(
            ds,
            build.stages,
            dataset=dataset,
            into=commits.staging_dir(dataset, run_date, run_id),
            schema=plan.schema,
            slim=plan.slim,
            token=token,
            provenance=commits.Provenance(run_id, build.row_options),
        )
        startup.mark("manifest")
        outcome = on_ray.execute(
            ds,
            {r["item_id"] for r in pending},
            on_ray.Progress(len(pending), job.progress),
            plan.load_errors,
            on_rows=progressive,
        )

    rows = outcome.rows
    published = progressive.publish()
    repaired = commits.drop_duplicates(dataset, plan.schema, run_id) + published.duplicates_dropped
    # Side datasets (transcripts_unredacted) are flat, written by their stage directly.
    for name, schema in plan.side_datasets:
        commits.drop_duplicates(output.join(name), schema, run_id)
    # Published rows are priced as they are published; catch_up prices the flat files of an
    # output written before partitions.
    costs = pa.concat_tables(
        [
            ledger.catch_up(output, plan.dataset, plan.spec.prices, plan.costs),
            *leftover.derived,
            *published.derived,
        ],
        promote_options="default",
    )
    # What the model stage's rows say it ran on (the GPU its actors found).
    model_cost = next(s.cost for s in build.stages if s.placement == "model")
    column = model_cost.resource_column if model_cost is not None else None
    resource = next((r[column] for r in rows if column and r.get(column)), None)
    summary = ledger.summarize_run(
        run_id=run_id,
        kind=plan.kind,
        rows=rows,
        ledger=costs,
        listed=len(plan.records),
        already_done=len(plan.records) - len(todo),
        wall_s=time.monotonic() - started,
        pipeline_wall_s=outcome.pipeline_s,
        model_actors=pool.actors if pending else 0,
        model_resource=resource or build.model_resource,
        model_units=build.model_units,
        prices=plan.spec.prices,
        extra={
            **plan.summary(rows),
            "output": storage.scrub_secrets(job.output),
            "device": device,
            "duplicates_removed": repaired,
            "errors_retried": claimed.retried,
            "startup": startup.report(outcome),
            "options": build.options,
            plan.dataset: dataset.url(),
            "costs": output.join("costs").url(),
        },
    )
    summary["summary_path"] = ledger.write_summary(output, summary, run_date)
    return summary


def run_task_stages(plan: JobPlan, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The plan's task stages before its model stage, placed as ``run`` places them, over
    ``records`` (``plan.manifest_schema`` rows); their output rows, one per record, come back
    to the driver and nothing is committed. For work that several plans share: a document
    job of several tasks fetches and extracts each document once for all of them
    (``jobs.process``)."""
    import ray

    if not records:
        return []
    job = plan.spec.job
    on_ray.ensure_ray(job.ray_address, verbose=job.verbose)
    device = resolve_device(plan.device, on_ray.cluster_has_gpu)
    pool = plan.size(device, sizing.nodes_of_cluster())
    stages = plan.build(Resolved(device, pool, len(records))).stages
    before = [s for s in stages if s.placement == "before"]
    table = pa.Table.from_pylist(records, schema=plan.manifest_schema)
    per_block = plan.rows_per_block
    blocks = [table.slice(i, per_block) for i in range(0, table.num_rows, per_block)]
    ds = _map_tasks(ray.data.from_blocks(blocks), before)
    progress = on_ray.Progress(len(records), job.progress)
    return on_ray.execute(ds, {r["item_id"] for r in records}, progress, plan.load_errors).rows


class _Progressive:
    """Publishes during a long run, every ``commits.PUBLISH_EVERY_ROWS`` rows or
    ``commits.PUBLISH_EVERY_S`` seconds, so its rows reach readers before it ends; the
    run's last ``publish()`` adds up what each one published."""

    def __init__(self, publish: Callable[[], commits.Published]):
        self._publish = publish
        self._total = commits.Published()
        self._rows_at, self._time_at = 0, time.monotonic()

    def __call__(self, rows: int) -> None:
        due = time.monotonic() - self._time_at >= commits.PUBLISH_EVERY_S
        if rows - self._rows_at >= commits.PUBLISH_EVERY_ROWS or due:
            self.publish()
            self._rows_at, self._time_at = rows, time.monotonic()

    def publish(self) -> commits.Published:
        done = self._publish()
        self._total.rows += done.rows
        self._total.duplicates_dropped += done.duplicates_dropped
        self._total.derived += done.derived
        return self._total


def _price(
    output: storage.Location, plan: JobPlan, rows: pa.Table
) -> tuple[storage.Location, pa.Table]:
    """The cost ledger rows of rows being published, for ``commits.publish``."""
    wanted = [c for c in ledger.columns(plan.costs) if c in rows.column_names]
    priced = ledger.build_ledger(rows.select(wanted).to_pylist(), plan.spec.prices, plan.costs)
    return output.join("costs"), priced


def _chain(
    ds: Any,
    stages: list[Stage],
    *,
    dataset: storage.Location,
    into: storage.Location,
    schema: pa.Schema,
    slim: Sequence[str],
    token: str,
    provenance: commits.Provenance,
) -> Any:
    """The stages as ``map_batches`` calls: tasks, then the committing model stage, whose
    actor runs the stages after it on each batch as Ray tasks before committing."""
    import ray

    models = [s for s in stages if s.placement == "model"]
    if len(models) != 1:
        raise ValueError("a plan has one model stage (an actor pool)")
    model = models[0]
    ds = _map_tasks(ds, [s for s in stages if s.placement == "before"])
    calls = model.calls_per_actor
    return ds.map_batches(
        committing.CommittingActor,
        fn_constructor_kwargs={
            "make_worker": model.start,
            "dataset": dataset,
            "into": into,
            "schema": schema,
            "slim": slim,
            "token": token,
            "provenance": provenance,
            "after": tuple(s for s in stages if s.placement == "after"),
        },
        batch_format="pyarrow",
        batch_size=model.rows_per_call,
        # Several calls at once per actor: the worker batches their work together, so the
        # model starts on the first rows instead of waiting for a whole big call.
        compute=ray.data.ActorPoolStrategy(
            size=model.actors,
            max_concurrent_calls_per_actor=calls,
            enable_true_multi_threading=calls > 1,
            max_tasks_in_flight_per_actor=2 * calls,
        ),
        **model.resources(),
    )


def _map_tasks(ds: Any, stages: Sequence[Stage]) -> Any:
    """Task stages as ``map_batches`` calls, in order, each batch checked (``run_task``)."""
    for stage in stages:
        ds = ds.map_batches(
            run_task,
            fn_kwargs={"stage": stage},
            batch_format="pyarrow",
            batch_size=stage.rows_per_call,
            **stage.resources(),
        )
    return ds
