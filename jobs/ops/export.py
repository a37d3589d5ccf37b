"""``overnight export``: transcripts out of Parquet, one file a recording (SRT, WebVTT, text, JSON).

Reads OUTPUT/transcripts (the newest ok row of each item), writes ``DEST/<name>.<ext>`` for each
recording through ``jobs.dataset.storage`` (a local folder, ``s3://`` or ``gs://``), each file written
atomically, so a rerun overwrites instead of duplicating. Speaker labels (``agent``,
``customer``, or ``ch0``/``ch1``) lead every cue: WebVTT's voice span, SRT's ``speaker:``. WebVTT
text carries ``&``, ``<`` and ``>`` as character references (so ``AT&T <5`` and a spoken ``-->``
read back whole); SRT has no escapes and needs none. A large output is written by Ray tasks
(``RAY_THRESHOLD`` recordings and more), a small one by a thread pool on the driver.
"""

from __future__ import annotations

import functools
import html
import json
import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from overnight.jobs.choices import EXPORT_FORMATS as FORMATS
from overnight.jobs.dataset import storage
from overnight.jobs.errors import ConfigError, InputNotFound

COLUMNS = [
    "item_id",
    "source_uri",
    "status",
    "text",
    "segments",
    "duration_s",
    "language",
    "channel_labels",
    "run_id",
    "processed_at",
    "entities",  # null on rows of a job that did not redact (and in files before version 4)
    # JSON only; files of older schema versions lack them and read as null.
    "analytics",
    "degenerate",
    "speech_s",
]
RAY_THRESHOLD = 5000
# Subtitle convention: lines of at most 42 characters.
LINE_CHARS = 42


@dataclass(frozen=True)
class Cue:
    start: float
    end: float
    speaker: str | None
    text: str


def _spoken(row: Mapping[str, Any]) -> list[tuple[Mapping[str, Any], str | None, str]]:
    """Each segment with words, its speaker (the segment's, else its channel's label) and its
    stripped text, in time order (the two channels of a split call interleaved)."""
    labels = row.get("channel_labels") or []
    out = []
    for seg in row.get("segments") or []:
        text = (seg.get("text") or "").strip()
        if not text:
            continue
        speaker = seg.get("speaker")
        if not speaker and labels and seg.get("channel") is not None:
            channel = int(seg["channel"])
            speaker = labels[channel] if channel < len(labels) else f"ch{channel}"
        out.append((seg, speaker, text))
    return sorted(out, key=lambda t: (float(t[0]["start"]), float(t[0]["end"])))


def cues(row: Mapping[str, Any]) -> list[Cue]:
    """A transcript's segments as cues, in time order."""
    return [
        Cue(float(seg["start"]), float(seg["end"]), who, text) for seg, who, text in _spoken(row)
    ]


def _clock(seconds: float, sep: str) -> str:
    ms = max(0, round(seconds * 1000))
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def _lines(text: str) -> list[str]:
    # Breaks only at spaces: a hyphen or a long word (a URL) stays whole, so the lines joined
    # with spaces give the text back.
    return textwrap.wrap(text, LINE_CHARS, break_long_words=False, break_on_hyphens=False) or [text]


def to_srt(items: Iterable[Cue]) -> str:
    # SRT has no escapes: its parsers (srt, ffmpeg) take every line up to the blank one as
    # text, ``&``, ``<`` and ``-->`` included, and wrapping leaves no blank line inside a cue.
    blocks = []
    for n, c in enumerate(items, 1):
        text = f"{c.speaker}: {c.text}" if c.speaker else c.text
        body = "\n".join(_lines(text))
        blocks.append(f"{n}\n{_clock(c.start, ',')} --> {_clock(c.end, ',')}\n{body}\n")
    return "\n".join(blocks)


def _vtt_escape(text: str) -> str:
    """WebVTT cue text: ``&``, ``<`` and ``>`` as character references (the spec's escapes),
    which also keeps a ``-->`` in the words from reading as cue timings."""
    return html.escape(text, quote=False)


def to_vtt(items: Iterable[Cue]) -> str:
    blocks = ["WEBVTT\n"]
    for n, c in enumerate(items, 1):
        lines = [_vtt_escape(line) for line in _lines(c.text)]
        if c.speaker:
            # The voice span is WebVTT's own speaker label (players show it, parsers keep it);
            # its annotation is escaped like text and holds no line break.
            voice = _vtt_escape(" ".join(c.speaker.split()))
            lines[0] = f"<v {voice}>{lines[0]}"
            lines[-1] += "</v>"
        body = "\n".join(lines)
        blocks.append(f"{n}\n{_clock(c.start, '.')} --> {_clock(c.end, '.')}\n{body}\n")
    return "\n".join(blocks)


