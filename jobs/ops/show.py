"""``overnight show OUTPUT``: what a run wrote, as a person reads it, or as JSON.

Transcripts print as a dialogue, one speaker label per turn, when the recording's channels
were transcribed apart (``channel_labels`` or ``--split-channels``), else as wrapped text;
document results print their task, label, text or JSON. Failed items print their error code
and message. Everything is read through ``jobs.dataset.storage``, so an ``s3://`` or ``gs://`` output
reads like a folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import json
import re
import shutil
import textwrap
from dataclasses import dataclass
from typing import Any

import pyarrow.parquet as pq

from overnight.jobs.dataset import storage
from overnight.jobs.dataset.commits import CommittedDataset
from overnight.jobs.errors import InputNotFound
from overnight.jobs.run.console import printable

# The datasets a run writes under OUTPUT, in the order they are shown.
DATASETS = ("transcripts", "results")
_TABLES = {b"transcripts": "transcripts", b"document_results": "results"}
_COMMON = [
    "item_id",
    "source_uri",
    "tenant",
    "external_id",
    "status",
    "error_code",
    "error_message",
    "run_id",
    "processed_at",
]
COLUMNS = {
    "transcripts": [*_COMMON, "text", "segments", "duration_s", "language", "channel_labels"],
    "results": [
        *_COMMON,
        "source_item_id",
        "task",
        "label",
        "label_score",
        "output_text",
        "output_json",
    ],
}


@dataclass(frozen=True)
class Turn:
    """What one speaker said before the other spoke (or the whole text of a mono call)."""

    speaker: str | None
    start: float | None
    text: str


def turns(row: dict[str, Any]) -> list[Turn]:
    """A transcript row's dialogue: its segments in time order, consecutive segments of one
    speaker joined into one turn. Without speaker labels, one turn of the row's text."""
    segments = [s for s in row.get("segments") or [] if (s.get("text") or "").strip()]
    if not any(s.get("speaker") for s in segments):
        text = (row.get("text") or "").strip()
        return [Turn(None, None, text)] if text else []
    out: list[Turn] = []
    for seg in sorted(segments, key=lambda s: (s.get("start") or 0.0, s.get("channel") or 0)):
        text = seg["text"].strip()
        if out and out[-1].speaker == seg.get("speaker"):
            out[-1] = Turn(out[-1].speaker, out[-1].start, _join(out[-1].text, text))
        else:
            out.append(Turn(seg.get("speaker"), seg.get("start"), text))
    return out


# A redaction tag that ends one segment's text (punctuation after it allowed), and one that
# starts the next's.
_TAG_AT_END = re.compile(r"(\[[A-Z_]+\])[\s.,;:!?]*$")
_TAG_AT_START = re.compile(r"^(\[[A-Z_]+\])")


def _join(before: str, after: str) -> str:
    """Two segments of one speaker's turn. A number read across the segments' edge is one
    entity, tagged in each segment: joined, the turn said "is [SSN]. [SSN]," for one SSN, as
    the row's ``text`` does not (``workers.redact.redactor``). The same tag on both sides of
    the edge with only punctuation between reads once."""
    end, start = _TAG_AT_END.search(before), _TAG_AT_START.match(after)
    if end and start and end.group(1) == start.group(1):
        return f"{before[: end.start()]}{after}"
    return f"{before} {after}"


def spoken_text(row: dict[str, Any]) -> str:
    """The words of a transcript in dialogue order, without speaker labels (for a WER)."""
    return " ".join(t.text for t in turns(row))


def width() -> int:
    """Columns to wrap at: the terminal's, within reason (100 when not a terminal)."""
    return max(60, min(140, shutil.get_terminal_size((100, 24)).columns))


def wrap_turns(items: list[Turn], cols: int, indent: str = "  ") -> list[str]:
    """Turns as lines wrapped at word boundaries: ``speaker  text`` with the text's
    continuation lines aligned under its first word, or plain paragraphs."""
    if not any(t.speaker for t in items):
        return [
            line
            for t in items
            for line in textwrap.wrap(t.text, cols, initial_indent=indent, subsequent_indent=indent)
        ]
    label = max(len(t.speaker or "") for t in items)
    lines = []
    for t in items:
        head = f"{indent}{_clock(t.start)}  {(t.speaker or '?'):<{label}}  "
        lines += textwrap.wrap(
            t.text, cols, initial_indent=head, subsequent_indent=" " * len(head)
        ) or [head.rstrip()]
    return lines


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "     "
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes:02d}:{secs:02d}"


