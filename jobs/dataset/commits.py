"""The committed-Parquet protocol, in one place: ``CommittedDataset`` (claim, commit, staging
and publish (compaction into ``run_date=`` partitions), the done-index, reading, retries,
duplicate repair), and the run provenance the committing actor (``jobs.run.committing``) adds
to each row.

An actor commits each finished batch as one Parquet file, named by the hash of its item ids
and appearing atomically (rename on local disks, a single PUT on object stores), into its
run's hidden staging folder. So "committed" is exactly "staged, or published and in the
done-index": the driver subtracts it *before* starting (for totals, progress and the
manifest), a retried task rewrites the same file name instead of adding a second copy, and
no pending-file cleanup is needed. ``publish`` moves staged files into the dataset's
partitions as few large files (see its docstring for why readers never see a row twice).
One writer per dataset (``claim``); an item a dying writer still committed twice is dropped
at publish. Flat datasets of older versions are still read and repaired
(``drop_duplicates``).
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import io
import json
import logging
import os
import posixpath
import secrets
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from overnight.jobs.dataset import storage
from overnight.jobs.errors import InputNotFound, Superseded


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


# -- the partitioned layout, staging, publishing and the done-index ------------------------
#
# OUTPUT/<dataset>/run_date=YYYY-MM-DD/part-<publish>-<n>.parquet   what readers read
# OUTPUT/_staging/<dataset>/<run_date>/<run_id>/part-<digest>.parquet  actors' commits
# OUTPUT/_staging/<dataset>/<run_date>/<run_id>.publish.json        a publish under way
# OUTPUT/_index/<dataset>/seg-<publish>.parquet                     published item ids
#
# Staging and the index live beside the dataset, not inside it: Polars and DuckDB globs do
# not skip ``_``-prefixed folders, so anything inside would be read as rows.

PARTITION = "run_date"
ROWS_PER_FILE = 100_000  # a compacted file's rows: readers want few, large files
# A long run publishes as it goes (jobs.run.runner): after this many rows or seconds.
PUBLISH_EVERY_ROWS = ROWS_PER_FILE
PUBLISH_EVERY_S = 1800.0
INDEX_ROW_GROUP = 4096  # ids per row group of an index segment: the unit a lookup reads
_MAX_SEGMENTS = 8  # index segments before they are merged


def partition_date(path: str) -> date | None:
    """The run date of a ``run_date=YYYY-MM-DD`` folder in ``path``; None where there is
    none, or where its value is not a date (``run_date=garbage``, not a folder overnight
    writes: readers and vacuum leave it alone, as ``staged_files`` does)."""
    for part in path.split("/"):
        if part.startswith(f"{PARTITION}="):
            value = part.split("=", 1)[1]
            return date.fromisoformat(value) if _is_date(value) else None
    return None


def _is_date(text: str) -> bool:
    try:
        date.fromisoformat(text)
    except ValueError:
        return False
    return True


RETRY_INTENT_SUFFIX = ".retry.json"

# The ``overnight.table`` a dataset's files carry in their schema metadata (schemas.tables).
_TABLE_OF = {
    "transcripts": b"transcripts",
    "results": b"document_results",
    "probes": b"probes",
    "costs": b"costs",
}
# What a dataset's reader tells its operator (a foreign file skipped): the stdlib logger that
# jobs.run.console configures (a text or JSON line on stderr), not imported from this layer.
_events = logging.getLogger("overnight.events")
# Errors that mean the file could not be fetched, not that its bytes are not Parquet.
_NOT_DAMAGE = (FileNotFoundError, PermissionError, ConnectionError, TimeoutError)


@contextlib.contextmanager
def read_or_name(path: str) -> Iterator[None]:
    """Reading ``path`` as Parquet: bytes that are not (cut short, zero bytes) stop the reader
    with ``damaged``'s error; a fetch that fails (missing, forbidden, storage down) raises
    as it is."""
    try:
        yield
    except _NOT_DAMAGE:
        raise
    except (pa.ArrowException, OSError) as exc:
        raise damaged(path, exc) from None


def damaged(path: str, exc: BaseException) -> InputNotFound:
    """The error for a file of a dataset that is not readable Parquet (cut short by a copy,
    zero bytes, overwritten): it names the file and what to do, and nothing is changed."""
    reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
    return InputNotFound(
        f"{storage.one_line(storage.scrub_secrets(path))} is not a readable Parquet file ({reason}): it "
        "was damaged (cut short, zero bytes) or not written by overnight. Nothing was read or "
        "changed; restore the file from a backup or move it out of the output, then run again."
    )


def _skipped(path: str, why: str) -> None:
    shown = storage.one_line(storage.scrub_secrets(path))
    _events.warning(
        f"warning: skipped {shown}: {why}, so it is not a file overnight wrote; its rows are "
        "not read (move it out of the output to silence this)",
        extra={"event": "skipped_file", "fields": {"path": shown, "reason": why}},
    )


def _foreign(pf: pq.ParquetFile, dataset: str) -> str | None:
    """Why a readable Parquet file is not one of ``dataset``'s (None: it is): it lacks the
    string ``item_id`` and ``run_id`` every overnight row has, or its schema metadata names
    another of overnight's tables."""
    schema = pf.schema_arrow
    for name in ("item_id", "run_id"):
        kind = schema.field(name).type if name in schema.names else None
        if kind is None or not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            return f"it has no text column {name!r}"
    table = (schema.metadata or {}).get(b"overnight.table")
    expected = _TABLE_OF.get(dataset)
    if table is not None and expected is not None and table != expected:
        return f"it holds overnight's {table.decode(errors='replace')!r} rows, not {dataset!r}"
    return None


