"""The committed-Parquet protocol, in one place: claim, commit, read, committed ids,
duplicate repair, and the committing actor that adds a row's run provenance.

A result dataset (transcripts/, results/, probes/, costs/) is a folder of Parquet files, each
named by the hash of its item ids and appearing atomically (rename on local disks, a single
PUT on object stores). So "committed" is exactly "in a file under the folder": the driver
subtracts it *before* starting (for totals, progress and the manifest), a retried task
rewrites the same file name instead of adding a second copy, and no pending-file cleanup is
needed. One writer per dataset (``claim``); an item a dying writer still committed twice is
repaired at the end of every run (``drop_duplicates``).
"""

from __future__ import annotations

import hashlib
import io
import json
import posixpath
import secrets
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from overnight.jobs import storage
from overnight.jobs.errors import Superseded

if TYPE_CHECKING:
    from overnight.jobs.stage import Stage


def write_table(dataset: storage.Location, table: pa.Table) -> str:
    """Commit one Parquet file, named by its content's item ids, atomically."""
    digest = hashlib.sha256(
        "\n".join(sorted(set(table["item_id"].to_pylist()))).encode()
    ).hexdigest()[:24]
    loc = dataset.join(f"part-{digest}.parquet")
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    storage.write_bytes_atomic(loc, buf.getvalue())
    return loc.url()


def read_results(
    dataset: storage.Location, columns: list[str] | None = None, run_id: str | None = None
) -> pa.Table | None:
    """Read a result dataset (transcripts/, results/, probes/) written by overnight."""
    files = storage.list_files(dataset, ".parquet")
    if not files:
        return None

    def read(path: str) -> pa.Table:
        with dataset.fs.open(path, "rb") as f:
            pf = pq.ParquetFile(f)
            cols = None if columns is None else [c for c in columns if c in pf.schema_arrow.names]
            return pf.read(columns=cols)

    table = pa.concat_tables(storage.map_threads(read, files), promote_options="default")
    if run_id is not None:
        table = table.filter(pc.equal(table["run_id"], run_id))
    return table


def committed_files(dataset: storage.Location) -> dict[str, list[str]]:
    """The complete Parquet files of a result dataset and the item ids each holds.

    Files appear atomically (see ``storage.write_bytes_atomic``), so every file listed is a
    commit; an unreadable one would be a bug and is reported, not skipped.
    """
    files = storage.list_files(dataset, ".parquet")

    def read(path: str) -> list[str]:
        with dataset.fs.open(path, "rb") as f:
            return pq.read_table(f, columns=["item_id"]).column("item_id").to_pylist()

    return dict(zip(files, storage.map_threads(read, files), strict=True)) if files else {}


def committed_ids(dataset: storage.Location) -> set[str]:
    """Item ids in the complete Parquet files of a result dataset."""
    return {i for ids in committed_files(dataset).values() for i in ids}


# One writer per result dataset. A driver that dies (killed, node lost) leaves its Ray
# actors running for a few seconds until they notice; one that finishes its batch meanwhile
# would commit items the next run has already listed as missing: the same item twice.


def claim_file(dataset: storage.Location) -> storage.Location:
    """OUTPUT/_claims/<dataset>.json: beside the dataset, so its folder holds only Parquet."""
    parent, name = posixpath.split(dataset.path.rstrip("/"))
    return storage.Location(
        dataset.fs, posixpath.join(parent, "_claims", f"{name}.json"), dataset.scheme
    )


def claim(dataset: storage.Location, run_id: str) -> str:
    """Make this run the only writer of ``dataset``; returns the token its commits carry.

    Call before listing what is committed: any writer of an earlier run that is still alive
    fails its next commit (``check_claim``) instead of adding rows this run will also write.
    """
    token = f"{run_id}:{secrets.token_hex(8)}"  # fresh per attempt: a rerun may reuse run_id
    body = json.dumps({"run_id": run_id, "token": token, "claimed_at": time.time()})
    storage.write_bytes_atomic(claim_file(dataset), body.encode())
    return token


def check_claim(dataset: storage.Location, token: str) -> None:
    """Raise ``Superseded`` unless the run holding ``token`` is still the dataset's writer."""
    try:
        current = json.loads(storage.read_location(claim_file(dataset)))
    except FileNotFoundError:
        current = {}
    if current.get("token") != token:
        raise Superseded(
            f"a later run ({current.get('run_id', 'unknown')}) took over "
            f"{storage.redact(dataset.url())}; this run stopped before writing an item twice. "
            "Its finished items are kept. Run one job per output at a time."
        )


def drop_duplicates(dataset: storage.Location, schema: pa.Schema, keep_run: str) -> int:
    """Leave one row per item in ``dataset``; returns how many rows were removed.

    The claim closes the window in which a dying run's writer can commit late, but cannot
    close it entirely (a writer may pass its check just before the new claim). Every run
    ends with this repair: an item with rows in several files keeps the row of ``keep_run``
    (the run whose summary counts it), else the one in the first file by name. A file that
    loses rows is rewritten under its new content name before the old one is deleted, so a
    crash in between leaves a duplicate for the next run to repair, never a loss.
    """
    files = committed_files(dataset)
    where: dict[str, list[str]] = defaultdict(list)
    for path, ids in files.items():
        for item in ids:
            where[item].append(path)
    doubled = {item: paths for item, paths in where.items() if len(paths) > 1}
    if not doubled:
        return 0
    tables = {
        path: _read_part(dataset, path)
        for path in sorted({p for ps in doubled.values() for p in ps})
    }
    runs = {
        path: dict(zip(t["item_id"].to_pylist(), t["run_id"].to_pylist(), strict=True))
        for path, t in tables.items()
    }
    drop: dict[str, set[str]] = defaultdict(set)  # path -> item ids to remove there
    for item, paths in doubled.items():
        mine = [p for p in sorted(paths) if runs[p][item] == keep_run]
        keeper = (mine or sorted(paths))[0]
        for p in paths:
            if p != keeper:
                drop[p].add(item)
    removed = 0
    for path, items in drop.items():
        table = tables[path]
        rest = table.filter(pc.invert(pc.is_in(table["item_id"], pa.array(sorted(items)))))
        if rest.num_rows:
            # A file of an older schema version keeps its own schema (and version): readers
            # take both, and a cast cannot add fields to the nested structs of older rows.
            same = rest.schema.remove_metadata().equals(schema.remove_metadata())
            write_table(dataset, rest.select(schema.names).cast(schema) if same else rest)
        storage.delete(storage.Location(dataset.fs, path, dataset.scheme))
        removed += table.num_rows - rest.num_rows
    return removed


