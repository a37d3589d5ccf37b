"""Retention: ``overnight vacuum OUTPUT --older-than 90d`` removes whole run dates.

What goes, for every run date before the cutoff: the ``run_date=`` partitions of the result
datasets and of ``costs/`` and ``run_table/``, those dates' entries of the done-index (a
recording of those nights submitted again is new work), the ``runs/<run_id>.json`` and
``_manifests/<run_id>.parquet`` of the runs dated then, staged leftovers of runs dated then,
and manifests and claims last written before the cutoff; ``transcripts_unredacted/`` (flat)
loses the rows of the removed recordings, and ``redacted_audio/`` their FLACs. A night is
removed whole (its results, their ledger rows and its runs' summaries together), so a report
over the nights that remain reads exactly what it read before.

Crash-safe as the commit protocol is: which runs and recordings a night held is learned from
files that vacuum deletes (``run_table/``, the ``transcripts/`` partitions), so that is
written first as an intent (``OUTPUT/_vacuum.json``); then the files go, the personal data
first and the indexes (the done-index, ``run_table/``) last, then the intent. Each step
removes only what is still there, so a vacuum killed at any point is finished by the next
one (with its own cutoff, if later), which reads the intent before anything else.

Not while a job writes to OUTPUT: vacuum rewrites index segments a running publish also merges.
"""

from __future__ import annotations

import io
import json
import posixpath
from dataclasses import dataclass, field
from datetime import UTC, date, datetime

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from overnight.jobs.dataset import commits, storage
from overnight.jobs.errors import InputNotFound
from overnight.jobs.redaction import AUDIO_FOLDER, UNREDACTED_DATASET, audio_name

RESULTS = ("transcripts", "results", "probes", "costs")
RUN_TABLE = "run_table"
INTENT = "_vacuum.json"


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


@dataclass
class _Marked:
    """The intent: the cutoff, and what only the files being removed can tell."""

    before: date
    runs: set[str] = field(default_factory=set)  # run ids dated before the cutoff
    items: set[str] = field(default_factory=set)  # their recordings (transcripts_unredacted)
    audio: set[str] = field(default_factory=set)  # those recordings' FLAC names

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "before": self.before.isoformat(),
                **{k: sorted(getattr(self, k)) for k in ("runs", "items", "audio")},
            }
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> _Marked:
        plan = json.loads(data)
        return cls(
            date.fromisoformat(plan["before"]),
            *(set(plan[k]) for k in ("runs", "items", "audio")),
        )


def vacuum(output_url: str, before: date, dry_run: bool = False) -> Vacuumed:
    """Remove everything dated before ``before`` from OUTPUT (see the module docstring)."""
    output = storage.resolve(output_url)
    if not storage.exists(output):  # a typo must not leave a new, empty OUTPUT behind
        raise InputNotFound(
            f"{storage.scrub_secrets(output_url)!r} does not exist: nothing to vacuum (give the "
            "OUTPUT folder or prefix of a transcribe or process run)"
        )
    intent = output.join(INTENT)
    # A killed vacuum's intent is finished with this one: what it marked, up to its cutoff.
    left = _Marked.from_json(storage.read_location(intent)) if storage.exists(intent) else None
    marked = _mark(output, max(before, left.before) if left else before)
    if left:
        marked.runs |= left.runs
        marked.items |= left.items
        marked.audio |= left.audio
    if not dry_run:
        storage.write_bytes_atomic(intent, marked.to_json())
    done = Vacuumed(marked.before)
    _sweep(output, marked, done, dry_run)
    if not dry_run:
        storage.delete(intent)
    return done


def _table(where: storage.Location, path: str, columns: list[str] | None = None) -> pa.Table:
    """A Parquet file vacuum reads; one that is damaged stops it naming the file (exit 4),
    before anything is removed, where it was a traceback."""
    with commits.read_or_name(path), where.fs.open(path, "rb") as f:
        return pq.read_table(f, columns=columns)


