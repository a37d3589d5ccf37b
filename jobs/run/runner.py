"""The job runner: every overnight job runs through ``run(job)``, once.

    prepare the job: list its input, check its output and model (``Job.prepare``)
    → claim the result dataset → publish what a killed run left staged → subtract what is
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

A job is a ``jobs.run.job.Job`` (``jobs.transcribe``, ``jobs.process``, ``jobs.probe``): it
lists the records, declares its stages (``jobs.run.stage.Stage``: callable, contracts,
placement, cost) and result dataset, and adds its kind's summary fields; the ledger's stages
are its stages' costs. The runner knows nothing about audio, documents or models.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

import pyarrow as pa

from overnight.jobs.accounting import ledger
from overnight.jobs.dataset import commits, storage
from overnight.jobs.errors import ConfigError
from overnight.jobs.run import committing, console, metrics, on_ray, sizing
from overnight.jobs.run.job import Build, Job, P, Prepared, Resolved
from overnight.jobs.run.stage import Stage, run_task
from overnight.workers.devices import resolve_device

__all__ = ["Build", "Claimed", "Job", "Prepared", "Resolved", "costs", "run", "run_task_stages"]

# What ``commits.publish`` prices published rows with: rows in, (costs/, ledger rows) out.
Pricer = Callable[[pa.Table], tuple[storage.Location, pa.Table]]


def costs(job: Job[P], prepared: P) -> tuple[ledger.Cost, ...]:
    """What the ledger prices: the costs of the job's stages. Their names and columns do not
    depend on where the stages run, so they are read off the stages as a run with nothing to
    do builds them (no Ray): a killed run's rows are priced at the claim, before this run has
    placed anything."""
    device = resolve_device(job.device, lambda: False)
    stages = job.stages(Resolved(device, job.pool(device, []), 0), prepared).stages
    return tuple(s.cost for s in stages if s.cost is not None)


@dataclass
class Claimed:
    """What the runner knows before Ray starts: this run's claim and what is left to do."""

    dataset: commits.CommittedDataset
    run_date: date
    token: str
    costs: tuple[ledger.Cost, ...]  # what the ledger prices (``costs``)
    price: Pricer  # prices rows as they are published
    leftover: commits.Published  # a killed run's staged rows, published now
    todo: list[dict[str, Any]]  # listed items not committed yet
    pending: list[dict[str, Any]]  # those this run does (max_items)
    retried: int = 0  # error rows forgotten (``failures_to_redo``): their items are in todo


def claim_and_subtract(job: Job[P], prepared: P) -> Claimed:
    """Claim the dataset, finish what a killed run left staged, subtract what is done.

    Everything between the listing and Ray: what history can slow down (the done-index is
    read for this input's ids only; ``scripts/bench_history.py`` times it).
    """
    settings = job.spec.job
    output = storage.resolve(settings.output)
    dataset = commits.CommittedDataset(output.join(job.dataset))
    token = dataset.claim(job.run_id)  # before reading what is committed: see claim
    priced = costs(job, prepared)
    price = functools.partial(_price, output, job.spec.prices, priced, job.dataset)
    # A killed run's staged commits (and any publish it left half done) go out first.
    leftover = dataset.publish(job.schema, job.run_id, price)
    dataset.finish_forgetting()  # a killed run's retry of error rows
    todo, redo = left_to_do(job, prepared, dataset)
    retried = dataset.forget(redo)
    pending = todo[: settings.max_items] if settings.max_items is not None else todo
    run_date = settings.run_date or datetime.now(UTC).date()
    return Claimed(dataset, run_date, token, priced, price, leftover, todo, pending, len(retried))


def _cluster_gpu(job: Job[Any]) -> bool:
    """``device = "auto"``'s question on the driver: a GPU in the Ray cluster now, or, on a
    cluster this process joined, a spec that places its actors on GPUs. With GPU nodes that
    start from zero the cluster has none when the job starts, and the model ran on the GPU
    nodes' CPUs (or on the CPU group, never scaling a GPU) while they were billed."""
    if on_ray.cluster_has_gpu():
        return True
    if on_ray.local_run(job.spec.job.ray_address):
        return False
    if job.asks_for_gpu():
        return True
    console.event(
        "no_gpu",
        "the Ray cluster has no GPU now, so device auto runs the model on CPU; if its GPU "
        'nodes start on demand (KubeRay from zero), set device = "cuda" (or gpus_per_actor = 1)',
        level="warning",
    )
    return False