def _read_part(dataset: storage.Location, path: str) -> pa.Table:
    with dataset.fs.open(path, "rb") as f:
        return pq.read_table(f)


def commit(
    table: pa.Table, dataset: storage.Location, schema: pa.Schema, slim: Sequence[str]
) -> pa.Table:
    """Validate against the schema, write one file atomically, return the slim rows."""
    table = table.select(schema.names).cast(schema)
    ids = table["item_id"].to_pylist()
    if len(set(ids)) != len(ids):
        raise RuntimeError("a batch holds the same item twice: the manifest must have unique ids")
    write_table(dataset, table)
    return table.select(list(slim))


@dataclass(frozen=True)
class Provenance:
    """The run's columns of every committed row, added here once for every job: workers
    return only their own columns (and the model, options and worker they know)."""

    run_id: str
    # JSON of the job's effective options, for rows whose worker does not report its own.
    options: str | None = None


# Manifest columns renamed on a result row; every other column a result schema shares with
# the stage's input (tenant, metadata, channel_labels, ...) is copied as it is.
_SOURCE = {"source_uri": "uri", "source_size": "size", "source_etag": "etag"}


def with_provenance(
    inputs: pa.Table, produced: pa.Table, schema: pa.Schema, provenance: Provenance
) -> pa.Table:
    """``produced`` (a worker's columns, one row per input row, in order) completed into
    ``schema``: the worker's columns win, then the input row's, then the run's."""
    if produced.column("item_id").to_pylist() != inputs.column("item_id").to_pylist():
        raise RuntimeError("a worker returned rows that do not match its input one to one")
    n = produced.num_rows
    run = {
        "run_id": pa.array([provenance.run_id] * n, pa.string()),
        "processed_at": pa.array([datetime.now(UTC)] * n, pa.timestamp("us", tz="UTC")),
        "options": pa.array([provenance.options] * n, pa.string()),
    }
    columns = {}
    for name in schema.names:
        if name in produced.column_names:
            columns[name] = produced.column(name)
        elif _SOURCE.get(name, name) in inputs.column_names:
            columns[name] = inputs.column(_SOURCE.get(name, name))
        elif name in run:
            columns[name] = run[name]
        else:
            columns[name] = pa.nulls(n, schema.field(name).type)
    return pa.table(columns)


class CommittingActor:
    """A model worker plus the commit of each batch it finishes.

    Committing inside the actor call, rather than in a later stage, makes every finished
    batch durable at once: Ray Data coalesces small output rows into large blocks, so a
    separate sink stage would only see (and write) them when the whole task ends, and a
    killed run would lose all of it.

    ``after``: task stages between the model and the commit (redaction), on the rows as they
    will be committed. Each runs as a Ray task holding its own CPUs, never on the actor's:
    the actor's other calls keep the model busy while this one waits for it.
    """

    def __init__(
        self,
        make_worker: Callable[[], Callable[[pa.Table], pa.Table]],
        dataset: storage.Location,
        schema: pa.Schema,
        slim: Sequence[str],
        token: str,
        provenance: Provenance | None = None,
        after: Sequence[Stage] = (),
    ):
        # Wall-clock times (epoch seconds, comparable across the cluster's processes) of
        # the actor's start and of its model being ready: the start-up the first result
        # waits for, reported in the run summary's ``startup``.
        self.started_at = time.time()
        self.worker = make_worker()
        self.ready_at = time.time()
        self.dataset, self.schema, self.slim, self.token = dataset, schema, tuple(slim), token
        self.provenance = provenance
        self.after: list[tuple[Any, dict[str, Any]]] = []
        if after:
            import ray

            self.after = [
                (ray.remote(**s.resources(), max_retries=3)(s.fn), dict(s.kwargs)) for s in after
            ]

    def __call__(self, batch: pa.Table) -> pa.Table:
        finished = self.worker(batch)
        if self.provenance is not None:
            finished = with_provenance(batch, finished, self.schema, self.provenance)
        if self.after:
            import ray

            # On the rows as they will be committed (source_uri and the run's provenance in).
            for task, kwargs in self.after:
                finished = ray.get(task.remote(finished, **kwargs))
        # Checked after the model, right before the write: the window a dying run's actor
        # has to commit after a new run's claim is one small read long.
        check_claim(self.dataset, self.token)
        slim = commit(finished, self.dataset, self.schema, self.slim)
        n = slim.num_rows
        slim = slim.append_column(ACTOR_STARTED, pa.array([self.started_at] * n, pa.float64()))
        return slim.append_column(MODEL_READY, pa.array([self.ready_at] * n, pa.float64()))


# Driver-only columns of the rows an actor returns (never committed): see CommittingActor.
ACTOR_STARTED, MODEL_READY = "_actor_started_at", "_model_ready_at"