def to_txt(row: Mapping[str, Any]) -> str:
    items = cues(row)
    if not any(c.speaker for c in items):
        return textwrap.fill((row.get("text") or "").strip(), 100) + "\n"
    turns: list[list[Any]] = []
    for c in items:
        if turns and turns[-1][0] == c.speaker:
            turns[-1][2] += " " + c.text
        else:
            turns.append([c.speaker, c.start, c.text])
    return "".join(
        f"[{_clock(start, '.')[:-4]}] {speaker}: {text}\n" for speaker, start, text in turns
    )


def _json_words(words: list[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
    if words is None:
        return None
    return [
        {
            "word": w.get("word"),
            "start": w.get("start"),
            "end": w.get("end"),
            # float32 in the Parquet file: its binary tail is noise, not precision.
            "probability": None if w.get("probability") is None else round(w["probability"], 4),
        }
        for w in words
    ]


def to_json(row: Mapping[str, Any]) -> str:
    """The transcript as one JSON document: what the dialogue formats show, and what they cannot
    (word timings, the call's analytics, redacted entities' places, degenerate segments), so a
    consumer needs no Parquet reader. Keys whose column the job did not fill are null."""
    segments = [
        {
            "start": float(seg["start"]),
            "end": float(seg["end"]),
            "speaker": speaker,
            "channel": seg.get("channel"),
            "text": text,
            "degenerate": seg.get("degenerate"),
            "words": _json_words(seg.get("words")),
        }
        for seg, speaker, text in _spoken(row)
    ]
    entities = row.get("entities")
    doc = {
        "item_id": row["item_id"],
        "source_uri": storage.scrub_secrets(row["source_uri"]),
        "language": row.get("language"),
        "duration_s": row.get("duration_s"),
        "speech_s": row.get("speech_s"),
        "channel_labels": row.get("channel_labels"),
        "text": row.get("text"),
        "degenerate": row.get("degenerate"),
        "segments": segments,
        "analytics": row.get("analytics"),
        # Places only (the text carries the tags); null when the job did not redact.
        "entities": None
        if entities is None
        else [
            {**e, "score": None if e.get("score") is None else round(e["score"], 4)}
            for e in entities
        ],
        "run_id": row.get("run_id"),
    }
    return json.dumps(doc, ensure_ascii=False, indent=2) + "\n"


def render(row: Mapping[str, Any], fmt: str) -> str:
    if fmt == "srt":
        return to_srt(cues(row))
    if fmt == "vtt":
        return to_vtt(cues(row))
    if fmt == "txt":
        return to_txt(row)
    return to_json(row)


def file_names(rows: list[Mapping[str, Any]], fmt: str) -> list[str]:
    """``<source stem>.<fmt>``; recordings whose names collide keep them apart with their
    item id's first characters, and so does a stem cut to fit ``storage.NAME_MAX``."""
    stems = [PurePosixPath(str(r["source_uri"]).rstrip("/")).stem or "recording" for r in rows]
    tags = [f"-{str(r['item_id'])[:12]}" for r in rows]
    names = [storage.fitted_name(s, f".{fmt}", t) for s, t in zip(stems, tags, strict=True)]
    seen: dict[str, int] = {}
    for n in names:
        seen[n] = seen.get(n, 0) + 1
    return [
        n if seen[n] == 1 else storage.fitted_name(s, f"{t}.{fmt}")
        for n, s, t in zip(names, stems, tags, strict=True)
    ]


# What overnight writes under OUTPUT (docs/reference/outputs.md). Files exported into one of
# them break its readers (pyarrow, pandas, DuckDB and Polars read every file of a dataset's
# folder; ``runs/`` is read as run summaries).
_OUTPUT_FOLDERS = (
    "transcripts",
    "results",
    "probes",
    "costs",
    "run_table",
    "runs",
    "transcripts_unredacted",
    "redacted_audio",
)


def _check_destination(output: str, dest: str, config: storage.StorageConfig | None) -> None:
    """``ConfigError`` for a DEST inside OUTPUT's datasets or bookkeeping (``_claims/``, ...);
    ``OutputNotWritable`` for a local DEST that cannot take files (a file in the way)."""
    from overnight.jobs import preflight

    out, to = storage.resolve(output, config), storage.resolve(dest, config)
    top = out.path.rstrip("/") + "/"
    if out.scheme == to.scheme and to.path.startswith(top):
        folder = to.path[len(top) :].split("/", 1)[0]
        if folder in _OUTPUT_FOLDERS or folder.startswith(("_", ".")):
            raise ConfigError(
                f"DEST {storage.scrub_secrets(dest)!r} is inside {folder}/ of OUTPUT, which overnight "
                "owns: files there break the readers of its datasets. Choose a folder outside "
                "them (e.g. OUTPUT/subtitles); nothing was written."
            )
    preflight.check_output(dest, "the destination")


def latest_ok(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The newest ok row of each item, in source order."""
    best: dict[str, Mapping[str, Any]] = {}
    for r in rows:
        if r.get("status") != "ok":
            continue
        old = best.get(r["item_id"])
        if old is None or str(r.get("processed_at")) > str(old.get("processed_at")):
            best[r["item_id"]] = r
    return sorted(best.values(), key=lambda r: str(r["source_uri"]))


def _write_one(dest: str, name: str, body: str, config: storage.StorageConfig | None) -> None:
    loc = storage.resolve(dest.rstrip("/") + "/" + name, config)
    storage.write_bytes_atomic(loc, body.encode("utf-8"))


def _write_batch(
    table: Any, dest: str, fmt: str, config: storage.StorageConfig | None
) -> dict[str, Any]:
    """Ray Data stage: render and write one batch of rows (each row carries its file name)."""
    rows = table.to_pylist()
    for row in rows:
        _write_one(dest, row["file_name"], render(row, fmt), config)
    return {"written": [1] * len(rows)}


def export(
    output: str,
    dest: str,
    fmt: str,
    *,
    config: storage.StorageConfig | None = None,
    ray_threshold: int = RAY_THRESHOLD,
    redacted_only: bool = False,
) -> dict[str, Any]:
    """Write one ``fmt`` file a recording of OUTPUT/transcripts under ``dest``; the counts.

    ``redacted_only``: refuse (``ConfigError``, exit status 2) before writing anything when
    any recording's transcript was not redacted (a job without ``redact``), rather than skip
    it: an export that silently leaves recordings out looks complete."""
    from overnight.jobs.dataset import commits  # the reader of committed result datasets

    if fmt not in FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    transcripts = storage.resolve(output.rstrip("/") + "/transcripts", config)
    if not storage.exists(transcripts):
        raise InputNotFound(
            f"{storage.scrub_secrets(output)!r} holds no transcripts/ dataset: is it the OUTPUT of "
            "an `overnight transcribe` run?"
        )
    _check_destination(output, dest, config)
    table = commits.CommittedDataset(transcripts).read_results(COLUMNS)
    all_rows = table.to_pylist() if table is not None else []
    rows = latest_ok(all_rows)
    if redacted_only:
        plain = [r for r in rows if r.get("entities") is None]
        if plain:
            raise ConfigError(
                f"--redacted-only: {len(plain)} of {len(rows)} transcripts in "
                f"{storage.scrub_secrets(output)!r} were not redacted (their job had no `redact`); "
                "nothing was written. Transcribe them again with --redact, or export without "
                "--redacted-only"
            )
    names = file_names(rows, fmt)
    if len(rows) >= ray_threshold:
        import pyarrow as pa
        import ray

        from overnight.jobs.run.on_ray import ensure_ray

        ensure_ray(None)
        ds = ray.data.from_arrow(
            pa.Table.from_pylist([{**r, "file_name": n} for r, n in zip(rows, names, strict=True)])
        )
        write = functools.partial(
            _write_batch, dest=dest, fmt=fmt, config=config or storage.StorageConfig.from_env()
        )
        written = ds.map_batches(write, batch_format="pyarrow").count()
        how = "ray"
    else:
        storage.map_threads(
            lambda pair: _write_one(dest, pair[1], render(pair[0], fmt), config),
            list(zip(rows, names, strict=True)),
        )
        written, how = len(rows), "threads"
    exported = {r["item_id"] for r in rows}
    return {
        "format": fmt,
        "destination": storage.scrub_secrets(dest),
        "files": written,
        # items whose every row is an error row: nothing to export
        "items_without_transcript": len({r["item_id"] for r in all_rows} - exported),
        "written_by": how,
    }
