"""``overnight export``: transcripts out of Parquet, one file a recording (SRT, WebVTT, text, JSON).

Reads OUTPUT/transcripts (the newest ok row of each recording, by source URI), writes
``DEST/<name>.<ext>`` for each recording through ``jobs.dataset.storage`` (a local folder, ``s3://``
or ``gs://``), each file written atomically, so a rerun overwrites instead of duplicating. Speaker labels (``agent``,
``customer``, or ``ch0``/``ch1``) lead every cue: WebVTT's voice span, SRT's ``speaker:``. WebVTT
text carries ``&``, ``<`` and ``>`` as character references (so ``AT&T <5`` and a spoken ``-->``
read back whole); SRT has no escapes and needs none. A large output is written by Ray tasks
(``RAY_THRESHOLD`` recordings and more), a small one by a thread pool on the driver.
"""

from __future__ import annotations

import functools
import hashlib
import html
import json
import re
import textwrap
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from overnight.jobs.choices import EXPORT_FORMATS as FORMATS
from overnight.jobs.dataset import storage
from overnight.jobs.dataset.manifest import OUTPUT_FOLDERS
from overnight.jobs.errors import ConfigError, InputNotFound, OutputNotWritable, OvernightError

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
# Subtitle conventions (Netflix's and the BBC's timed-text guides): lines of at most 42
# characters, at most 2 lines and 7 seconds a cue. A Whisper segment runs up to 30 s; one
# cue of it filled the screen with 8 lines for 28 s.
LINE_CHARS = 42
CUE_LINES = 2
CUE_SECONDS = 7.0
# A cue that has to close early ends after the last clause in it (its punctuation) rather
# than mid-clause, when that keeps at least this share of its words.
CLAUSE_SHARE = 0.5
# A long export (2,000 files to S3) says how far it is at most this often; a short one is silent.
PROGRESS_EVERY_S = 10.0
WRITE_THREADS = 16


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
    """A transcript's segments as subtitle cues, in time order: a segment longer than a cue
    holds (``CUE_LINES`` lines, ``CUE_SECONDS``) is cut between words, each cue timed by its
    words (the segment's own ``words``, else its time shared out by characters)."""
    return [
        cue
        for seg, who, text in _spoken(row)
        for cue in _split(float(seg["start"]), float(seg["end"]), who, text, seg.get("words"))
    ]


def _timed_tokens(
    start: float, end: float, text: str, words: list[Mapping[str, Any]] | None
) -> list[tuple[str, float, float]]:
    """The text's space-separated tokens, each with a start and end. From ``words`` where they
    spell the same tokens (redaction rewrites text and words alike); otherwise, and for a
    segment without words, the segment's time shared out by the tokens' characters."""
    tokens = text.split()
    if words:
        timed: list[tuple[str, float, float]] = []
        for w in words:
            if w.get("start") is None or w.get("end") is None:
                break
            timed += [(t, float(w["start"]), float(w["end"])) for t in str(w["word"]).split()]
        else:
            if [t for t, _, _ in timed] == tokens:
                return [(t, min(end, max(start, a)), min(end, max(a, b))) for t, a, b in timed]
    total = max(1, len(" ".join(tokens)))
    out, at = [], 0
    for t in tokens:
        out.append(
            (t, start + (end - start) * at / total, start + (end - start) * (at + len(t)) / total)
        )
        at += len(t) + 1
    return out


def _fits(speaker: str | None, text: str) -> bool:
    # The speaker's name counts: SRT writes it into the first line, and players show
    # WebVTT's voice name with the text.
    shown = f"{speaker}: {text}" if speaker else text
    return len(_lines(shown)) <= CUE_LINES


def _split(
    start: float, end: float, speaker: str | None, text: str, words: list[Mapping[str, Any]] | None
) -> list[Cue]:
    if _fits(speaker, text) and end - start <= CUE_SECONDS:
        return [Cue(start, end, speaker, text)]
    tokens = _timed_tokens(start, end, text, words)
    groups: list[list[tuple[str, float, float]]] = []
    group: list[tuple[str, float, float]] = []
    for token in tokens:
        grown = [*group, token]
        if not group or (
            _fits(speaker, " ".join(t for t, _, _ in grown))
            and token[2] - group[0][1] <= CUE_SECONDS
        ):
            group = grown
            continue
        # Close the cue after its last clause when that keeps most of it, else here.
        cut = max(
            (i + 1 for i, (t, _, _) in enumerate(group) if t[-1] in ".,;:?!"), default=len(group)
        )
        if cut < CLAUSE_SHARE * len(group):
            cut = len(group)
        groups.append(group[:cut])
        group = [*group[cut:], token]
    groups.append(group)
    out: list[Cue] = []
    for n, g in enumerate(groups):
        first = start if n == 0 else max(g[0][1], out[-1].end)
        last = end if n == len(groups) - 1 else max(g[-1][2], first)
        out.append(Cue(first, last, speaker, " ".join(t for t, _, _ in g)))
    return out


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


# Controls (C0, DEL, C1), line and paragraph separators and bidirectional overrides: in a file
# name they break lines of a listing or make it read differently from its bytes.
_UNSAFE_IN_NAME = re.compile(
    r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)