def record_ids(record: dict[str, Any]) -> set[str]:
    """The ids under which a listed record's row may be committed: its own, the id it
    had while its object was missing (``jobs.dataset.manifest``): a row recorded then is its
    row, and those it ``replaces`` (a call's rows of its earlier, failed transcripts:
    ``jobs.documents.transcript_records``)."""
    return {
        record["item_id"],
        record.get("missing_id") or record["item_id"],
        *(record.get("replaces") or ()),
    }


def left_to_do(
    job: Job[P], prepared: P, dataset: commits.CommittedDataset
) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    """The listed records with no committed row once the error rows this run redoes are
    forgotten, and those rows (``failures_to_redo``). Reads only (the dry run asks too)."""
    records = prepared.records
    done = dataset.committed_ids(among={i for r in records for i in record_ids(r)})
    redo = failures_to_redo(job, prepared, dataset, done)
    done -= {i for rows in redo.values() for i in rows}
    return [r for r in records if not record_ids(r) & done], redo


def failures_to_redo(
    job: Job[P], prepared: P, dataset: commits.CommittedDataset, done: set[str]
) -> dict[str, list[str]]:
    """The error rows this run replaces, as ``commits.error_rows`` gives them (file -> item
    ids): rows of ``retry_errors``' codes, and rows of an upstream failure
    (``Prepared.upstream_codes``) whose item the listing has fine now. With ``max_items``,
    only as many as this run will do, so that a forgotten row is always replaced by the run
    that forgot it. Reads only (the dry run counts them too)."""
    settings, records = job.spec.job, prepared.records
    found: dict[str, set[str]] = defaultdict(set)
    asked: list[tuple[set[str], Sequence[str] | None]] = []
    if prepared.upstream_codes:
        fine = {i for r in records if r.get("status") != "error" for i in record_ids(r)}
        asked.append((done & fine, prepared.upstream_codes))
    if settings.retry_errors:
        asked.append((done, None if settings.retry_errors == ["all"] else settings.retry_errors))
    for among, codes in asked:
        for path, rows in dataset.error_rows(among, codes).items():
            found[path].update(rows)
    failed = {i for rows in found.values() for i in rows}
    if settings.max_items is not None:
        redo = [record_ids(r) & failed for r in records if record_ids(r) & failed]
        waiting = sum(1 for r in records if not record_ids(r) & done)
        keep = set().union(*redo[: max(0, settings.max_items - waiting)])
        found = {p: rows & keep for p, rows in found.items()}
    return {p: sorted(rows) for p, rows in found.items() if rows}


def _within_nodes(pool: sizing.Pool, nodes: list[sizing.Node], address: str | None) -> sizing.Pool:
    """The pool as this machine's Ray can hold it. Given by hand, an actor larger than every
    node never started and the run waited forever; more actors than fit were priced as
    reserved in full (1,000 actors on 2 cores: 17,478 s reserved in a 26 s run). On a
    cluster the autoscaler may add nodes, so there the pool stays as asked."""
    fit = sizing.actors_that_fit(pool, nodes)
    if not nodes or fit >= pool.actors or not on_ray.local_run(address):
        return pool
    if fit == 0:
        largest = max(nodes, key=lambda n: (n.cpus, n.gpus))
        if pool.gpus_per_actor > 0 and not any(n.gpus for n in nodes):
            raise ConfigError(
                f"device: the job runs its model on a GPU (cuda, {pool.gpus_per_actor:g} per "
                "actor), and this machine's Ray has no GPU; use --device cpu (device = "
                '"cpu"), or --device auto to take a GPU only where there is one; nothing was run'
            )
        raise ConfigError(
            f"one model actor takes {pool.cpus_per_actor:g} CPU and {pool.gpus_per_actor:g} GPU, "
            f"more than this machine's Ray can give the model beside the decode tasks "
            f"({sizing.model_share(largest.cpus):g} of its {largest.cpus:g} CPUs, "
            f"{largest.gpus:g} GPUs): lower cpus_per_actor / gpus_per_actor, or leave them out "
            "to size the pool from the machine; nothing was run"
        )
    return dataclasses.replace(
        pool, actors=fit, basis=f"{pool.basis}; {fit} of the {pool.actors} actors asked fit"
    )


