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

What a night that stays holds is never removed, whoever marked it: a run id it also has (a
fixed ``run_id = "nightly"``) keeps its summary and manifest, and a recording a kept run
transcribed again keeps that run's original and its FLAC. An intent names the original rows
it removes by run and recording, and the kept nights are read when it is carried out, so a
leftover intent finished after later runs takes nothing of theirs.

Not while a job writes to OUTPUT: vacuum rewrites index segments a running publish also merges.
"""

from __future__ import annotations

import io
import json
import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from overnight.jobs.dataset import commits, storage
from overnight.jobs.dataset.manifest import OUTPUT_FOLDERS
from overnight.jobs.errors import ConfigError, InputNotFound
from overnight.jobs.redaction import AUDIO_FOLDER, UNREDACTED_DATASET, audio_name

RESULTS = ("transcripts", "results", "probes", "costs")
RUN_TABLE = "run_table"
INTENT = "_vacuum.json"
# What of OUTPUT is overnight's besides OUTPUT_FOLDERS: a folder holding none of these is not
# an output, and vacuum says so rather than "removed 0 partition(s)".
_BOOKKEEPING = ("_manifests", "_claims", "_staging", INTENT)
# Whole days or weeks: a night is the unit vacuum removes, and "3m" (months? minutes?) read
# as minutes kept only today.
_SPAN = re.compile(r"(\d+)\s*([dw])", re.IGNORECASE)
LISTED = 20  # files named one by one before "and N more" (a night can hold thousands of FLACs)


def cutoff(text: str, flag: str = "--older-than", today: date | None = None) -> date:
    """The first run date a retention span of ``text`` (``90d``, ``12w``) back from ``today``
    (UTC) keeps; ``ConfigError`` for anything but whole days or weeks."""
    match = _SPAN.fullmatch(str(text).strip())
    days = int(match[1]) * (7 if match[2].lower() == "w" else 1) if match else 0
    if not match or days == 0:
        raise ConfigError(
            f"{flag} {text!r} is not a retention span: give whole days or weeks of at least "
            "one day, as 90d or 13w (vacuum removes whole nights; a month is about 30d)"
        )
    today = today or datetime.now(UTC).date()
    try:
        return today - timedelta(days=days)
    except OverflowError:  # before the year 1: no date can hold it
        raise ConfigError(
            f"{flag} {text!r} reaches back before the year 1; give at most "
            f"{(today - date.min).days}d"
        ) from None


@dataclass
class Vacuumed:
    """What vacuum removed (or, in a dry run, would remove): paths and counts."""

    before: date
    partitions: list[str] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)  # run ids whose summaries went
    files: list[str] = field(default_factory=list)  # every other file removed
    index_entries: int = 0
    # The intent an interrupted vacuum left, finished with this one: its URL and cutoff.
    resumed: tuple[str, date] | None = None
    output: str = ""  # OUTPUT as given (credentials scrubbed), to name the summaries
    scheme: str = "file"  # ``files`` are paths in the store: its scheme makes them URLs

    def describe(self, dry_run: bool) -> str:
        verb = "would remove" if dry_run else "removed"
        finished = ""
        if self.resumed:
            url, before = self.resumed
            finished = (
                f"{'would finish' if dry_run else 'finished'} the vacuum before {before} that "
                f"was interrupted (its intent {url}: what it marked goes too) and "
            )
        return (
            f"vacuum before {self.before}: {finished}{verb} {len(self.partitions)} "
            f"partition(s), {len(self.runs)} run summary(ies), {self.index_entries} index "
            f"entr(ies) and {len(self.files)} other file(s)"
        )

    def listing(self, limit: int = LISTED) -> list[str]:
        """What went, a line each: every partition, then the run summaries and the other
        files up to ``limit``, then how many more there are."""
        named = [f"{self.output.rstrip('/')}/runs/{run}.json" for run in self.runs]
        urls = (p if self.scheme == "file" else f"{self.scheme}://{p}" for p in self.files)
        named += [storage.one_line(storage.scrub_secrets(url)) for url in urls]
        more = [f"... and {len(named) - limit} more file(s)"] if len(named) > limit else []
        return [*self.partitions, *named[:limit], *more]


class _DamagedIntent(ValueError):
    """The intent file does not read as one (cut short, empty, keys missing)."""


@dataclass
class _Marked:
    """The intent: the cutoff, and what only the files being removed can tell."""

    before: date
    runs: set[str] = field(default_factory=set)  # run ids dated before the cutoff
    # The recordings of the transcripts/ rows that go, by the run that wrote them: the rows of
    # transcripts_unredacted/ to remove are these, never another run's of the same recording.
    rows: dict[str, set[str]] = field(default_factory=dict)
    audio: set[str] = field(default_factory=set)  # those recordings' FLAC names

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "before": self.before.isoformat(),
                "runs": sorted(self.runs),
                "rows": {run: sorted(items) for run, items in sorted(self.rows.items())},
                "audio": sorted(self.audio),
            }
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> _Marked:
        try:
            plan = json.loads(data)
            if not isinstance(plan, dict):
                raise _DamagedIntent("not a JSON object")
            missing = [k for k in ("before", "runs", "audio") if k not in plan]
            if "rows" not in plan and "items" not in plan:
                missing.append("rows")
            if missing:
                raise _DamagedIntent(f"no {', '.join(map(repr, missing))}")
            runs, audio = _strings(plan["runs"]), _strings(plan["audio"])
            if "rows" in plan:
                if not isinstance(plan["rows"], dict):
                    raise _DamagedIntent("'rows' is not a JSON object")
                rows = {str(run): _strings(items) for run, items in plan["rows"].items()}
            else:
                # An intent of an older overnight: its recordings, not by run; its runs'
                # rows of them are what it meant (one set, shared, not a copy per run).
                items = _strings(plan["items"])
                rows = dict.fromkeys(runs, items)
            return cls(date.fromisoformat(plan["before"]), runs, rows, audio)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise _DamagedIntent(f"not JSON: {exc}") from None
        except (TypeError, ValueError) as exc:
            if isinstance(exc, _DamagedIntent):
                raise
            raise _DamagedIntent(f"a value is not what vacuum writes: {exc}") from None

    def merge(self, left: _Marked) -> None:
        self.runs |= left.runs
        for run, items in left.rows.items():
            # Shared where this vacuum marked none of the run's (an older intent's one set).
            self.rows[run] = self.rows[run] | items if run in self.rows else items
        self.audio |= left.audio


def _strings(value: object) -> set[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _DamagedIntent(f"{str(value)[:60]!r} is not a list of strings")
    return set(value)


@dataclass
class _Kept:
    """What the nights that stay hold of what the intent names: their runs (a run id used on
    more than one night), and their rows and FLACs of the marked recordings (a recording a
    kept run transcribed again, after its old night's index entry went)."""

    runs: set[str]
    rows: set[tuple[str, str]]  # (item_id, run_id)
    audio: set[str]


def vacuum(output_url: str, before: date, dry_run: bool = False) -> Vacuumed:
    """Remove everything dated before ``before`` from OUTPUT (see the module docstring)."""
    output = storage.resolve(output_url)
    shown = storage.scrub_secrets(output_url)
    if not storage.exists(output):  # a typo must not leave a new, empty OUTPUT behind
        raise InputNotFound(
            f"{shown!r} does not exist: nothing to vacuum (give the "
            "OUTPUT folder or prefix of a transcribe or process run)"
        )
    storage.refuse_a_file_as_output(output, shown)
    top = {posixpath.basename(p.rstrip("/")) for p in storage.list_dirs(output)}
    top |= {posixpath.basename(p) for p in storage.list_top_files(output)}
    if not top & {*OUTPUT_FOLDERS, *_BOOKKEEPING}:
        raise InputNotFound(
            f"{shown!r} is not an overnight output: it holds none of "
            f"{', '.join(f'{n}/' for n in OUTPUT_FOLDERS)}, so there is nothing of overnight's "
            "to vacuum (give the OUTPUT folder or prefix of a transcribe or process run)"
        )
    intent = output.join(INTENT)
    # A killed vacuum's intent is finished with this one: what it marked, up to its cutoff.
    left = _read_intent(intent) if storage.exists(intent) else None
    marked = _mark(output, max(before, left.before) if left else before)
    if left:
        marked.merge(left)
    if not dry_run:
        storage.write_bytes_atomic(intent, marked.to_json())
    done = Vacuumed(marked.before, output=shown, scheme=output.scheme)
    if left:
        done.resumed = (storage.scrub_secrets(intent.url()), left.before)
    _sweep(output, marked, done, dry_run)
    if not dry_run:
        storage.delete(intent)
    return done


def _read_intent(intent: storage.Location) -> _Marked:
    try:
        return _Marked.from_json(storage.read_location(intent))
    except _DamagedIntent as exc:
        shown = storage.one_line(storage.scrub_secrets(intent.url()))
        raise InputNotFound(
            f"{shown} is damaged ({storage.one_line(str(exc))[:200]}): it is the list an "
            "interrupted vacuum left of what it still had to remove, and no vacuum can finish "
            "it. Delete it and vacuum again to start over: what is dated before the new cutoff "
            "still goes, but the originals (transcripts_unredacted/), FLACs (redacted_audio/) "
            "and runs/ summaries of nights whose partitions the interrupted vacuum had already "
            "removed are then no longer known, and stay until removed by hand."
        ) from None


def _table(where: storage.Location, path: str, columns: list[str] | None = None) -> pa.Table:
    """A Parquet file vacuum reads; one that is damaged stops it naming the file (exit 4),
    before anything is removed, where it was a traceback. So does one that is readable but
    lacks ``columns``: not overnight's, and vacuum would delete it with its run date's folder."""
    table, why = _read(where, path, columns, columns or [])
    if table is None:
        raise InputNotFound(
            f"{storage.one_line(storage.scrub_secrets(path))} is a Parquet file but not "
            f"overnight's ({why}): vacuum removes a run date's folder whole and would delete it "
            "with it. Move it out of the output and vacuum again; nothing was removed."
        )
    return table


def _own(
    where: storage.Location, path: str, columns: list[str] | None, need: list[str]
) -> pa.Table | None:
    """As ``_table``, for a file vacuum leaves in place (a night that stays, the flat
    originals): one that lacks ``need`` is not overnight's and is skipped with a warning, as
    report and show skip it (None)."""
    table, why = _read(where, path, columns, need)
    if table is None:
        commits._skipped(path, why)
    return table


def _read(
    where: storage.Location, path: str, columns: list[str] | None, need: list[str]
) -> tuple[pa.Table | None, str]:
    with commits.read_or_name(path), where.fs.open(path, "rb") as f:
        pf = pq.ParquetFile(f)
        lacking = [c for c in need if c not in pf.schema_arrow.names]
        if lacking:
            return None, f"it has no column {lacking[0]!r}"
        return pf.read(columns=columns), ""


def _mark(output: storage.Location, before: date) -> _Marked:
    """Read (only) what the intent must hold: the runs ``run_table/`` dates before the
    cutoff, and the recordings of the ``transcripts/`` rows that go (published or staged)
    where their originals or redacted audio were kept."""
    marked = _Marked(before)
    for path in _files(_partitions(output.join(RUN_TABLE), before)):
        marked.runs.update(_column(output, path, "run_id"))
    unredacted = storage.list_files(output.join(UNREDACTED_DATASET), ".parquet")
    flacs = {posixpath.basename(p) for p in storage.list_top_files(output.join(AUDIO_FOLDER))}
    if not unredacted and not flacs:
        return marked
    transcripts = output.join("transcripts")
    for path in _files([*_partitions(transcripts, before), *_staged(transcripts, before)]):
        rows = _table(output, path, ["item_id", "run_id", "source_uri"]).to_pylist()
        if unredacted:
            for r in rows:
                marked.rows.setdefault(r["run_id"], set()).add(r["item_id"])
        marked.audio.update(name for name in map(audio_name, rows) if name in flacs)
    return marked


def _column(where: storage.Location, path: str, name: str, removed: bool = True) -> list[str]:
    table = _table(where, path, [name]) if removed else _own(where, path, [name], [name])
    return [] if table is None else table[name].to_pylist()


def _kept(output: storage.Location, marked: _Marked) -> _Kept:
    """Read what the nights from the cutoff on hold of what ``marked`` names (see _Kept)."""
    runs = set()
    for path in _files(_partitions(output.join(RUN_TABLE), marked.before, kept=True)):
        runs.update(_column(output, path, "run_id", removed=False))
    items = set().union(*marked.rows.values())
    rows, audio = set(), set()
    if items or marked.audio:
        transcripts = output.join("transcripts")
        folders = [
            *_partitions(transcripts, marked.before, kept=True),
            *_staged(transcripts, marked.before, kept=True),
        ]
        for path in _files(folders):
            columns = ["item_id", "run_id", "source_uri"]
            table = _own(output, path, columns, columns)
            for r in [] if table is None else table.to_pylist():
                if r["item_id"] in items:
                    rows.add((r["item_id"], r["run_id"]))
                if (name := audio_name(r)) in marked.audio:
                    audio.add(name)
    return _Kept(runs, rows, audio)


def _sweep(output: storage.Location, marked: _Marked, done: Vacuumed, dry_run: bool) -> None:
    """Carry out the intent; every step removes only what is still there, and nothing that a
    night from the cutoff on still holds (``_Kept``)."""

    def remove(loc: storage.Location) -> None:
        if not dry_run:
            storage.delete(loc)

    before = marked.before
    kept = _kept(output, marked)

    def goes(item: str, run: str) -> bool:
        return item in marked.rows.get(run, ()) and (item, run) not in kept.rows

    # Personal data in clear first: the originals, and the recordings the redaction was for.
    done.files += _prune_items(output.join(UNREDACTED_DATASET), marked, goes, dry_run)
    audio = output.join(AUDIO_FOLDER)
    for path in storage.list_top_files(audio):  # one listing, not a request per recording
        if (name := posixpath.basename(path)) in marked.audio and name not in kept.audio:
            done.files.append(path)
            remove(storage.Location(audio.fs, path, audio.scheme))
    # A run id on a night that stays (a fixed run_id = "nightly") keeps its summary and
    # manifest: they are that night's now, and its report would miss them.
    for run_id in sorted(marked.runs - kept.runs):
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
    kept_manifests = {f"{run}.parquet" for run in kept.runs}
    listed = set(done.files)
    for area in ("_manifests", "_claims"):
        loc = output.join(area)
        for path in storage.list_files(loc):
            if path.endswith(commits.RETRY_INTENT_SUFFIX):
                continue  # a retry a killed run left half done: the next claim finishes it
            if area == "_manifests" and posixpath.basename(path) in kept_manifests:
                continue
            if path in listed:
                continue  # a marked run's manifest, counted above (a dry run left it there)
            if _modified(loc, path) < cutoff:
                done.files.append(path)
                remove(storage.Location(loc.fs, path, loc.scheme))


def _partitions(
    dataset: storage.Location, before: date, kept: bool = False
) -> list[storage.Location]:
    """The dataset's ``run_date=`` folders of dates before ``before`` (``kept``: from it on)."""
    return [
        storage.Location(dataset.fs, folder, dataset.scheme)
        for folder in storage.list_dirs(dataset)
        if (day := commits.partition_date(posixpath.basename(folder))) and (day < before) != kept
    ]


def _staged(dataset: storage.Location, before: date, kept: bool = False) -> list[storage.Location]:
    """The dataset's staging folders of run dates before ``before`` (``kept``: from it on)."""
    root = commits.CommittedDataset(dataset).staging_root()
    return [
        storage.Location(root.fs, folder, root.scheme)
        for folder in storage.list_dirs(root)
        # A folder that is not a run date (a stray backup/) is not overnight's: left alone.
        if commits._is_date(name := posixpath.basename(folder))
        and (date.fromisoformat(name) < before) != kept
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


def _prune_items(
    dataset: storage.Location,
    marked: _Marked,
    goes: Callable[[str, str], bool],
    dry_run: bool,
) -> list[str]:
    """A flat dataset's rows that ``goes`` removed: files wholly of them deleted, a file
    mixing others rewritten without them (atomically, under its own name)."""
    items = set().union(*marked.rows.values())
    removed = []
    for path in storage.list_files(dataset, ".parquet") if items else []:
        loc = storage.Location(dataset.fs, path, dataset.scheme)
        table = _own(dataset, path, None, ["item_id", "run_id"])
        if table is None:
            continue
        # The recordings' rows first, in Arrow; only those are looked at one by one.
        candidate = pc.is_in(table["item_id"], pa.array(sorted(items), pa.string()))
        if not pc.any(candidate).as_py():
            continue
        pairs = zip(table["item_id"].to_pylist(), table["run_id"].to_pylist(), strict=True)
        old = pa.array(
            [
                bool(c) and goes(i, r)
                for c, (i, r) in zip(candidate.to_pylist(), pairs, strict=True)
            ],
            pa.bool_(),
        )
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
