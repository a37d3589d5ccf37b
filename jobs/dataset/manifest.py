"""Item ids, run manifests, and the set of items already committed (resume).

An item is one input object as listed: its id hashes the URI, the size and the ETag (or mtime)
plus the submission/external ids, so a rerun recognises it and a replaced object is new work.
An object that is missing when listed has no size or ETag: its record also carries that
"missing" id (``missing_id``), under which a row recorded while it was missing stands for the
same manifest row once the object is back (done; ``--retry-errors`` redoes it), so that a
restored object is not a second item beside its ``fetch_failed`` row.
"""

from __future__ import annotations

import csv
import fnmatch
import hashlib
import io
import json
import posixpath
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from overnight.jobs.dataset import storage
from overnight.jobs.errors import ConfigError, InputNotFound
from overnight.schemas import MANIFEST, METADATA_COLUMNS
from overnight.workers.analytics import speaker_names_problem

MANIFEST_SUFFIXES = (".csv", ".jsonl", ".parquet")
# Per-item decoding vocabulary: a non-empty value overrides the job's option of that name.
PROMPT_COLUMNS: tuple[str, ...] = ("hotwords", "initial_prompt")
_KNOWN = {"uri", "language", "channel_labels", *PROMPT_COLUMNS, *METADATA_COLUMNS}


def item_id(
    uri: str,
    size: int | None,
    etag: str | None,
    submission_id: str | None = None,
    external_id: str | None = None,
) -> str:
    key = "\n".join([uri, str(size), etag or "", submission_id or "", external_id or ""])
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def is_manifest(url: str) -> bool:
    return url.lower().endswith(MANIFEST_SUFFIXES)


def _read_manifest_records(url: str) -> list[dict[str, Any]]:
    storage.reach(url, f"the manifest {storage.scrub_secrets(url)}")  # may be the first contact
    data = storage.read_bytes(url)
    lower = url.lower()
    try:
        if lower.endswith(".parquet"):
            return pq.read_table(io.BytesIO(data)).to_pylist()
        text = data.decode("utf-8-sig")
        if lower.endswith(".csv"):
            return list(csv.DictReader(io.StringIO(text)))
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except (ValueError, pa.ArrowInvalid, UnicodeDecodeError) as exc:
        raise ConfigError(f"manifest {url!r} cannot be parsed: {exc}") from None


def _labels(value: Any) -> list[str] | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        parts = [p.strip() for p in value.replace(";", ",").split(",")]
        names = [p for p in parts if p]
    elif isinstance(value, list | tuple):
        names = [str(v) for v in value]
    else:
        raise ValueError(
            f"channel_labels must be text such as 'agent,customer' or a list of names, "
            f"not {value!r}"
        )
    problem = speaker_names_problem(names)
    if problem:
        raise ValueError(f"channel_labels: {problem}")
    return [name.strip() for name in names] or None


def _resolve_uri(uri: str, manifest_url: str) -> str:
    """The absolute URI of a manifest row; relative ones are relative to the manifest's folder.

    A local file has one spelling, the absolute normalised path (``file://`` dropped), the one
    folder listing gives: the item id hashes the URI, so the same recording read through a
    relative, absolute or ``file://`` manifest path must come out the same.
    """
    if "://" not in uri and not uri.startswith("/"):
        base = manifest_url.rsplit("/", 1)[0]
        uri = f"{base}/{uri}"
    if "://" not in uri or uri.startswith("file://"):
        return storage.resolve(uri).url()
    return uri


def records_from_manifest(url: str) -> list[dict[str, Any]]:
    """Manifest rows as item records (uri, size, etag, metadata); stats every object."""
    if "://" not in url or url.startswith("file://"):
        url = storage.resolve(url).url()  # absolute, so that relative rows resolve absolute
    rows = _read_manifest_records(url)
    if not rows:
        raise InputNotFound(f"manifest {url!r} has no rows")
    if "uri" not in rows[0]:
        raise ConfigError(f"manifest {url!r} needs a 'uri' column; it has {sorted(rows[0])}")
    uris = []
    for i, row in enumerate(rows):
        uri = str(row["uri"]).strip()
        if storage.looks_like_credentials(uri):
            # A presigned query string or a key in the URL would be written into
            # source_uri and the run's manifest, where no credential may go.
            raise ConfigError(
                f"manifest {url!r} row {i + 1}: its uri carries credentials "
                f"({storage.scrub_secrets(uri)!r}), which overnight would write into its "
                "outputs and does not read: give the plain s3:// or gs:// URI and the "
                "credentials in the environment (AWS_*, an instance profile or IRSA)"
            )
        try:
            _labels(row.get("channel_labels"))
        except ValueError as exc:
            raise ConfigError(f"manifest {url!r} row {i + 1}: {exc}") from None
        uris.append(_resolve_uri(uri, url))
    infos = storage.map_threads(storage.stat, uris)
    return [
        _record(row, uri, info.size, info.etag)
        for row, uri, info in zip(rows, uris, infos, strict=True)
    ]


