"""Submitted manifests: the id from their content, parsing, and the trusted rows a job may run."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from overnight.jobs.ops.submissions.config import Tenant
from overnight.jobs.ops.submissions.urls import UriRejected, normalize, shown
from overnight.workers.analytics import speaker_names_problem

MAX_MANIFEST_BYTES = 64 * 2**20
# Manifest columns that would carry a credential into results: rejected, never copied.
_SECRET_COLUMN = re.compile(
    r"(?i)(secret|password|passwd|token|credential|access.?key|api.?key|private.?key|authoriz|auth(?!or)|"
    r"bearer|signature|session|(^|[^a-z])(sas|sig)([^a-z]|$))"
)
_TRUSTED = {"tenant", "submission_id"}


class Rejected(Exception):
    """A submission that must not run; the message is the reason recorded in its submission record."""


def submission_id(data: bytes) -> str:
    return "sub-" + hashlib.sha256(data).hexdigest()[:24]


def parse_manifest(name: str, data: bytes) -> list[dict[str, Any]]:
    lower = name.lower()
    if len(data) > MAX_MANIFEST_BYTES:
        raise Rejected(f"the manifest is {len(data)} bytes; the limit is {MAX_MANIFEST_BYTES}")
    try:
        if lower.endswith(".parquet"):
            rows = pq.read_table(io.BytesIO(data)).to_pylist()
        else:
            text = data.decode("utf-8-sig")
            if lower.endswith(".csv"):
                rows = list(csv.DictReader(io.StringIO(text)))
            else:
                rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    except (ValueError, pa.ArrowInvalid, UnicodeDecodeError, csv.Error) as exc:
        raise Rejected(f"the manifest cannot be parsed: {str(exc)[:200]}") from None
    if not rows:
        raise Rejected("the manifest has no rows")
    if not all(isinstance(r, dict) for r in rows):
        raise Rejected("every manifest row must be an object with a 'uri'")
    return rows


def _column_problem(row: dict[str, Any]) -> str | None:
    """Why a row's typed columns cannot be used, or None (the job reads them as typed)."""
    labels = row.get("channel_labels")
    if labels is not None and not (
        isinstance(labels, str)
        or (isinstance(labels, list) and all(isinstance(x, str) for x in labels))
    ):
        return (
            "channel_labels must be text such as 'agent,customer' or a list of names, "
            f"not {shown(json.dumps(labels, default=str), 60)}"
        )
    if labels is not None:
        names = labels
        if isinstance(labels, str):  # as the job's manifest reader takes it: blanks dropped
            names = [n for n in labels.replace(";", ",").split(",") if n.strip()]
        problem = speaker_names_problem(names)
        if problem:
            return f"channel_labels: {shown(problem, 120)}"
    language = row.get("language")
    if language is not None and not isinstance(language, str):
        return f"language must be a language code such as 'en', not {shown(str(language), 40)}"
    return None


def trusted_rows(
    rows: list[dict[str, Any]], tenant: str, config: Tenant, sid: str, max_recordings: int
) -> list[dict]:
    """The rows the job will run, or Rejected with the reason: all-or-nothing."""
    if len(rows) > max_recordings:
        raise Rejected(f"{len(rows)} recordings; the limit per submission is {max_recordings}")
    columns = sorted({str(k) for r in rows for k in r})
    if "uri" not in columns:
        raise Rejected(
            f"the manifest needs a 'uri' column; it has {[shown(c, 40) for c in columns[:20]]}"
        )
    secret = [c for c in columns if _SECRET_COLUMN.search(c)]
    if secret:
        raise Rejected(
            f"columns {[shown(c, 40) for c in secret]} look like credentials: manifests must not carry "
            "credentials (storage access comes from the platform)"
        )
    prefixes = [normalize(p) for p in config.allowed_input_prefixes]
    bad: list[str] = []
    out = []
    for i, row in enumerate(rows):
        uri = row.get("uri")
        try:
            url = normalize(uri if isinstance(uri, str) else "")
        except UriRejected as exc:
            bad.append(f"row {i + 1} {shown(str(uri))!r}: {exc}")
            continue
        if not any(url.within(p) for p in prefixes):
            bad.append(
                f"row {i + 1} {shown(str(uri))!r}: outside the prefixes allowed for tenant {tenant!r}"
            )
            continue
        problem = _column_problem(row)
        if problem:
            bad.append(f"row {i + 1} {shown(str(uri))!r}: {problem}")
            continue
        clean = {str(k): v for k, v in row.items() if str(k) not in _TRUSTED and v is not None}
        clean.update(uri=url.url(), tenant=tenant, submission_id=sid)
        for key, value in list(clean.items()):
            if key not in ("uri", "channel_labels") and not isinstance(value, str):
                clean[key] = json.dumps(value) if isinstance(value, dict | list) else str(value)
        out.append(clean)
    if bad:
        more = f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""
        raise Rejected(
            f"{len(bad)} of {len(rows)} rows cannot be run for this tenant: "
            + "; ".join(bad[:5])
            + more
        )
    return out