def _mark(output: storage.Location, before: date) -> _Marked:
    """Read (only) what the intent must hold: the runs ``run_table/`` dates before the
    cutoff, and the recordings of the ``transcripts/`` rows that go (published or staged)
    where their originals or redacted audio were kept."""
    marked = _Marked(before)
    for path in _files(_partitions(output.join(RUN_TABLE), before)):
        marked.runs.update(_table(output, path, ["run_id"])["run_id"].to_pylist())
    unredacted = storage.list_files(output.join(UNREDACTED_DATASET), ".parquet")
    flacs = {posixpath.basename(p) for p in storage.list_top_files(output.join(AUDIO_FOLDER))}
    if not unredacted and not flacs:
        return marked
    transcripts = output.join("transcripts")
    for path in _files([*_partitions(transcripts, before), *_staged(transcripts, before)]):
        rows = _table(output, path, ["item_id", "source_uri"]).to_pylist()
        if unredacted:
            marked.items.update(r["item_id"] for r in rows)
        marked.audio.update(name for name in map(audio_name, rows) if name in flacs)
    return marked


def _sweep(output: storage.Location, marked: _Marked, done: Vacuumed, dry_run: bool) -> None:
    """Carry out the intent; every step removes only what is still there."""

    def remove(loc: storage.Location) -> None:
        if not dry_run:
            storage.delete(loc)

    before = marked.before
    # Personal data in clear first: the originals, and the recordings the redaction was for.
    done.files += _prune_items(output.join(UNREDACTED_DATASET), marked.items, dry_run)
    audio = output.join(AUDIO_FOLDER)
    for path in storage.list_top_files(audio):  # one listing, not a request per recording
        if posixpath.basename(path) in marked.audio:
            done.files.append(path)
            remove(storage.Location(audio.fs, path, audio.scheme))
    for run_id in sorted(marked.runs):
        summary = output.join("runs", f"{run_id}.json")
        if storage.exists(summary):
            done.runs.append(run_id)
            remove(summary)
        manifest = output.join("_manifests", f"{run_id}.parquet")
        if storage.exists(manifest):
            done.files.append(manifest.path)
            remove(manifest)
    for name in RESULTS:
        for loc in _staged(output.join(name), before):
            done.files += storage.list_files(loc)
            if not dry_run:
                _remove_tree(loc)
    for name in RESULTS:
        _remove_partitions(output.join(name), before, done, dry_run)
    # The indexes last, as a publish writes them last.
    for name in RESULTS:
        done.index_entries += _prune_index(output.join(name), before, dry_run)
    _remove_partitions(output.join(RUN_TABLE), before, done, dry_run)
    cutoff = datetime(before.year, before.month, before.day, tzinfo=UTC)
    for area in ("_manifests", "_claims"):
        loc = output.join(area)
        for path in storage.list_files(loc):
            if path.endswith(commits.RETRY_INTENT_SUFFIX):
                continue  # a retry a killed run left half done: the next claim finishes it
            if _modified(loc, path) < cutoff:
                done.files.append(path)
                remove(storage.Location(loc.fs, path, loc.scheme))


def _partitions(dataset: storage.Location, before: date) -> list[storage.Location]:
    """The dataset's ``run_date=`` folders of dates before ``before``."""
    return [
        storage.Location(dataset.fs, folder, dataset.scheme)
        for folder in storage.list_dirs(dataset)
        if (day := commits.partition_date(posixpath.basename(folder))) and day < before
    ]


def _staged(dataset: storage.Location, before: date) -> list[storage.Location]:
    """The dataset's staging folders of run dates before ``before``."""
    root = commits.CommittedDataset(dataset).staging_root()
    return [
        storage.Location(root.fs, folder, root.scheme)
        for folder in storage.list_dirs(root)
        # A folder that is not a run date (a stray backup/) is not overnight's: left alone.
        if commits._is_date(name := posixpath.basename(folder))
        and date.fromisoformat(name) < before
    ]


def _files(folders: list[storage.Location]) -> list[str]:
    return [p for loc in folders for p in storage.list_files(loc, ".parquet")]


def _remove_partitions(
    dataset: storage.Location, before: date, done: Vacuumed, dry_run: bool
) -> None:
    for loc in _partitions(dataset, before):
        done.partitions.append(storage.scrub_secrets(loc.url()))
        if not dry_run:
            _remove_tree(loc)


def _prune_items(dataset: storage.Location, items: set[str], dry_run: bool) -> list[str]:
    """A flat dataset's rows of ``items`` removed: files wholly of those items deleted, a
    file mixing others rewritten without them (atomically, under its own name)."""
    removed = []
    for path in storage.list_files(dataset, ".parquet") if items else []:
        loc = storage.Location(dataset.fs, path, dataset.scheme)
        table = _table(dataset, path)
        old = pc.is_in(table["item_id"], pa.array(sorted(items), pa.string()))
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
    for path in commits.CommittedDataset(dataset).index_segments():
        table = _table(dataset, path)
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