def _record(row: dict[str, Any], uri: str, size: int | None, etag: str | None) -> dict[str, Any]:
    def text(key: str) -> str | None:
        value = row.get(key)
        return None if value is None or value == "" else str(value)

    extra = {str(k): "" if v is None else str(v) for k, v in row.items() if k not in _KNOWN}
    record = {
        "uri": uri,
        "size": size,
        "etag": etag,
        **{key: text(key) for key in METADATA_COLUMNS},
        "metadata": sorted(extra.items()) or None,
        "language": text("language"),
        "channel_labels": _labels(row.get("channel_labels")),
        **{key: text(key) for key in PROMPT_COLUMNS},
    }
    ids = (text("submission_id"), text("external_id"))
    record["item_id"] = item_id(uri, size, etag, *ids)
    record["missing_id"] = item_id(uri, None, None, *ids)  # see the module docstring
    return record


@dataclass(frozen=True)
class Selection:
    """Which files of a folder or prefix listing are items; a manifest's rows always are,
    and so is a single file named as the input.

    Without ``include`` globs a file is taken when its extension is one of ``extensions``
    (the job's known kinds: a transcript folder's ``librispeech_trans.txt`` is no
    recording); with them, when one matches. ``exclude`` globs then leave files out. A glob
    matches the path under the input or the file name, case-insensitively, and its ``*``
    crosses folders.
    """

    extensions: frozenset[str]
    # Names the skip reason ``not_<kind>_extension``: "media" or "document".
    kind: str
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    @classmethod
    def of(
        cls,
        extensions: Iterable[str],
        kind: str,
        include: Sequence[str] | None = None,
        exclude: Sequence[str] | None = None,
    ) -> Selection:
        return cls(
            frozenset(e.lower() for e in extensions),
            kind,
            tuple(g.lower() for g in include or ()),
            tuple(g.lower() for g in exclude or ()),
        )

    def skip_reason(self, relative: str) -> str | None:
        """Why the file at ``relative`` (its path under the input) is no item, or None."""
        path = relative.lower()
        name = posixpath.basename(path)

        def matches(globs: tuple[str, ...]) -> bool:
            return any(fnmatch.fnmatchcase(path, g) or fnmatch.fnmatchcase(name, g) for g in globs)

        if self.include:
            if not matches(self.include):
                return "not_included"
        elif posixpath.splitext(name)[1] not in self.extensions:
            return f"not_{self.kind}_extension"
        if matches(self.exclude):
            return "excluded"
        return None


@dataclass
class Listing:
    """The items of an input, and the files of a folder listing that are not items."""

    items: list[dict[str, Any]]
    # reason -> how many files; see Selection.skip_reason.
    skipped: dict[str, int] = field(default_factory=dict)
    # A few of the skipped paths (under the input), for the message that names them.
    skipped_examples: list[str] = field(default_factory=list)