def _groups_holding(meta: pq.FileMetaData, probe: list[str]) -> list[int]:
    column = meta.schema.names.index("item_id")
    groups = []
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(column).statistics
        if stats is None or not stats.has_min_max:
            groups.append(g)
            continue
        at = bisect.bisect_left(probe, stats.min)
        if at < len(probe) and probe[at] <= stats.max:
            groups.append(g)
    return groups


def write_parquet(
    loc: storage.Location, table: pa.Table, row_group_size: int | None = None
) -> None:
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", row_group_size=row_group_size)
    storage.write_bytes_atomic(loc, buf.getvalue())


def _index_table(ids: pa.Array, days: pa.Array) -> pa.Table:
    return pa.table({"item_id": ids, PARTITION: days}).sort_by("item_id")


@dataclass
class Published:
    """What ``publish`` moved into the partitions: rows and their derived rows (costs)."""

    rows: int = 0
    duplicates_dropped: int = 0
    derived: list[pa.Table] = field(default_factory=list)


# Fault injection for the tests: a publish stops (the process exits) right after writing
# its compacted files, before the staged ones are deleted.
_FAULT_ENV = "OVERNIGHT_FAULT_AFTER_COMPACT"


class CommittedDataset:
    """A result dataset under OUTPUT (transcripts/, results/, probes/, costs/) and the
    protocol that writes and reads it, in one object: commit, read, committed ids, the
    writer's claim, staging and publishing (compaction into ``run_date=`` partitions), the
    done-index, retries of error rows, duplicate repair. Its hidden areas live beside it:
    OUTPUT/_staging/<name>/, OUTPUT/_index/<name>/, OUTPUT/_claims/<name>.json.

    ``CommittedDataset(output.join("transcripts"))``: nothing is read or written until a
    method is called; it holds only the location.
    """

    def __init__(self, location: storage.Location):
        self.location = location

    def __repr__(self) -> str:
        return f"CommittedDataset({storage.scrub_secrets(self.location.url())!r})"

    @property
    def name(self) -> str:
        """The dataset's folder name: transcripts, results, probes, costs."""
        return posixpath.basename(self.location.path.rstrip("/"))

    def write_table(self, table: pa.Table) -> str:
        """Commit one Parquet file, named by its content's item ids, atomically."""
        digest = hashlib.sha256(
            "\n".join(sorted(set(table["item_id"].to_pylist()))).encode()
        ).hexdigest()[:24]
        loc = self.location.join(f"part-{digest}.parquet")
        buf = io.BytesIO()
        pq.write_table(table, buf, compression="zstd")
        storage.write_bytes_atomic(loc, buf.getvalue())
        return loc.url()

    def read_results(
        self,
        columns: list[str] | None = None,
        run_id: str | None = None,
        dates: tuple[date | None, date | None] | None = None,
        flat_only: bool = False,
    ) -> pa.Table | None:
        """Read a result self.location (transcripts/, results/, probes/, costs/) written by overnight:
        its published ``run_date=`` partitions and the flat files of older outputs.

        ``dates`` (first, last; either open) opens only the partitions of those run dates (flat
        files have no date and are always read). ``run_date`` is a partition column, not a file
        column: ask for it in ``columns`` to get it (null for flat files).

        A file that is not readable Parquet (cut short, zero bytes) stops the read with
        ``InputNotFound`` naming it; a readable one that is not the dataset's (no text
        ``item_id`` and ``run_id``, or another overnight table's) is skipped with a warning on
        the ``overnight.events`` logger. None when no file of the dataset is left to read.
        """
        files = self.flat_files() if flat_only else self.published_files(dates)
        if not files:
            return None
        want_date = columns is not None and PARTITION in columns

        def read(path: str) -> pa.Table | None:
            table = self._read_own(path, columns)
            if table is None:
                return None
            if want_date:
                day = partition_date(path)
                table = table.append_column(
                    PARTITION, pa.array([day] * table.num_rows, pa.date32())
                )
            return table

        tables = [t for t in storage.map_threads(read, files) if t is not None]
        if not tables:
            return None
        try:
            table = pa.concat_tables(tables, promote_options="default")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise InputNotFound(
                f"the files of {storage.one_line(storage.scrub_secrets(self.location.url()))} do not "
                f"read as one table ({str(exc).splitlines()[0][:200]}): a file there was not "
                "written by overnight. Move it out of the output and run again."
            ) from None
        if run_id is not None:
            table = table.filter(pc.equal(table["run_id"], run_id))
        return table

    def _read_own(self, path: str, columns: list[str] | None) -> pa.Table | None:
        """``columns`` of one of the dataset's files (those it has; None: all); None for a
        foreign file (skipped with a warning); ``InputNotFound`` for one that is not
        readable Parquet."""
        with read_or_name(path), self.location.fs.open(path, "rb") as f:
            pf = pq.ParquetFile(f)
            why = _foreign(pf, self.name)
            if why is not None:
                _skipped(path, why)
                return None
            names = pf.schema_arrow.names
            return pf.read(columns=None if columns is None else [c for c in columns if c in names])

    def committed_files(self, flat_only: bool = False) -> dict[str, list[str]]:
        """The complete Parquet files of a result self.location and the item ids each holds
        (``flat_only``: only the unpartitioned files an older overnight wrote at its top).

        Files appear atomically (see ``storage.write_bytes_atomic``), so every file listed is a
        commit; an unreadable one (damaged since) is reported, not skipped: ``InputNotFound``
        naming it. A readable file that is not overnight's (no ``item_id``/``run_id``, or another
        table's) is skipped with a warning, as ``read_results`` does.
        """
        files = self.flat_files() if flat_only else self.published_files()
        return self._ids_of(files)

    def _ids_of(self, files: list[str]) -> dict[str, list[str]]:
        def read(path: str) -> list[str] | None:
            table = self._read_own(path, ["item_id"])
            return None if table is None else table.column("item_id").to_pylist()

        found = dict(zip(files, storage.map_threads(read, files), strict=True)) if files else {}
        return {path: ids for path, ids in found.items() if ids is not None}

    def committed_ids(self, among: Iterable[str] | None = None) -> set[str]:
        """Item ids committed to a result self.location: published (looked up in its done-index),
        staged by any run and not yet published, or in the flat files of an older output.

        With ``among``, only those ids are looked up, and only the index row groups that can hold
        them are read: the cost follows this run's input, not the output's history.
        """
        wanted = None if among is None else set(among)
        found = set(self.index_lookup(wanted))
        found |= {i for ids in self.committed_files(flat_only=True).values() for i in ids}
        found |= {i for ids in self.staged_files().values() for i in ids}
        return found if wanted is None else found & wanted

    # One writer per result dataset. A driver that dies (killed, node lost) leaves its Ray
    # actors running for a few seconds until they notice; one that finishes its batch meanwhile
    # would commit items the next run has already listed as missing: the same item twice.

    def claim_file(self) -> storage.Location:
        """OUTPUT/_claims/<self.location>.json: beside the self.location, so its folder holds only Parquet."""
        parent, name = posixpath.split(self.location.path.rstrip("/"))
        return storage.Location(
            self.location.fs,
            posixpath.join(parent, "_claims", f"{name}.json"),
            self.location.scheme,
        )

    def claim(self, run_id: str) -> str:
        """Make this run the only writer of ``self.location``; returns the token its commits carry.

        Call before listing what is committed: any writer of an earlier run that is still alive
        fails its next commit (``check_claim``) instead of adding rows this run will also write.
        """
        token = f"{run_id}:{secrets.token_hex(8)}"  # fresh per attempt: a rerun may reuse run_id
        body = json.dumps({"run_id": run_id, "token": token, "claimed_at": time.time()})
        storage.write_bytes_atomic(self.claim_file(), body.encode())
        return token

    def check_claim(self, token: str) -> None:
        """Raise ``Superseded`` unless the run holding ``token`` is still the self.location's writer."""
        try:
            current = json.loads(storage.read_location(self.claim_file()))
        except FileNotFoundError:
            current = {}
        if current.get("token") != token:
            raise Superseded(
                f"a later run ({current.get('run_id', 'unknown')}) took over "
                f"{storage.scrub_secrets(self.location.url())}; this run stopped before writing an item twice. "
                "Its finished items are kept. Run one job per output at a time."
            )

    def drop_duplicates(self, schema: pa.Schema, keep_run: str) -> int:
        """Leave one row per item in ``self.location``; returns how many rows were removed.

        The claim closes the window in which a dying run's writer can commit late, but cannot
        close it entirely (a writer may pass its check just before the new claim). Every run
        ends with this repair: an item with rows in several files keeps the row of ``keep_run``
        (the run whose summary counts it), else the one in the first file by name. A file that
        loses rows is rewritten under its new content name before the old one is deleted, so a
        crash in between leaves a duplicate for the next run to repair, never a loss.
        """
        files = self.committed_files(flat_only=True)
        where: dict[str, list[str]] = defaultdict(list)
        for path, ids in files.items():
            for item in ids:
                where[item].append(path)
        doubled = {item: paths for item, paths in where.items() if len(paths) > 1}
        if not doubled:
            return 0
        tables = {
            path: self._read_part(path)
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
                self.write_table(rest.select(schema.names).cast(schema) if same else rest)
            storage.delete(storage.Location(self.location.fs, path, self.location.scheme))
            removed += table.num_rows - rest.num_rows
        return removed

    def _read_part(self, path: str) -> pa.Table:
        with self.location.fs.open(path, "rb") as f:
            return pq.read_table(f)

    def commit(self, table: pa.Table, schema: pa.Schema, slim: Sequence[str]) -> pa.Table:
        """Validate against the schema, write one file atomically, return the slim rows."""
        table = table.select(schema.names).cast(schema)
        ids = table["item_id"].to_pylist()
        if len(set(ids)) != len(ids):
            raise RuntimeError(
                "a batch holds the same item twice: the manifest must have unique ids"
            )
        self.write_table(table)
        return table.select(list(slim))

    def _beside(self, area: str) -> storage.Location:
        parent, name = posixpath.split(self.location.path.rstrip("/"))
        return storage.Location(
            self.location.fs, posixpath.join(parent, area, name), self.location.scheme
        )

    def staging_root(self) -> storage.Location:
        return self._beside("_staging")

    def staging_dir(self, run_date: date, run_id: str) -> storage.Location:
        """Where this run's actors commit: hidden from readers until ``publish``."""
        return self.staging_root().join(run_date.isoformat(), run_id)

    def index_root(self) -> storage.Location:
        return self._beside("_index")

    def flat_files(self) -> list[str]:
        """Parquet files at the self.location's top: the unpartitioned layout of older outputs."""
        return storage.list_top_files(self.location, ".parquet")

    def published_files(self, dates: tuple[date | None, date | None] | None = None) -> list[str]:
        """The self.location's Parquet files: flat ones, and those of the partitions within ``dates``
        (listing only the folders of those dates)."""
        first, last = dates or (None, None)
        files = self.flat_files()
        for folder in storage.list_dirs(self.location):
            day = partition_date(posixpath.basename(folder))
            if day is None or (first and day < first) or (last and day > last):
                continue
            files += storage.list_files(
                storage.Location(self.location.fs, folder, self.location.scheme), ".parquet"
            )
        return files

    def staged_files(self) -> dict[str, list[str]]:
        """Every run's staged, not yet published files and their item ids: exactly the files
        ``publish`` takes, ``<run_date>/<run_id>/part-*.parquet`` under the staging root. A file
        anywhere else there (a run id with a '/' or an empty one staged into other folders,
        before run ids were checked) is never published, so it must not count as done either:
        its items are done again."""
        root = self.staging_root()
        prefix = root.path.rstrip("/") + "/"

        def publishable(path: str) -> bool:
            parts = path[len(prefix) :].split("/") if path.startswith(prefix) else []
            return len(parts) == 3 and _is_date(parts[0])

        return self._ids_of([p for p in storage.list_files(root, ".parquet") if publishable(p)])

    def index_segments(self) -> list[str]:
        return storage.list_top_files(self.index_root(), ".parquet")

    def index_lookup(self, among: set[str] | None, skip: str | None = None) -> set[str]:
        """Published item ids (of ``among`` only); ``skip`` leaves out the segment of one
        publish (a publish being redone must not see its own ids).

        A segment is sorted by item id in row groups of ``INDEX_ROW_GROUP`` ids: only the row
        groups whose min/max (from the footer) hold one of ``among`` are read, so a lookup reads
        at most one row group per id it asks about, however long the history.
        """
        segments = [
            p
            for p in self.index_segments()
            if skip is None or p.rsplit("/", 1)[-1] != f"seg-{skip}.parquet"
        ]
        probe = None if among is None else sorted(among)
        fs = self.location.fs

        def read(path: str) -> list[str]:
            with fs.open(path, "rb") as f:
                pf = pq.ParquetFile(f)
                if probe is None:
                    return pf.read(columns=["item_id"]).column("item_id").to_pylist()
                groups = _groups_holding(pf.metadata, probe)
                if not groups:
                    return []
                ids = pf.read_row_groups(groups, columns=["item_id"]).column("item_id")
            return ids.filter(pc.is_in(ids, value_set=pa.array(probe, pa.string()))).to_pylist()

        if probe is not None and not probe:
            return set()
        return {i for ids in storage.map_threads(read, segments) for i in ids}

    def _index_days(self, among: set[str]) -> set[date]:
        """The run dates under which the index holds any of ``among`` (the partitions to read)."""
        probe = sorted(among)

        def read(path: str) -> list[date]:
            with self.location.fs.open(path, "rb") as f:
                pf = pq.ParquetFile(f)
                groups = _groups_holding(pf.metadata, probe)
                if not groups:
                    return []
                table = pf.read_row_groups(groups, columns=["item_id", PARTITION])
            hit = pc.is_in(table["item_id"], value_set=pa.array(probe, pa.string()))
            return table[PARTITION].filter(hit).unique().to_pylist()

        if not probe:
            return set()
        return {d for days in storage.map_threads(read, self.index_segments()) for d in days}

    # -- retrying error rows ---------------------------------------------------------------------
    # A rerun with ``retry_errors`` redoes the items whose row is an error of the given codes
    # (a PDF's password supplied since, a storage outage, a crashed worker). Their error rows are
    # forgotten before the run subtracts what is done, so they are pending work like any other
    # and publish unchanged. An intent file makes the forgetting crash-safe: rows go first, then
    # the index entries, then the intent; a run killed in between is finished by the next claim.
    # (Index entries first would let a run publish a second row beside the old error row; rows
    # first without an intent would leave an indexed item without a row: done, and lost.)

    def _retry_intent(self) -> storage.Location:
        """OUTPUT/_claims/<self.location>.retry.json, beside the claim (only its holder writes it)."""
        claim = self.claim_file()
        path = claim.path[: -len(".json")] + RETRY_INTENT_SUFFIX
        return storage.Location(claim.fs, path, claim.scheme)

    def error_rows(self, among: Iterable[str], codes: Sequence[str] | None) -> dict[str, list[str]]:
        """The published files that hold error rows of ``among`` whose code is one of ``codes``
        (any code: None), and those rows' item ids. Only the partitions the index names for
        ``among`` are read, three columns each (and an older output's flat files)."""
        wanted = set(among)
        if not wanted:
            return {}
        days = self._index_days(wanted)
        if days:  # flat files (partition None) and the partitions the index names
            listed = self.published_files((min(days), max(days)))
            files = [p for p in listed if partition_date(p) in {None, *days}]
        else:
            files = self.flat_files()
        value_set = pa.array(sorted(wanted), pa.string())

        def read(path: str) -> list[str]:
            with self.location.fs.open(path, "rb") as f:
                table = pq.read_table(f, columns=["item_id", "status", "error_code"])
            hit = pc.and_(
                pc.is_in(table["item_id"], value_set=value_set), pc.equal(table["status"], "error")
            )
            if codes is not None:
                hit = pc.and_(hit, pc.is_in(table["error_code"], value_set=pa.array(list(codes))))
            return table["item_id"].filter(hit).to_pylist()

        found = dict(zip(files, storage.map_threads(read, files), strict=True)) if files else {}
        return {path: ids for path, ids in found.items() if ids}

    def forget(self, found: dict[str, list[str]]) -> set[str]:
        """Remove the error rows ``found`` (``error_rows``' answer: files and the item ids of
        their error rows) and those items' done-index entries, so that this run does them again;
        returns their ids. Only the claim's holder calls it, after ``publish`` has taken every
        staged file."""
        ids = sorted({i for rows in found.values() for i in rows})
        if ids:
            body = json.dumps({"ids": ids, "files": sorted(found)})
            storage.write_bytes_atomic(self._retry_intent(), body.encode())
            self.finish_forgetting()
        return set(ids)

    def finish_forgetting(self) -> None:
        """Carry out a retry's intent, if one is there (a killed run's too); every step can run
        again: only error rows of the intent's ids go, and index entries of those ids."""
        intent = self._retry_intent()
        if not storage.exists(intent):
            return
        plan = json.loads(storage.read_location(intent))
        ids = pa.array(plan["ids"], pa.string())
        for path in plan["files"]:
            loc = storage.Location(self.location.fs, path, self.location.scheme)
            if not storage.exists(loc):
                continue
            table = self._read_part(path)
            drop = pc.and_(
                pc.is_in(table["item_id"], value_set=ids), pc.equal(table["status"], "error")
            )
            if not pc.any(drop).as_py():
                continue
            rest = table.filter(pc.invert(drop))
            if rest.num_rows:
                write_parquet(loc, rest)  # the same name, replaced atomically
            else:
                storage.delete(loc)
        for path in self.index_segments():
            loc = storage.Location(self.location.fs, path, self.location.scheme)
            with self.location.fs.open(path, "rb") as f:
                table = pq.read_table(f)
            gone = pc.is_in(table["item_id"], value_set=ids)
            if not pc.any(gone).as_py():
                continue
            rest = table.filter(pc.invert(gone))  # still sorted by item id
            if rest.num_rows:
                write_parquet(loc, rest, INDEX_ROW_GROUP)
            else:
                storage.delete(loc)
        storage.delete(intent)

    def _write_index(self, publish_id: str, ids: list[str], day: date) -> None:
        table = _index_table(pa.array(ids, pa.string()), pa.array([day] * len(ids), pa.date32()))
        loc = self.index_root().join(f"seg-{publish_id}.parquet")
        write_parquet(loc, table, INDEX_ROW_GROUP)

    def merge_index(self) -> None:
        """Keep the index to a few segments: past ``_MAX_SEGMENTS``, the small ones are merged
        into one, and everything into one when those together are a good part of the largest
        (so each id is rewritten a few times over the output's life, not at every publish)."""
        segments = self.index_segments()
        if len(segments) <= _MAX_SEGMENTS:
            return
        fs = self.location.fs

        def rows(path: str) -> int:
            with fs.open(path, "rb") as f:
                return pq.ParquetFile(f).metadata.num_rows

        sizes = dict(zip(segments, storage.map_threads(rows, segments), strict=True))
        base = max(segments, key=lambda p: sizes[p])
        small = [p for p in segments if p != base]
        merge = small if 2 * sum(sizes[p] for p in small) < sizes[base] else segments

        def read(path: str) -> pa.Table:
            with fs.open(path, "rb") as f:
                return pq.read_table(f, columns=["item_id", PARTITION])

        tables = storage.map_threads(read, merge)
        merged = pa.concat_tables(tables)
        merged = _index_table(merged["item_id"], merged[PARTITION])
        digest = hashlib.sha256("\n".join(sorted(merge)).encode()).hexdigest()[:16]
        # Written before the merged segments go: a crash in between leaves ids twice (harmless
        # in a set), never missing.
        write_parquet(self.index_root().join(f"seg-m{digest}.parquet"), merged, INDEX_ROW_GROUP)
        for path in merge:
            storage.delete(storage.Location(fs, path, self.location.scheme))

    def publish(
        self,
        schema: pa.Schema,
        keep_run: str,
        derive: Callable[[pa.Table], tuple[storage.Location, pa.Table]] | None = None,
        rows_per_file: int = ROWS_PER_FILE,
    ) -> Published:
        """Move every run's staged commits into the self.location's ``run_date=`` partitions as few
        large files, exactly once per item. Only the claim's holder calls it.

        For each staged run folder: write an intent (the staged files it takes); write the
        compacted files under names fixed by the intent; write the index segment; delete the
        staged files; delete the intent. Readers never see a row twice or miss one: staged rows
        are hidden from them, a compacted file appears atomically and replaces any earlier copy of
        itself (same name, same rows), and the staged files go only after every file is written.
        A publish killed at any point is finished by the next one: with all its staged files
        still there it is redone (same names), else only the deletes are left.

        An item already published (a dying run's late commit) is dropped, and an item staged by
        several runs keeps ``keep_run``'s row, else the one in the first file by name.
        ``derive`` maps the published rows to rows of another self.location (the cost ledger), written
        in the same step under the same names.
        """
        done = Published()
        root = self.staging_root()
        for day_dir in storage.list_dirs(root):
            if not _is_date(posixpath.basename(day_dir)):
                continue  # not a folder overnight stages into (as ``staged_files`` counts)
            day = date.fromisoformat(posixpath.basename(day_dir))
            day_loc = storage.Location(root.fs, day_dir, root.scheme)
            runs = {posixpath.basename(d) for d in storage.list_dirs(day_loc)}
            runs |= {
                posixpath.basename(p)[: -len(".publish.json")]
                for p in storage.list_top_files(day_loc, ".publish.json")
            }
            for run in sorted(runs, key=lambda r: (r != keep_run, r)):
                self._publish_run(schema, keep_run, derive, rows_per_file, day_loc, day, run, done)
        self.merge_index()
        return done

    def _publish_run(
        self,
        schema: pa.Schema,
        keep_run: str,
        derive: Callable[[pa.Table], tuple[storage.Location, pa.Table]] | None,
        rows_per_file: int,
        day_loc: storage.Location,
        day: date,
        run: str,
        done: Published,
    ) -> None:
        intent = day_loc.join(f"{run}.publish.json")
        run_loc = day_loc.join(run)
        if storage.exists(intent):
            plan = json.loads(storage.read_location(intent))
        else:
            staged = storage.list_top_files(run_loc, ".parquet")  # what staged_files counts
            if not staged:
                return
            names = [posixpath.basename(p) for p in staged]
            plan = {
                "files": names,
                "publish_id": f"{run[:40]}-{hashlib.sha256(chr(10).join(names).encode()).hexdigest()[:12]}",
            }
            storage.write_bytes_atomic(intent, json.dumps(plan).encode())
        staged_locs = [run_loc.join(n) for n in plan["files"]]
        if all(storage.exists(loc) for loc in staged_locs):  # else: written, only deletes left
            self._compact(schema, keep_run, derive, rows_per_file, day, plan, staged_locs, done)
            if os.environ.get(_FAULT_ENV):
                os._exit(70)
        for loc in staged_locs:
            storage.delete(loc)
        storage.delete(intent)

    def _compact(
        self,
        schema: pa.Schema,
        keep_run: str,
        derive: Callable[[pa.Table], tuple[storage.Location, pa.Table]] | None,
        rows_per_file: int,
        day: date,
        plan: dict[str, Any],
        staged: list[storage.Location],
        done: Published,
    ) -> None:
        publish_id = plan["publish_id"]
        tables = storage.map_threads(
            lambda loc: pq.read_table(io.BytesIO(storage.read_location(loc))), staged
        )
        table = pa.concat_tables(tables, promote_options="default")
        ids = table["item_id"].to_pylist()
        # Published earlier (a dying run's late commit, or the same recording in a later run
        # submitted twice): dropped. ``publish`` takes ``keep_run``'s folder first.
        already = self.index_lookup(set(ids), skip=publish_id)
        keep, seen = [], set()
        for n, item in enumerate(ids):
            if item in seen or item in already:
                continue
            seen.add(item)
            keep.append(n)
        done.duplicates_dropped += len(ids) - len(keep)
        table = table.take(pa.array(keep, pa.int64()))
        same = table.schema.remove_metadata().equals(schema.remove_metadata())
        if not same and set(schema.names) <= set(table.column_names):
            table = table.select(schema.names).cast(schema)
        table = table.sort_by([("item_id", "ascending")])
        if "tenant" in table.column_names:  # rows of a tenant together: row groups prune by it
            table = table.sort_by([("tenant", "ascending"), ("item_id", "ascending")])
        partition = self.location.join(f"{PARTITION}={day.isoformat()}")
        chunks = [table.slice(i, rows_per_file) for i in range(0, table.num_rows, rows_per_file)]

        def write(item: tuple[int, pa.Table]) -> None:
            n, chunk = item
            write_parquet(partition.join(f"part-{publish_id}-{n:05d}.parquet"), chunk)

        storage.map_threads(write, list(enumerate(chunks)))
        if derive is not None and table.num_rows:
            target, derived = derive(table)
            if derived.num_rows:
                write_parquet(
                    target.join(
                        f"{PARTITION}={day.isoformat()}", f"part-{publish_id}-00000.parquet"
                    ),
                    derived,
                )
                done.derived.append(derived)
        self._write_index(publish_id, table["item_id"].to_pylist(), day)
        done.rows += table.num_rows
