"""The redaction stage of the transcription job: CPU tasks between the Whisper actor and the
commit (``jobs.run.runner`` runs a plan's stages after the model stage as Ray tasks from the
committing actor, so the model keeps decoding other calls meanwhile and each finished batch
is still committed at once).

Each row's text, segments and words are redacted (``workers.redact``), what was found goes
to ``entities``, the time spent to ``redact_s`` (a ledger stage of its own). With
``keep_unredacted`` the original text and segments are committed to
``OUTPUT/transcripts_unredacted/`` first (same commit protocol), and nowhere else. With
``redact_audio`` each recording is fetched again and written as
``OUTPUT/redacted_audio/<stem>-<item id, 12 chars>.flac`` (a stem cut to fit 255 bytes) with
the time of every tag word silenced (``workers.redact.audio``), before the row is committed; a
recording whose redacted audio cannot be made or written becomes a ``redaction_failed`` row.
"""

from __future__ import annotations

import functools
import posixpath
import re
import time
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from overnight.jobs.dataset import commits, storage
from overnight.jobs.errors import OvernightError
from overnight.schemas import TRANSCRIPTS, TRANSCRIPTS_UNREDACTED, ErrorCode
from overnight.workers.redact.audio import silence

if TYPE_CHECKING:  # the recognizers (Presidio, text2num: the redact extra) load on first use
    from overnight.workers.redact import Redactor

UNREDACTED_DATASET = "transcripts_unredacted"
AUDIO_FOLDER = "redacted_audio"
_TAG = re.compile(r"\[[A-Z_]+\]")


@functools.lru_cache(maxsize=4)
def _redactor(types: tuple[str, ...]) -> Redactor:
    # Presidio and spaCy load once per Ray worker process, on its first batch.
    from overnight.workers.redact import Redactor

    return Redactor(types)


def redact_batch(
    batch: pa.Table,
    *,
    types: tuple[str, ...],
    run_id: str,
    unredacted: storage.Location | None = None,
    audio: storage.Location | None = None,
    storage_config: storage.StorageConfig | None = None,
    max_bytes: int = 2**31,
) -> pa.Table:
    """Transcripts rows (as the committing actor will write them) → the same rows redacted."""
    redactor = _redactor(tuple(types))
    rows = batch.to_pylist()
    originals = []
    for row in rows:
        t0 = time.perf_counter()
        if row["status"] == "ok":
            originals.append(
                {
                    "item_id": row["item_id"],
                    "run_id": run_id,
                    "text": row["text"],
                    "segments": row["segments"],
                }
            )
            fields, entities = redactor.redact(row)
            row.update(fields, entities=entities)
            if audio is not None and storage_config is not None:
                try:
                    write_redacted_audio(row, audio, storage_config, max_bytes)
                except storage.Unreadable as exc:  # gone or changed since the decode stage
                    row.update(
                        status="error",
                        error_code=exc.code.value,
                        error_message=f"redacted audio: the recording could not be read "
                        f"again ({exc})",
                    )
                except OvernightError:  # storage down, an output that takes no files: the job's
                    raise
                except Exception as exc:  # this recording's alone: the other rows still commit
                    row.update(
                        status="error",
                        error_code=ErrorCode.REDACTION_FAILED.value,
                        error_message=storage.scrub_secrets(
                            f"redacted audio could not be made or written: "
                            f"{type(exc).__name__}: {exc}"
                        ),
                    )
        else:
            row["entities"] = None
        row["redact_s"] = time.perf_counter() - t0  # per row: the runner sees only the call
    if unredacted is not None and originals:
        commits.CommittedDataset(unredacted).write_table(
            pa.Table.from_pylist(originals, schema=TRANSCRIPTS_UNREDACTED),
        )
    return pa.Table.from_pylist(rows, schema=TRANSCRIPTS)


def tag_ranges(row: dict[str, Any]) -> list[tuple[float, float]]:
    """Time ranges of the redacted words: each tag word's (a word per entity piece), else
    the entities' spans where the row has no words."""
    ranges = [
        (w["start"], w["end"])
        for seg in row.get("segments") or []
        for w in seg.get("words") or []
        if _TAG.fullmatch(w["word"] or "") and w.get("start") is not None
    ]
    if ranges:
        return ranges
    return [
        (e["start_s"], e["end_s"])
        for e in row.get("entities") or []
        if e.get("start_s") is not None and e.get("end_s") is not None
    ]


def audio_name(row: dict[str, Any]) -> str:
    """``<stem>-<item id, 12 chars>.flac``, the stem cut to fit ``storage.NAME_MAX``."""
    stem = posixpath.splitext(posixpath.basename(str(row["source_uri"]).rstrip("/")))[0]
    return storage.fitted_name(stem or "recording", f"-{str(row['item_id'])[:12]}.flac")


def write_redacted_audio(
    row: dict[str, Any],
    folder: storage.Location,
    storage_config: storage.StorageConfig,
    max_bytes: int,
) -> None:
    data = storage.read_bytes(row["source_uri"], storage_config, max_bytes=max_bytes)
    storage.write_bytes_atomic(folder.join(audio_name(row)), silence(data, tag_ranges(row)))