# -- reading -------------------------------------------------------------------------------


def locate(output: str) -> list[tuple[str, storage.Location]]:
    """The result datasets of ``output`` (OUTPUT, or OUTPUT/transcripts or OUTPUT/results
    itself); ``InputNotFound`` when it holds none."""
    shown = storage.scrub_secrets(output)
    try:
        loc = storage.resolve(output)
        found = [
            (name, loc.join(name))
            for name in DATASETS
            if storage.list_files(loc.join(name), ".parquet")
        ]
        if not found:
            own = [
                f
                for f in storage.list_files(loc, ".parquet")
                if "/_" not in f[len(loc.path) :] and "/runs/" not in f[len(loc.path) :]
            ]
            if own:
                with loc.fs.open(own[0], "rb") as f:
                    table = (pq.read_schema(f).metadata or {}).get(b"overnight.table")
                if table in _TABLES:
                    found = [(_TABLES[table], loc)]
    except (FileNotFoundError, NotADirectoryError, PermissionError) as exc:
        raise InputNotFound(f"cannot read {shown!r}: {exc.strerror or exc}") from None
    if not found:
        raise InputNotFound(
            f"no transcripts or results under {shown!r}: give the OUTPUT folder or prefix "
            "of a transcribe or process run"
        )
    return found


@dataclass
class Selection:
    source: str | None = None
    item: str | None = None
    status: str | None = None
    task: str | None = None
    # ``source`` as a glob; off when it is some source's own name (``read``).
    glob: bool = True

    def describe(self) -> str:
        parts = [
            f"--{k} {v}"
            for k, v in (
                ("source", self.source),
                ("item", self.item),
                ("status", self.status),
                ("task", self.task),
            )
            if v
        ]
        return " ".join(parts) or "(no filter)"

    def matches(self, row: dict[str, Any]) -> bool:
        if self.status and row["status"] != self.status:
            return False
        if self.task and row.get("task") != self.task:
            return False
        if self.item and not any(
            (row.get(k) or "").startswith(self.item) for k in ("item_id", "source_item_id")
        ):
            return False
        return not self.source or _source_matches(row, self.source, self.glob)


def _is_glob(name: str) -> bool:
    return any(ch in name for ch in "*?[")


def _named(row: dict[str, Any], name: str) -> bool:
    """``name`` is the row's source URI, file name (with or without extension) or external id."""
    uri = row["source_uri"] or ""
    base = uri.rsplit("/", 1)[-1]
    return name in (uri, base, base.rsplit(".", 1)[0], row.get("external_id"))


def _source_matches(row: dict[str, Any], name: str, glob: bool = True) -> bool:
    if _named(row, name):
        return True
    uri = row["source_uri"] or ""
    base = uri.rsplit("/", 1)[-1]
    return (
        glob
        and _is_glob(name)
        and (fnmatch.fnmatchcase(base, name) or fnmatch.fnmatchcase(uri, name))
    )