def _stem(uri: str) -> str:
    stem = PurePosixPath(uri.rstrip("/")).stem
    return _UNSAFE_IN_NAME.sub("_", stem) or "recording"


def _tag(uri: str, length: int = 12) -> str:
    # From the source URI, not the item id: a touched local file gets a new item id, and its
    # file should keep its name on the next export.
    return "-" + hashlib.sha256(uri.encode("utf-8", "surrogateescape")).hexdigest()[:length]


def file_names(rows: list[Mapping[str, Any]], fmt: str) -> list[str]:
    """``<source stem>.<fmt>``, each name unique. Recordings whose names collide (ignoring
    case, as macOS and Windows disks do) keep them apart with a tag made from their source URI,
    and so does a stem cut to fit ``storage.NAME_MAX``. A tagged name that another recording's
    plain name already holds (a recording named ``call-<tag>.wav``) takes a longer tag: two
    recordings written to one file lose one of them."""
    suffix = f".{fmt}"
    uris = [str(r["source_uri"]) for r in rows]
    stems = [_stem(u) for u in uris]
    plain = [storage.fitted_name(s, suffix, _tag(u)) for s, u in zip(stems, uris, strict=True)]
    count: dict[str, int] = {}
    for n in plain:
        count[n.casefold()] = count.get(n.casefold(), 0) + 1
    names: list[str | None] = [n if count[n.casefold()] == 1 else None for n in plain]
    taken = {n.casefold() for n in names if n is not None}
    for i, (stem, uri) in enumerate(zip(stems, uris, strict=True)):
        if names[i] is not None:
            continue
        # Longer tags first; a counter only for a collision of whole SHA-256 digests.
        candidates = [storage.fitted_name(stem, _tag(uri, k) + suffix) for k in (12, 64)]
        extra = 2
        while all(c.casefold() in taken for c in candidates):
            candidates.append(storage.fitted_name(stem, f"{_tag(uri, 64)}-{extra}{suffix}"))
            extra += 1
        name = next(c for c in candidates if c.casefold() not in taken)
        names[i] = name
        taken.add(name.casefold())
    out = [n for n in names if n is not None]
    if len({n.casefold() for n in out}) != len(rows):  # the invariant the loop above keeps
        raise RuntimeError(f"export file names are not unique: {sorted(out)}")
    return out


def _check_destination(output: str, dest: str, config: storage.StorageConfig | None) -> None:
    """``ConfigError`` for a DEST inside OUTPUT's datasets or bookkeeping (``_claims/``, ...);
    ``OutputNotWritable`` for a DEST that cannot take files (a file in the way)."""
    from overnight.jobs import preflight

    out = storage.resolve(output, config).canonical()
    to = storage.resolve(dest, config).canonical()
    top = out.path.rstrip("/") + "/"
    if out.scheme == to.scheme and to.path.startswith(top):
        folder = to.path[len(top) :].split("/", 1)[0]
        # Files exported into what overnight writes break its readers (pyarrow, pandas,
        # DuckDB and Polars read every file of a dataset's folder; runs/ as run summaries).
        if folder in OUTPUT_FOLDERS or folder.startswith(("_", ".")):
            raise ConfigError(
                f"DEST {storage.scrub_secrets(dest)!r} is inside {folder}/ of OUTPUT "
                f"({storage.scrub_secrets(to.url())}), which overnight owns: files there break "
                "the readers of its datasets. Choose a folder outside them (e.g. "
                "OUTPUT/subtitles); nothing was written."
            )
    preflight.check_output(dest, "the destination")


def _newness(row: Mapping[str, Any]) -> tuple[bool, str]:
    # A row without a time is older than any with one (``str(None)`` sorted after digits).
    when = row.get("processed_at")
    return (when is not None, "" if when is None else str(when))