def run(job: Job[P], prepared: P | None = None) -> dict[str, Any]:
    """Run the job; returns the run summary (also written to OUTPUT/runs/<run_id>.json).
    ``prepared``: what ``job.prepare`` returned, when the caller prepared it (``jobs.process``
    reads the documents of several tasks once); else the runner prepares it."""
    started = time.monotonic()
    startup = on_ray.Startup()
    if prepared is None:
        prepared = job.prepare(dry=False)
    settings, run_id = job.spec.job, job.run_id
    output = storage.resolve(settings.output)
    claimed = claim_and_subtract(job, prepared)
    dataset, run_date, token = claimed.dataset, claimed.run_date, claimed.token
    leftover, todo, pending = claimed.leftover, claimed.todo, claimed.pending
    startup.mark("list")

    if pending:
        on_ray.ensure_ray(settings.ray_address, verbose=settings.verbose)
        startup.mark("ray")
        device = resolve_device(job.device, lambda: _cluster_gpu(job))
        nodes = sizing.nodes_of_cluster()
    else:  # nothing to do: no Ray at all (it would take most of a no-op rerun's time)
        device, nodes = resolve_device(job.device, lambda: False), []
    pool = job.pool(device, nodes)
    if "actors" in pool.auto and 0 < len(pending) < pool.actors:
        # An actor beyond the pending items would get no work and still be started (a model
        # load, a GPU held and priced as reserved), and Ray Data warns about the pool.
        pool = dataclasses.replace(
            pool, actors=len(pending), basis=f"{pool.basis}, one per pending item"
        )
    pool = _within_nodes(pool, nodes, settings.ray_address) if pending else pool
    described = job.describe(pool)
    if settings.progress and pending and described is not None:
        console.event("start", described, run_id=job.run_id, kind=job.kind, pending=len(pending))
    build = job.stages(Resolved(device, pool, len(pending)), prepared)

    outcome = on_ray.Outcome()
    progressive = _Progressive(
        functools.partial(dataset.publish, job.schema, run_id, claimed.price)
    )
    if pending:
        table = pa.Table.from_pylist(pending, schema=job.manifest_schema)
        # At least two blocks per actor where the items allow it: 7 items in one block of 8
        # left the second actor of a pool idle (and Ray Data warned about it), and a short
        # job's first model call waits for its rows' decode, which two tasks do at once.
        per_block = max(1, min(job.rows_per_block, math.ceil(len(pending) / (2 * pool.actors))))
        ds = on_ray.manifest_dataset(output, run_id, table, per_block)
        ds = _chain(
            ds,
            build.stages,
            dataset=dataset,
            into=dataset.staging_dir(run_date, run_id),
            schema=job.schema,
            slim=job.slim,
            token=token,
            provenance=commits.Provenance(run_id, build.row_options),
        )
        startup.mark("manifest")
        outcome = on_ray.execute(
            ds,
            {r["item_id"] for r in pending},
            on_ray.Progress(len(pending), settings.progress),
            job.load_errors,
            on_rows=progressive,
        )

    rows = outcome.rows
    published = progressive.publish()
    repaired = dataset.drop_duplicates(job.schema, run_id) + published.duplicates_dropped
    # Side datasets (transcripts_unredacted) are flat, written by their stage directly.
    for name, schema in job.side_datasets:
        commits.CommittedDataset(output.join(name)).drop_duplicates(schema, run_id)
    # Published rows are priced as they are published; catch_up prices the flat files of an
    # output written before partitions.
    priced = pa.concat_tables(
        [
            ledger.catch_up(output, job.dataset, job.spec.prices, claimed.costs),
            *leftover.derived,
            *published.derived,
        ],
        promote_options="default",
    )
    # What the model stage's rows say it ran on (the GPU its actors found).
    model_cost = next(s.cost for s in build.stages if s.placement == "model")
    column = model_cost.resource_column if model_cost is not None else None
    resource = next((r[column] for r in rows if column and r.get(column)), None)
    listed = len(prepared.records)
    pooled = sizing.record(pool)
    options = {**build.options, **pooled}
    changed = options_changed(output, job, options, pooled) if listed > len(todo) else {}
    summary = ledger.summarize_run(
        run_id=run_id,
        kind=job.kind,
        rows=rows,
        ledger=priced,
        listed=listed,
        already_done=listed - len(todo),
        wall_s=time.monotonic() - started,
        pipeline_wall_s=outcome.pipeline_s,
        model_actors=pool.actors if pending else 0,
        model_resource=resource or build.model_resource or ("gpu" if device == "cuda" else "cpu"),
        model_units=build.model_units,
        prices=job.spec.prices,
        extra={
            **job.summarize(rows, prepared),
            "output": storage.scrub_secrets(settings.output),
            "device": device,
            "duplicates_removed": repaired,
            "errors_retried": claimed.retried,
            "startup": startup.report(outcome),
            "options": options,
            **({"done_with_other_options": changed} if changed else {}),
            job.dataset: dataset.location.url(),
            "costs": output.join("costs").url(),
        },
    )
    summary["summary_path"] = ledger.write_summary(output, summary, run_date)
    return summary


