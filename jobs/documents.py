"""What the document job reads, and its CPU stage: documents listed from the input, or the
transcripts dataset of an earlier run (a chained job), each as one record per (item, task);
``fetch_and_extract`` turns a document's bytes into text in a sandboxed child
(``workers.text``). ``jobs.process`` builds the job's records and stages from these.
"""

from __future__ import annotations

import hashlib
import os
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from overnight.jobs.dataset import commits, storage
from overnight.jobs.dataset.manifest import Listing, item_id
from overnight.jobs.run import on_ray
from overnight.jobs.spec import ProcessOptions
from overnight.schemas import ErrorCode
from overnight.schemas.stages import DOC_INPUT
from overnight.workers.text import TextOptions, extract_text


def result_id(source_item_id: str, task: str) -> str:
    return hashlib.sha256(f"{source_item_id}\n{task}".encode()).hexdigest()[:32]


def transcripts_dataset(url: str) -> storage.Location | None:
    """The transcripts dataset an input points at (OUTPUT/ or OUTPUT/transcripts/), if any."""
    if "://" not in url and os.path.isfile(url):
        return None
    loc = storage.resolve(url)
    for candidate in (loc, loc.join("transcripts")):
        files = storage.list_files(candidate, ".parquet")
        if not files or any("/_manifests/" in f for f in files):
            continue
        import pyarrow.parquet as pq

        with candidate.fs.open(files[0], "rb") as f:
            meta = pq.read_schema(f).metadata or {}
        if meta.get(b"overnight.table") == b"transcripts":
            return candidate
    return None


def _call_key(row: dict[str, Any]) -> str:
    """What one call is across its transcript rows: the id its recording had while missing
    (``jobs.dataset.manifest``), the same for every size and ETag the recording had."""
    return item_id(row["source_uri"], None, None, row["submission_id"], row["external_id"])


def _newest_per_call(rows: list[dict[str, Any]]) -> list[tuple[dict[str, Any], list[str]]]:
    """Each call's newest transcript row, with the ids its results may stand under from
    before: the id it had while missing (a ``fetch_failed`` row that ``--retry-errors``
    replaced) and its older failed transcripts (a broken file fixed in place is new work
    for the transcription, so its failed row stays there). A result row of those is
    ``transcript_failed``, retired once the call has a transcript to process: each call
    keeps one row per task, the newest transcript's. An older transcript that was fine is
    not one of them: a recording replaced by another is new work."""
    calls: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        calls.setdefault(_call_key(row), []).append(row)
    newest = []
    epoch = datetime.min.replace(tzinfo=UTC)
    for key, same in calls.items():
        same.sort(key=lambda r: (r["processed_at"] or epoch, r["status"] == "ok"))
        last = same[-1]
        older = [r["item_id"] for r in same[:-1] if r["status"] != "ok"]
        newest.append((last, [i for i in (key, *older) if i != last["item_id"]]))
    return newest


def transcript_records(dataset: storage.Location, task: str) -> list[dict[str, Any]]:
    """One record per call (``_newest_per_call``) from its newest transcript row."""
    table = commits.CommittedDataset(dataset).read_results(
        [
            "item_id",
            "processed_at",
            "source_uri",
            "source_size",
            "source_etag",
            "tenant",
            "submission_id",
            "external_id",
            "metadata",
            "language",
            "channel_labels",
            "status",
            "error_code",
            "text",
        ],
    )
    records = []
    for row, earlier in _newest_per_call(table.to_pylist() if table is not None else []):
        text, status, code, message = row["text"], "ok", None, None
        if row["status"] != "ok":
            status, code = "error", ErrorCode.TRANSCRIPT_FAILED.value
            message = f"the transcription of this recording failed ({row['error_code']})"
        elif not (text or "").strip():
            status, code, message = (
                "error",
                ErrorCode.NO_TEXT.value,
                "the call has no speech to process",
            )
        records.append(
            {
                "item_id": result_id(row["item_id"], task),
                "source_item_id": row["item_id"],
                # Read by ``jobs.run.runner.record_ids``: not a manifest column.
                "replaces": [result_id(i, task) for i in earlier],
                "uri": row["source_uri"],
                "size": row["source_size"],
                "etag": row["source_etag"],
                "tenant": row["tenant"],
                "submission_id": row["submission_id"],
                "external_id": row["external_id"],
                "metadata": row["metadata"],
                "language": row["language"],
                "channel_labels": row["channel_labels"],
                "text": text if status == "ok" else None,
                "status": status,
                "error_code": code,
                "error_message": message,
                "fetch_s": 0.0,
                "extract_s": 0.0,
                "extract_resource": "cpu",
                "document_chars": len(text or ""),
            }
        )
    return records


def document_records(listing: Listing, task: str) -> list[dict[str, Any]]:
    records = []
    for r in listing.items:
        records.append(
            {
                **r,
                "source_item_id": r["item_id"],
                "item_id": result_id(r["item_id"], task),
                "missing_id": result_id(r["missing_id"], task),
                "text": None,
                "status": None,
                "error_code": None,
                "error_message": None,
                "fetch_s": None,
                "extract_s": None,
                "extract_resource": "cpu",
                "document_chars": None,
            }
        )
    return records


def fetch_and_extract(
    batch: pa.Table, *, options: TextOptions, max_bytes: int, storage_config: storage.StorageConfig
) -> pa.Table:
    """CPU stage: object bytes → text. Rows that already carry text or a status pass through."""
    out = []
    for row in batch.to_pylist():
        if row["status"] is not None:
            out.append(row)
            continue
        row.update(status="ok", fetch_s=0.0, extract_s=0.0)
        data = on_ray.fetch_item(row, max_bytes, storage_config)
        if data is None:
            out.append(row)
            continue
        result = extract_text(data, row["uri"].rsplit("/", 1)[-1], options)
        row["extract_s"] = result.seconds
        if result.error_code:
            row.update(
                status="error", error_code=result.error_code, error_message=result.error_message
            )
        else:
            row["text"], row["document_chars"] = result.text, len(result.text or "")
        out.append(row)
    return pa.Table.from_pylist(out, schema=DOC_INPUT)


def text_options(opts: ProcessOptions) -> TextOptions:
    """How documents are read; the PDF password comes from the environment variable the
    job names (``pdf_password_env``), and messages name that variable."""
    return TextOptions(
        pdf_password=os.environ.get(opts.pdf_password_env) or None,
        pdf_password_source=f"${opts.pdf_password_env}",
        timeout_s=opts.extract_timeout_s,
        max_chars=opts.max_chars,
        max_memory_mb=opts.extract_memory_mb,
        json_text_field=opts.json_text_field,
    )