def _distinct(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` without the copies of a row: the same item, task, run and commit time can only
    be one row read twice (a part file copied beside itself), so it is shown and counted once."""
    seen: set[tuple[Any, ...]] = set()
    out = []
    for row in rows:
        key = (row["item_id"], row.get("task"), row["run_id"], row["processed_at"])
        if key not in seen:
            seen.add(key)
            out.append(row)
    return out


def read(output: str, selection: Selection) -> dict[str, tuple[list[dict[str, Any]], int]]:
    """Matching rows per dataset, in source order, and how many rows each dataset holds."""
    out: dict[str, tuple[list[dict[str, Any]], int]] = {}
    every: dict[str, list[dict[str, Any]]] = {}
    for name, loc in locate(output):
        table = CommittedDataset(loc).read_results(COLUMNS[name])
        every[name] = _distinct(table.to_pylist()) if table is not None else []
    source = selection.source
    if source and _is_glob(source):
        # A source's own name selects it, glob characters and all (`glob[*]?.wav`), and
        # only it: such a name read as a glob may match others, or not even itself.
        named = any(_named(r, source) for rows in every.values() for r in rows)
        selection = dataclasses.replace(selection, glob=not named)
    for name, rows in every.items():
        picked = [r for r in rows if selection.matches(r)]
        picked.sort(
            key=lambda r: (r["source_uri"] or "", r.get("task") or "", str(r["processed_at"]))
        )
        out[name] = (picked, len(rows))
    if not any(rows for rows, _ in out.values()):
        held = ", ".join(f"{total} {name}" for name, (_, total) in out.items())
        raise InputNotFound(
            f"nothing in {storage.scrub_secrets(output)!r} matches {selection.describe()} ({held})"
        )
    return out


# -- printing ------------------------------------------------------------------------------


def render_transcript(row: dict[str, Any], cols: int) -> list[str]:
    name = (row["source_uri"] or "").rsplit("/", 1)[-1]
    facts = [row["status"]]
    if row["status"] == "ok" and row.get("duration_s") is not None:
        facts.append(f"{row['duration_s']:.1f} s")
    if row.get("language"):
        facts.append(row["language"])
    if row.get("degenerate"):  # not what was said: the reader must know before reading
        facts.append("degenerate (the model looped; the repetition is cut)")
    lines = [f"{name}  {'  '.join(facts)}  ({_provenance(row)})"]
    if row["status"] != "ok":
        return lines + _error_lines(row, cols)
    dialogue = turns(row)
    return lines + (wrap_turns(dialogue, cols) if dialogue else ["  (no speech)"])


def render_result(row: dict[str, Any], cols: int) -> list[str]:
    name = (row["source_uri"] or "").rsplit("/", 1)[-1]
    lines = [f"{name}  {row.get('task') or '?'}  {row['status']}  ({_provenance(row)})"]
    if row["status"] != "ok":
        return lines + _error_lines(row, cols)
    if row.get("label") is not None:
        score = f" ({row['label_score']:.2f})" if row.get("label_score") is not None else ""
        lines.append(f"  label: {row['label']}{score}")
    if row.get("output_json"):
        try:
            pretty = json.dumps(json.loads(row["output_json"]), indent=2, ensure_ascii=False)
        except ValueError:
            pretty = row["output_json"]
        lines += ["  " + line for line in pretty.splitlines()]
    elif row.get("output_text") and (row.get("label") is None):
        for paragraph in row["output_text"].strip().split("\n"):
            lines += textwrap.wrap(
                paragraph, cols, initial_indent="  ", subsequent_indent="  "
            ) or [""]
    return lines


def _provenance(row: dict[str, Any]) -> str:
    parts = [f"item {row['item_id'][:12]}", f"run {row['run_id']}"]
    if row.get("tenant"):
        parts.append(f"tenant {row['tenant']}")
    if row.get("external_id"):
        parts.append(f"id {row['external_id']}")
    return ", ".join(parts)


def _error_lines(row: dict[str, Any], cols: int) -> list[str]:
    text = f"error {row.get('error_code') or 'unknown'}: {row.get('error_message') or ''}"
    return textwrap.wrap(text.strip(), cols, initial_indent="  ", subsequent_indent="    ")


def as_json(name: str, row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"dataset": name}
    for key, value in row.items():
        if key == "segments":
            continue
        if key == "output_json" and value:
            with contextlib.suppress(ValueError):  # kept as text when it is not JSON
                value = json.loads(value)
        out[key] = value.isoformat() if hasattr(value, "isoformat") else value
    if name == "transcripts":
        out["turns"] = [
            {"speaker": t.speaker, "start": t.start, "text": t.text} for t in turns(row)
        ]
    return out


def render(found: dict[str, tuple[list[dict[str, Any]], int]], limit: int, cols: int) -> str:
    blocks = []
    for name, (rows, total) in found.items():
        if not rows:
            continue
        shown = rows[:limit] if limit else rows
        head = f"{name}: {len(rows)} of {total} rows"
        if len(shown) < len(rows):
            head += f", the first {len(shown)} shown (--limit 0 shows all)"
        blocks.append(head)
        render_row = render_transcript if name == "transcripts" else render_result
        blocks += ["\n".join(printable(line) for line in render_row(row, cols)) for row in shown]
    return "\n\n".join(blocks)