# How many of the newest run summaries (by name: a default run id starts with its UTC time)
# are read for the options of the run before: one listing and this many small reads.
RECENT_SUMMARIES = 50


def options_changed(
    output: storage.Location, job: Job[Any], options: dict[str, Any], pool: dict[str, Any]
) -> dict[str, list[Any]]:
    """The options that shape a row and differ between this run and the newest earlier run
    of its kind that wrote rows to this output: ``{name: [then, now]}``. Done items keep
    the rows that run wrote (a rerun never redoes them), so a rerun with ``--diarize`` after
    a plain run changed nothing and said nothing; the summary now says which options the
    done items' rows were not written with. The pool's fields and ``job.pacing_options``
    never change a row and are left out. Best effort: an unreadable summary is skipped."""
    try:
        files = storage.list_files(output.join("runs"), ".json")
    except Exception:  # a notice must not fail a run whose work is done
        return {}
    stamp = re.compile(r"\d{8}T\d{6}Z")

    def key(path: str) -> str:
        found = stamp.search(path.rsplit("/", 1)[-1])
        return found.group(0) if found else ""

    newest = sorted(files, key=key)[-RECENT_SUMMARIES:]

    def read(path: str) -> list[dict[str, Any]]:
        try:
            summary = json.loads(output.fs.cat_file(path))
        except Exception:  # a notice: an unreadable summary is skipped
            return []
        if not isinstance(summary, dict):
            return []
        return [s for s in summary.get("stages") or [summary] if isinstance(s, dict)]

    earlier = [
        s
        for runs in storage.map_threads(read, newest)
        for s in runs
        if s.get("kind") == job.kind and s.get("items") and s.get("run_id") != job.run_id
    ]
    if not earlier:
        return {}
    then = max(earlier, key=lambda s: str(s.get("finished_at") or "")).get("options") or {}
    skip = {*pool, "auto", *job.pacing_options}
    return {
        name: [then.get(name), value]
        for name, value in sorted(options.items())
        if name not in skip and name in then and then[name] != _jsonable(value)
    }


def _jsonable(value: Any) -> Any:
    """``value`` as a summary's JSON holds it (tuples as lists...)."""
    return json.loads(json.dumps(value, default=str))


def run_task_stages(
    job: Job[P], prepared: P, records: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The job's task stages before its model stage, placed as ``run`` places them, over
    ``records`` (``job.manifest_schema`` rows); their output rows, one per record, come back
    to the driver and nothing is committed. For work that several jobs share: a document
    job of several tasks fetches and extracts each document once for all of them
    (``jobs.process``)."""
    import ray

    if not records:
        return []
    settings = job.spec.job
    on_ray.ensure_ray(settings.ray_address, verbose=settings.verbose)
    device = resolve_device(job.device, lambda: _cluster_gpu(job))
    pool = job.pool(device, sizing.nodes_of_cluster())
    stages = job.stages(Resolved(device, pool, len(records)), prepared).stages
    before = [s for s in stages if s.placement == "before"]
    table = pa.Table.from_pylist(records, schema=job.manifest_schema)
    per_block = job.rows_per_block
    blocks = [table.slice(i, per_block) for i in range(0, table.num_rows, per_block)]
    ds = _map_tasks(ray.data.from_blocks(blocks), before)
    progress = on_ray.Progress(len(records), settings.progress)
    return on_ray.execute(ds, {r["item_id"] for r in records}, progress, job.load_errors).rows


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
    output: storage.Location,
    prices: dict[str, float],
    costs: tuple[ledger.Cost, ...],
    dataset: str,
    rows: pa.Table,
) -> tuple[storage.Location, pa.Table]:
    """The cost ledger rows of rows being published, for ``commits.publish``; counted in the
    run's metrics as they are priced."""
    wanted = [c for c in ledger.columns(costs) if c in rows.column_names]
    priced = ledger.build_ledger(rows.select(wanted).to_pylist(), prices, costs)
    metrics.record_priced(dataset, priced)
    return output.join("costs"), priced


def _chain(
    ds: Any,
    stages: list[Stage],
    *,
    dataset: commits.CommittedDataset,
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
        raise ValueError("a job has one model stage (an actor pool)")
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