def latest_ok(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The newest ok row of each recording (source URI), in source order. By URI, not item
    id: a recording touched or uploaded again has a new item id, and is still one file."""
    best: dict[str, Mapping[str, Any]] = {}
    for r in rows:
        if r.get("status") != "ok":
            continue
        uri = str(r["source_uri"])
        old = best.get(uri)
        if old is None or _newness(r) > _newness(old):
            best[uri] = r
    return [best[u] for u in sorted(best)]


def _write_one(base: storage.Location, name: str, body: str) -> None:
    """One file under the resolved DEST. An error the storage layer did not classify (a
    folder where the file goes, a name the disk refuses) becomes ``OutputNotWritable`` naming
    the file, never a traceback."""
    try:
        storage.write_bytes_atomic(base.join(name), body.encode("utf-8"))
    except OvernightError:
        raise
    except Exception as exc:
        raise OutputNotWritable(
            f"cannot write {name!r} in {storage.scrub_secrets(base.url())}: "
            f"{type(exc).__name__}: {exc}"
        ) from None


def _write_batch(
    table: Any, dest: str, fmt: str, config: storage.StorageConfig | None
) -> dict[str, Any]:
    """Ray Data stage: render and write one batch of rows (each row carries its file name).
    DEST is resolved once a batch: each resolve of an S3 URL makes a new client."""
    base = storage.resolve(dest, config).canonical()
    rows = table.to_pylist()
    for row in rows:
        _write_one(base, row["file_name"], render(row, fmt))
    return {"written": [1] * len(rows)}


class _Progress:
    """Files written so far, and a line for the operator every ``PROGRESS_EVERY_S``."""

    def __init__(self, total: int, dest: str):
        self.total, self.dest, self.done = total, dest, 0
        self._lock = threading.Lock()
        self._last = time.monotonic()

    def add(self, n: int = 1) -> None:
        from overnight.jobs.run import console

        with self._lock:
            self.done += n
            now = time.monotonic()
            if now - self._last < PROGRESS_EVERY_S or self.done >= self.total:
                return
            self._last = now
            done = self.done
        console.event(
            "progress",
            f"export: {done:,} of {self.total:,} files written to {self.dest}",
            written=done,
            total=self.total,
        )


def _stopped(exc: OvernightError, progress: _Progress) -> OvernightError:
    """The error that stopped an export, of its own kind (its exit status), saying how far
    the export got."""
    message = getattr(exc, "message", None) or str(exc)
    return _kind(exc)(
        f"{message.rstrip('. ')}. {progress.done:,} of {progress.total:,} files were written to "
        f"{progress.dest} before the export stopped; fix the cause and rerun (a rerun writes "
        "every file again)."
    )


def _kind(exc: OvernightError) -> type[OvernightError]:
    # The first of our classes in its ancestry keeps the exit status.
    from overnight.jobs import errors

    return next(
        c
        for c in type(exc).__mro__
        if c.__module__ == errors.__name__ and issubclass(c, OvernightError)
    )


def _write_threads(
    base: storage.Location,
    pairs: list[tuple[Mapping[str, Any], str]],
    fmt: str,
    progress: _Progress,
) -> None:
    """The files by a thread pool; the first failure stops the files not yet started."""
    stop = threading.Event()

    def one(pair: tuple[Mapping[str, Any], str]) -> None:
        if stop.is_set():
            return
        try:
            _write_one(base, pair[1], render(pair[0], fmt))
        except BaseException:
            stop.set()
            raise
        progress.add()

    storage.map_threads(one, pairs, workers=WRITE_THREADS)


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
            # Done items keep their rows on a rerun into the same OUTPUT (see the job's
            # "a new output redoes them" notice): only a new OUTPUT redacts them.
            raise ConfigError(
                f"--redacted-only: {len(plain)} of {len(rows)} transcripts in "
                f"{storage.scrub_secrets(output)!r} were not redacted (their job had no `redact`); "
                "nothing was written. Transcribe those recordings into a new OUTPUT with "
                "--redact (a rerun into the same OUTPUT keeps the rows it has), or export "
                "without --redacted-only"
            )
    names = file_names(rows, fmt)
    # Resolved once: each resolve of an S3 URL builds a new client (about 0.23 s of CPU),
    # which per file made 2,000 files take 18 minutes.
    base = storage.resolve(dest, config).canonical()
    shown = storage.scrub_secrets(base.url())
    progress = _Progress(len(rows), shown)
    try:
        if len(rows) >= ray_threshold:
            how = "ray"
            _write_ray(rows, names, dest, fmt, config, progress)
        else:
            how = "threads"
            _write_threads(base, list(zip(rows, names, strict=True)), fmt, progress)
    except OvernightError as exc:
        raise _stopped(exc, progress) from None
    exported = {str(r["source_uri"]) for r in rows}
    without = sorted({str(r["source_uri"]) for r in all_rows} - exported)
    return {
        "format": fmt,
        "destination": storage.scrub_secrets(dest),
        "files": progress.done,
        # recordings whose every row is an error row: nothing to export
        "items_without_transcript": len(without),
        "recordings_without_transcript": [storage.scrub_secrets(u) for u in without],
        "written_by": how,
    }


def _write_ray(
    rows: list[Mapping[str, Any]],
    names: list[str],
    dest: str,
    fmt: str,
    config: storage.StorageConfig | None,
    progress: _Progress,
) -> None:
    import pyarrow as pa
    import ray

    from overnight.jobs.run.on_ray import ensure_ray, unwrap

    ensure_ray(None)
    ds = ray.data.from_arrow(
        pa.Table.from_pylist([{**r, "file_name": n} for r, n in zip(rows, names, strict=True)])
    )
    write = functools.partial(
        _write_batch, dest=dest, fmt=fmt, config=config or storage.StorageConfig.from_env()
    )
    try:
        for batch in ds.map_batches(write, batch_format="pyarrow").iter_batches(
            batch_format="pyarrow", batch_size=None
        ):
            progress.add(len(batch["written"]))
    except Exception as exc:
        # A task's error reaches the driver as a RayTaskError whose text is the remote
        # traceback (Ray cannot subclass ours: their exit status is a class argument); the
        # export stops on the error of ours inside it, as the threads' path does.
        inner = unwrap(exc, ())
        if isinstance(inner, OvernightError):
            raise inner from None
        raise