def list_items(input_url: str, defaults: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """All items of an input: a manifest's rows, or every file under a folder/prefix/file."""
    return select_items(input_url, None, defaults).items


def select_items(
    input_url: str,
    selection: Selection | None,
    defaults: dict[str, Any] | None = None,
    output: str | None = None,
) -> Listing:
    """The items of an input: a manifest's rows, or the files under a folder or prefix that
    ``selection`` takes (None: every file), or the one file ``input_url`` names.

    A folder listing leaves out every file inside an overnight output (``INSIDE_OUTPUT``):
    the job's own ``output`` where it lies under the input, and any folder the listing
    shows holding an output's bookkeeping (``_manifests/*.parquet``, ``_claims/*.json``,
    ``_index/*/seg-*.parquet``).
    Else ``overnight process IN IN/out`` read back its own ``runs/*.json`` as documents, one
    more each run, and never reached "nothing to do".

    Duplicate items (the same object listed twice with the same ids) are kept once. A
    listing that leaves no item but skipped files is an ``InputNotFound`` that says why.
    """
    skipped: Counter[str] = Counter()
    examples: list[str] = []
    if is_manifest(input_url):
        records = records_from_manifest(input_url)
    else:
        root = storage.resolve(input_url).url().rstrip("/")
        records = []
        hidden: list[str] = []
        listed = storage.list_objects(input_url, hidden)
        outputs = _output_roots(hidden)
        mine = _output_under(input_url, output) if output is not None else None
        if mine is not None:
            outputs.add(mine)
        inside = 0
        for o in listed:
            relative = o.uri[len(root) :].lstrip("/") if o.uri.startswith(root) else o.uri
            if relative and _under(relative, outputs):
                inside += 1
                continue
            reason = selection.skip_reason(relative) if selection and relative else None
            if reason is not None:
                skipped[reason] += 1
                if len(examples) < 5:
                    examples.append(relative)
                continue
            records.append(_record(dict(defaults or {}), o.uri, o.size, o.etag))
        hidden_inside = [h for h in hidden if _under(h, outputs)]
        hidden = [h for h in hidden if not _under(h, outputs)]
        if hidden:
            # Left out without a row: the summary and the dry run say how many, and which.
            skipped[HIDDEN] = len(hidden)
            examples += hidden[:3]
        if inside or hidden_inside:
            # Counted with their bookkeeping; the examples name the output folders ("out/",
            # "" for the input itself), which skipped_lines tells apart by the slash.
            skipped[INSIDE_OUTPUT] = inside + len(hidden_inside)
            examples += [f"{r}/" for r in sorted(outputs)[:3]]
        if not records and skipped and selection is not None:
            kinds = _KINDS.get(selection.kind, selection.kind)
            if "" in outputs:  # the input is itself an output: say that, not its files
                raise InputNotFound(
                    f"input {storage.scrub_secrets(input_url)!r} holds no {kinds}: it is an "
                    f"overnight output folder ({skipped[INSIDE_OUTPUT]} files: results, run "
                    "summaries, bookkeeping), which is never input. Give the folder of the "
                    "files to read (`overnight process OUT OUT` reads a transcribe output's "
                    "transcripts as a dataset)."
                )
            if set(skipped) == {HIDDEN}:
                fix = "rename them (or their folder) to start otherwise"
            elif set(skipped) == {INSIDE_OUTPUT}:
                fix = "give the folder of the files to read, not one that holds only outputs"
            else:
                fix = "--include GLOB takes other files ('*': every file)"
            raise InputNotFound(
                f"input {storage.scrub_secrets(input_url)!r} holds no {kinds}: "
                f"{sum(skipped.values())} skipped ({_reasons(skipped)}), e.g. "
                f"{', '.join(examples[:3])}. {fix}"
            )
    seen: set[str] = set()
    unique = []
    for r in records:
        if r["item_id"] not in seen:
            seen.add(r["item_id"])
            unique.append(r)
    if len(unique) < len(records):
        # Said, not silent: "3 listed" of a manifest of 4 rows, the second row's metadata
        # (another tenant, other labels) dropped without a word.
        skipped[DUPLICATE_ROW] = len(records) - len(unique)
    return Listing(unique, dict(sorted(skipped.items())), examples)


_KINDS = {"media": "audio or video files", "document": "documents"}

# The skip reason of files whose name or folder starts with . or _ (storage.is_hidden).
HIDDEN = "hidden"
_HIDDEN_MEANS = "whose name or folder starts with . or _"
# The skip reason of manifest rows that repeat an earlier row's item (the same object and
# ids): the first row is the item, with its metadata.
DUPLICATE_ROW = "duplicate_row"
# The skip reason of files inside an overnight output folder under the input.
INSIDE_OUTPUT = "inside_output"
_INSIDE_OUTPUT_MEANS = "inside an overnight output folder"
# The files only an overnight output holds, its bookkeeping (write_manifest; the commits'
# claims and index), as their path under the output: a folder holding one is an output,
# whoever wrote it; a user's own ``_index/`` of other files is not.
_OUTPUT_MARKERS = (
    ("_manifests", "*.parquet"),
    ("_claims", "*.json"),
    ("_index", "*", "seg-*.parquet"),
)


def _output_roots(hidden: Iterable[str]) -> set[str]:
    """The folders (under the input; "" the input itself) that the hidden files of a
    listing show to be overnight outputs: those holding an ``_OUTPUT_MARKERS`` file."""
    roots = set()
    for relative in hidden:
        parts = relative.split("/")
        for marker in _OUTPUT_MARKERS:
            tail = parts[-len(marker) :]
            if len(parts) >= len(marker) and all(
                fnmatch.fnmatchcase(p, m) for p, m in zip(tail, marker, strict=True)
            ):
                roots.add("/".join(parts[: -len(marker)]))
    return roots


# What overnight writes under OUTPUT (docs/reference/outputs.md), beside its ``_`` bookkeeping.
OUTPUT_FOLDERS = (
    "transcripts",
    "results",
    "probes",
    "costs",
    "run_table",
    "runs",
    "transcripts_unredacted",
    "redacted_audio",
)


def _under(relative: str, roots: Iterable[str]) -> bool:
    """Whether ``relative`` is an output's file: anything under an output folder below the
    input, and where the input is itself an output (root ""), what that output writes (its
    ``OUTPUT_FOLDERS`` and ``_`` bookkeeping): ``overnight transcribe IN IN`` keeps the
    recordings beside them as items."""
    top = relative.split("/", 1)[0]
    return any(
        (top in OUTPUT_FOLDERS or top.startswith("_"))
        if r == ""
        else relative == r or relative.startswith(r + "/")
        for r in roots
    )


def _output_under(input_url: str, output_url: str) -> str | None:
    """Where ``output_url`` lies under ``input_url`` ("" the same folder), else None.

    Compared as the storage locations they resolve to: ``file://``, relative and ``..``
    spellings of a local folder are the same folder, and so are symlinked ones (their real
    paths); an object store's by bucket and key, ``s3://b/in`` never containing
    ``s3://b/input2``.
    """
    inp, out = storage.resolve(input_url).canonical(), storage.resolve(output_url).canonical()
    if inp.scheme != out.scheme:
        return None
    a, b = inp.path.rstrip("/"), out.path.rstrip("/")
    if b == a:
        return ""
    if b.startswith(a.rstrip("/") + "/"):
        return b[len(a.rstrip("/")) + 1 :]
    return None


def _reasons(skipped: Counter[str]) -> str:
    means = {HIDDEN: _HIDDEN_MEANS, INSIDE_OUTPUT: _INSIDE_OUTPUT_MEANS}
    return ", ".join(f"{n} {means.get(reason, reason)}" for reason, n in sorted(skipped.items()))


def skipped_lines(skipped: dict[str, int], examples: list[str]) -> list[str]:
    """The summary's and the dry run's lines on the files of a listing that are not items:
    those a selection left out, and apart, those never read for their name (``HIDDEN``)."""
    lines = []
    folders = [e for e in examples if e.endswith("/")]  # INSIDE_OUTPUT's output folders
    examples = [e for e in examples if not e.endswith("/")]
    chosen = {k: v for k, v in skipped.items() if k not in (HIDDEN, INSIDE_OUTPUT, DUPLICATE_ROW)}
    if chosen:
        n = sum(chosen.values())
        reasons = ", ".join(f"{v} {k}" for k, v in chosen.items())
        shown = ", ".join(e for e in examples if not storage.is_hidden(e))
        lines.append(
            f"skipped      {n} file{'s' if n != 1 else ''} of the listing ({reasons})"
            f"{': ' + shown + (', ...' if n > 5 else '') if shown else ''}; "
            "--include/--exclude GLOB choose the files"
        )
    if skipped.get(HIDDEN):
        n = skipped[HIDDEN]
        shown = ", ".join(e for e in examples if storage.is_hidden(e))
        lines.append(
            f"skipped      {n} file(s) {_HIDDEN_MEANS}"
            f"{' (e.g. ' + shown + (', ...' if n > 3 else '') + ')' if shown else ''}: such "
            "names are never input (they are bookkeeping: _manifests, _SUCCESS, .DS_Store)"
        )
    if skipped.get(DUPLICATE_ROW):
        n = skipped[DUPLICATE_ROW]
        lines.append(
            f"skipped      {n} manifest row(s) repeating an earlier row's item (the same uri, "
            "size and ids): each is one item, with the first row's metadata"
        )
    if skipped.get(INSIDE_OUTPUT):
        n = skipped[INSIDE_OUTPUT]
        where = ", ".join(f if f != "/" else "the input itself" for f in folders)
        lines.append(
            f"skipped      {n} file(s) {_INSIDE_OUTPUT_MEANS}{' (' + where + ')' if where else ''}: "
            "a job's results, run summaries and bookkeeping are never its input"
        )
    return lines


def manifest_table(records: Iterable[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(list(records), schema=MANIFEST)


def write_manifest(output: storage.Location, run_id: str, table: pa.Table) -> str:
    """OUTPUT/_manifests/<run_id>.parquet: what this run set out to do, the items in the
    ``schemas.MANIFEST`` columns. A stage's payload in the rows (the transcript text a
    process job over transcripts carries) is no part of it: a manifest holds no text, so a
    redacted output keeps no copy of its transcripts outside their dataset."""
    loc = output.join("_manifests", f"{run_id}.parquet")
    buf = io.BytesIO()
    pq.write_table(table.select(MANIFEST.names).cast(MANIFEST), buf)
    storage.write_bytes_atomic(loc, buf.getvalue())
    return loc.url()
