"""Retention: ``overnight vacuum OUTPUT --older-than 90d`` removes whole run dates.

What goes, for every run date before the cutoff: the ``run_date=`` partitions of the result
datasets and of ``costs/`` and ``run_table/``, those dates' entries of the done-index (a
recording of those nights submitted again is new work), the ``runs/<run_id>.json`` and
``_manifests/<run_id>.parquet`` of the runs dated then, staged leftovers of runs dated then,
and manifests and claims last written before the cutoff; ``transcripts_unredacted/`` (flat)
loses the rows of the runs removed. A night is removed whole (its
results, their ledger rows and its runs' summaries together), so a report over the nights
that remain reads exactly what it read before.

Not while a job writes to OUTPUT: vacuum rewrites index segments a running publish also merges.
"""

from __future__ import annotations

import io
import posixpath
from dataclasses import dataclass, field
from datetime import UTC, date, datetime

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from overnight.jobs import commits, storage

DATASETS = ("transcripts", "results", "probes", "costs", "run_table")
# Flat, and the one dataset with personal data in clear: its rows of the removed runs go too.
UNREDACTED = "transcripts_unredacted"


@dataclass
class Vacuumed:
    """What vacuum removed (or, in a dry run, would remove): paths and counts."""

    before: date
    partitions: list[str] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)  # run ids whose summaries went
    files: list[str] = field(default_factory=list)  # every other file removed
    index_entries: int = 0

    def describe(self, dry_run: bool) -> str:
        verb = "would remove" if dry_run else "removed"
        return (
            f"vacuum before {self.before}: {verb} {len(self.partitions)} partition(s), "
            f"{len(self.runs)} run summary(ies), {self.index_entries} index entr(ies) and "
            f"{len(self.files)} other file(s)"
        )


def vacuum(output_url: str, before: date, dry_run: bool = False) -> Vacuumed:
    """Remove everything dated before ``before`` from OUTPUT (see the module docstring)."""
    output = storage.resolve(output_url)
    done = Vacuumed(before)
    old_runs: set[str] = set()
    for name in DATASETS:
        dataset = output.join(name)
        for folder in storage.list_dirs(dataset):
            day = commits.partition_date(posixpath.basename(folder))
            if day is None or day >= before:
                continue
            loc = storage.Location(dataset.fs, folder, dataset.scheme)
            if name == "run_table":
                for path in storage.list_files(loc, ".parquet"):
                    with loc.fs.open(path, "rb") as f:
                        old_runs.update(pq.read_table(f, columns=["run_id"])["run_id"].to_pylist())
            done.partitions.append(storage.redact(loc.url()))
            if not dry_run:
                _remove_tree(loc)
        if name != "run_table":
            done.index_entries += _prune_index(dataset, before, dry_run)
            for folder in storage.list_dirs(commits.staging_root(dataset)):
                if date.fromisoformat(posixpath.basename(folder)) < before:
                    loc = storage.Location(dataset.fs, folder, dataset.scheme)
                    done.files += storage.list_files(loc)
                    if not dry_run:
                        _remove_tree(loc)
    for run_id in sorted(old_runs):
        summary = output.join("runs", f"{run_id}.json")
        if storage.exists(summary):
            done.runs.append(run_id)
            if not dry_run:
                storage.delete(summary)
    done.files += _prune_by_run(output.join(UNREDACTED), old_runs, dry_run)
    cutoff = datetime(before.year, before.month, before.day, tzinfo=UTC)
    for area in ("_manifests", "_claims"):
        loc = output.join(area)
        for path in storage.list_files(loc):
            if path.endswith(commits.RETRY_INTENT_SUFFIX):
                continue  # a retry a killed run left half done: the next claim finishes it
            run_id = posixpath.splitext(posixpath.basename(path))[0]
            if run_id in old_runs or _modified(loc, path) < cutoff:
                done.files.append(path)
                if not dry_run:
                    storage.delete(storage.Location(loc.fs, path, loc.scheme))
    return done


def _prune_by_run(dataset: storage.Location, runs: set[str], dry_run: bool) -> list[str]:
    """A flat dataset's rows of ``runs`` removed: files wholly of those runs deleted, a
    file mixing runs rewritten without them (atomically, under its own name)."""
    removed = []
    for path in storage.list_files(dataset, ".parquet") if runs else []:
        loc = storage.Location(dataset.fs, path, dataset.scheme)
        with dataset.fs.open(path, "rb") as f:
            table = pq.read_table(f)
        old = pc.is_in(table["run_id"], pa.array(sorted(runs), pa.string()))
        if not pc.any(old).as_py():
            continue
        removed.append(path)
        if dry_run:
            continue
        kept = table.filter(pc.invert(old))
        if kept.num_rows == 0:
            storage.delete(loc)
        else:
            buf = io.BytesIO()
            pq.write_table(kept, buf, compression="zstd")
            storage.write_bytes_atomic(loc, buf.getvalue())
    return removed


def _remove_tree(loc: storage.Location) -> None:
    for path in storage.list_files(loc):
        storage.delete(storage.Location(loc.fs, path, loc.scheme))
    if loc.scheme == "file":
        import shutil

        shutil.rmtree(loc.path, ignore_errors=True)


def _modified(loc: storage.Location, path: str) -> datetime:
    stamp = loc.fs.modified(path)
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)


def _prune_index(dataset: storage.Location, before: date, dry_run: bool) -> int:
    """Drop the index entries of run dates before ``before``; returns how many."""
    removed = 0
    for path in commits.index_segments(dataset):
        with dataset.fs.open(path, "rb") as f:
            table = pq.read_table(f)
        old = pc.less(table[commits.PARTITION], before)
        n = pc.sum(old).as_py() or 0
        if not n:
            continue
        removed += n
        if dry_run:
            continue
        rest = table.filter(pc.invert(old))  # still sorted by item id
        loc = storage.Location(dataset.fs, path, dataset.scheme)
        if rest.num_rows:
            commits.write_parquet(loc, rest, commits.INDEX_ROW_GROUP)  # replaced atomically
        else:
            storage.delete(loc)
    return removed
