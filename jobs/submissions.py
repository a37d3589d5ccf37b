"""Contact-center bulk submissions: tenants drop manifests into an inbox; the nightly job runs them.

A submission is one manifest (CSV, JSONL or Parquet of recording URIs plus metadata) under a
tenant's inbox prefix, dropped there directly or by ``overnight submissions add``. Its id is
the hash of its content, so the same manifest dropped twice is one submission.

``overnight submissions process --config tenants.toml`` handles every new submission once:

1. Validate before any work: every URI must lie under one of the prefixes the central config
   allows for the tenant (compared on normalised scheme, bucket and path segments, so
   ``..``, ``//``, percent-encoding and look-alike buckets cannot escape). One bad URI rejects
   the whole submission; the rejection and its reason go to the ledger.
2. Run the transcription job on a trusted copy of the manifest: normalised URIs, ``tenant``
   and ``submission_id`` set from the config and the id (whatever the manifest claims), output
   under ``<tenant output>/submissions/<submission id>/``, a path built only from trusted config
   and the hash, never from object keys or metadata.
3. Record status and totals (recordings, audio minutes, failures, cost) in the ledger: one JSON
   object per submission under ``<state>/<tenant>/<submission id>.json``, each written
   atomically. Done and rejected submissions are never processed again; one that was running
   when the process died, or that failed (storage down, engine died), is resumed by the next
   run, up to ``max_attempts``.

Credentials come from the environment only (see ``jobs.storage``); a manifest column that
looks like a credential rejects the submission rather than being copied into results.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import os
import re
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from jobs import storage
from jobs.errors import AccessDenied, ConfigError, InputNotFound, OvernightError, StorageUnavailable
from jobs.manifest import MANIFEST_SUFFIXES
from jobs.spec import TranscribeOptions, read_job_file

LEDGER_VERSION = 1
DONE, REJECTED, RUNNING, FAILED = "done", "rejected", "running", "failed"
MAX_MANIFEST_BYTES = 64 * 2**20
_SCHEMES = {"s3": "s3", "s3a": "s3", "gs": "gs", "gcs": "gs", "file": "file"}
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
_TENANT = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_SUBMISSION = re.compile(r"^sub-[0-9a-f]{24}$")
# Manifest columns that would carry a credential into results: rejected, never copied.
_SECRET_COLUMN = re.compile(
    r"(?i)(secret|password|passwd|token|credential|access.?key|authorization|signature|session)"
)
_TRUSTED = {"tenant", "submission_id"}


# --- URIs ----------------------------------------------------------------------------------


class UriRejected(ValueError):
    """A URI that cannot be read safely; the message is the reason."""


@dataclass(frozen=True)
class ObjectURL:
    """A normalised object URL: scheme, bucket and path segments (no ``.``, ``..`` or empty).

    ``decoded`` holds the segments after percent-decoding, in case some layer decodes: a URI
    is allowed only if both readings lie under the prefix.
    """

    scheme: str
    bucket: str
    segments: tuple[str, ...]
    decoded: tuple[str, ...]

    def url(self) -> str:
        path = "/".join(self.segments)
        if self.scheme == "file":
            return "/" + path
        return f"{self.scheme}://{self.bucket}/{path}" if path else f"{self.scheme}://{self.bucket}"

    def within(self, prefix: ObjectURL) -> bool:
        """Strictly below ``prefix`` on path-segment boundaries, in both readings."""
        if (self.scheme, self.bucket) != (prefix.scheme, prefix.bucket):
            return False
        n = len(prefix.segments)
        return all(
            len(segs) > n and segs[:n] == prefix.segments for segs in (self.segments, self.decoded)
        )


def shown(uri: str, limit: int = 160) -> str:
    """A URI as it may appear in messages: no user-info, no control characters, redacted."""
    text = re.sub(r"(?<=://)[^/@]*@", "***@", str(uri))
    text = "".join(ch if ch.isprintable() else "?" for ch in text)
    text = storage.redact(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _segments(path: str) -> tuple[str, ...]:
    out: list[str] = []
    for seg in path.split("/"):
        if seg in ("", "."):
            continue
        if seg == "..":
            if not out:
                raise UriRejected("its path climbs above the bucket or root with '..'")
            out.pop()
            continue
        out.append(seg)
    return tuple(out)


def _decoded(path: str) -> str:
    for _ in range(4):  # double (or deeper) encoding counts too
        nxt = unquote(path)
        if nxt == path:
            return path
        path = nxt
    raise UriRejected("it is percent-encoded more than three times")


def normalize(uri: str) -> ObjectURL:
    """Parse and normalise one URI or prefix; UriRejected with the reason otherwise."""
    if not isinstance(uri, str) or not uri.strip():
        raise UriRejected("it is empty")
    uri = uri.strip()
    if any(not ch.isprintable() for ch in uri) or "\\" in uri:
        raise UriRejected("it contains control characters or backslashes")
    if "?" in uri or "#" in uri:
        raise UriRejected("it has a query or fragment ('?', '#')")
    if "://" not in uri:
        if not uri.startswith("/"):
            raise UriRejected("it is relative: use an absolute URI such as s3://bucket/key")
        scheme, rest = "file", uri
    else:
        raw_scheme, rest = uri.split("://", 1)
        if raw_scheme.lower() not in _SCHEMES:
            raise UriRejected(f"scheme {raw_scheme!r} is not accepted (s3://, gs://, file://)")
        scheme = _SCHEMES[raw_scheme.lower()]
    if scheme == "file":
        if rest.startswith("localhost/"):
            rest = rest[len("localhost") :]
        if not rest.startswith("/"):
            raise UriRejected("a file URI must be absolute (file:///path)")
        bucket, path = "", rest
        # Symlinks must not lead out of an allowed folder: compare real paths.
        literal = _segments(os.path.realpath("/" + "/".join(_segments(path))))
        decoded = _segments(os.path.realpath("/" + "/".join(_segments(_decoded(path)))))
        return ObjectURL(scheme, bucket, literal, decoded)
    netloc, _, path = rest.partition("/")
    if "@" in netloc or ":" in netloc:
        raise UriRejected("it carries user-info or a port in the bucket name")
    bucket = netloc.lower()
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise UriRejected(f"bucket {shown(netloc)!r} is not a valid bucket name")
    return ObjectURL(scheme, bucket, _segments(path), _segments(_decoded(path)))


# --- configuration -------------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Tenant(_Model):
    """``[tenants.NAME]``: what one tenant may read, where it drops manifests, where results go."""

    allowed_input_prefixes: list[str] = Field(
        ..., min_length=1, description="URL prefixes its recordings may be under"
    )
    inbox: str = Field(..., description="URL prefix where its manifests are dropped")
    output: str = Field(
        ..., description="URL prefix for its results: <output>/submissions/<submission id>/"
    )

    @field_validator("allowed_input_prefixes")
    @classmethod
    def _prefixes_parse(cls, prefixes: list[str]) -> list[str]:
        for p in prefixes:
            try:
                normalize(p)
            except UriRejected as exc:
                raise ValueError(f"allowed prefix {shown(p)!r} is not usable: {exc}") from None
        return prefixes


class Settings(_Model):
    """``[submissions]``."""

    state: str = Field(
        ..., description="URL prefix of the submissions ledger (one JSON per submission)"
    )
    max_recordings: int = Field(100_000, ge=1, description="larger submissions are rejected")
    max_attempts: int = Field(
        3, ge=1, description="runs of one submission before a failure is final"
    )
    ray_address: str | None = Field(
        None, description="join this Ray cluster; default: local Ray or RAY_ADDRESS"
    )
    shared_input_prefixes: list[str] = Field(
        default_factory=list,
        description="prefixes more than one tenant may read; elsewhere one tenant's "
        "allowed_input_prefixes must not overlap another's",
    )


class TenantsConfig(_Model):
    submissions: Settings
    tenants: dict[str, Tenant] = Field(..., min_length=1)
    transcribe: TranscribeOptions = Field(default_factory=TranscribeOptions)
    prices: dict[str, float] = Field(default_factory=dict)

    @field_validator("tenants")
    @classmethod
    def _names(cls, tenants: dict[str, Tenant]) -> dict[str, Tenant]:
        for name in tenants:
            if not _TENANT.match(name):
                raise ValueError(
                    f"tenant name {name!r}: use 1-63 lowercase letters, digits, '-' or '_'"
                )
        return tenants

    @model_validator(mode="after")
    def _isolated(self) -> TenantsConfig:
        """No tenant's inbox or output may lie inside another's: their prefixes would mix."""
        places = []
        for name, t in self.tenants.items():
            for what in ("inbox", "output"):
                url = getattr(t, what)
                try:
                    places.append((name, what, normalize(url)))
                except UriRejected as exc:
                    raise ValueError(
                        f"tenants.{name}.{what} {shown(url)!r} is not usable: {exc}"
                    ) from None
        for i, (n1, w1, u1) in enumerate(places):
            for n2, w2, u2 in places[i + 1 :]:
                if _overlap(u1, u2) is not None:
                    raise ValueError(
                        f"tenants.{n1}.{w1} and tenants.{n2}.{w2} overlap: give each its own prefix"
                    )
        self._inputs_isolated()
        return self

    def _inputs_isolated(self) -> None:
        """One tenant may not read another's recordings: input prefixes of two tenants must
        not overlap, except inside a prefix the config declares shared."""
        try:
            shared = [normalize(p) for p in self.submissions.shared_input_prefixes]
        except UriRejected as exc:
            raise ValueError(f"submissions.shared_input_prefixes: {exc}") from None
        inputs = [
            (name, p, normalize(p))
            for name, t in self.tenants.items()
            for p in t.allowed_input_prefixes
        ]
        for i, (n1, p1, u1) in enumerate(inputs):
            for n2, p2, u2 in inputs[i + 1 :]:
                common = _overlap(u1, u2) if n1 != n2 else None
                if common is None or any(_under(common, s) for s in shared):
                    continue
                raise ValueError(
                    f"tenants.{n1}.allowed_input_prefixes {shown(p1)!r} and "
                    f"tenants.{n2}.allowed_input_prefixes {shown(p2)!r} overlap: each tenant could "
                    "read the other's recordings. Give each its own prefix, or list the common "
                    "one in submissions.shared_input_prefixes if both may read it."
                )


def _under(url: ObjectURL, prefix: ObjectURL) -> bool:
    """``url`` is ``prefix`` or lies below it (segment boundaries)."""
    n = len(prefix.segments)
    return (url.scheme, url.bucket) == (prefix.scheme, prefix.bucket) and (
        url.segments[:n] == prefix.segments
    )


def _overlap(a: ObjectURL, b: ObjectURL) -> ObjectURL | None:
    """What two prefixes both cover (the deeper one), or None."""
    if _under(a, b):
        return a
    if _under(b, a):
        return b
    return None


def load_config(path: str | Path) -> TenantsConfig:
    data = read_job_file(path)
    try:
        return TenantsConfig.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "(config)"
            problems.append(f"  {where}: {err['msg']}")
        raise ConfigError(
            f"invalid tenants config {str(path)!r}:\n" + "\n".join(problems)
        ) from None


# --- manifests -----------------------------------------------------------------------------


class Rejected(Exception):
    """A submission that must not run; the message is the reason recorded in the ledger."""


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


# --- ledger --------------------------------------------------------------------------------


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Ledger:
    """``<state>/<tenant>/<submission id>.json``, each file replaced atomically."""

    def __init__(self, state: str):
        self.root = storage.resolve(state)

    def _loc(self, tenant: str, sid: str) -> storage.Location:
        return self.root.join(tenant, f"{sid}.json")

    def get(self, tenant: str, sid: str) -> dict | None:
        loc = self._loc(tenant, sid)
        try:
            data = storage.with_retries(f"read {loc.url()}", lambda: loc.fs.cat_file(loc.path))
        except FileNotFoundError:
            return None
        return json.loads(data)

    def put(self, record: dict) -> dict:
        record = {**record, "ledger_version": LEDGER_VERSION, "updated_at": _now()}
        data = json.dumps(record, sort_keys=True, indent=1).encode()
        storage.write_bytes_atomic(self._loc(record["tenant"], record["submission_id"]), data)
        return record

    def all(self, tenant: str | None = None) -> list[dict]:
        where = self.root.join(tenant) if tenant else self.root
        files = storage.list_files(where, ".json")

        def read(path: str) -> dict:
            return json.loads(
                storage.with_retries(
                    f"read {self.root.url(path)}", lambda: self.root.fs.cat_file(path)
                )
            )

        return sorted(
            storage.map_threads(read, files),
            key=lambda r: (r["tenant"], r.get("received_at", ""), r["submission_id"]),
        )


# --- processing ----------------------------------------------------------------------------


def _say(text: str) -> None:
    print(f"[submissions] {storage.redact(text)}", file=sys.stderr, flush=True)


def output_for(tenant: Tenant, sid: str) -> storage.Location:
    if not _SUBMISSION.match(sid):  # built by submission_id(); never from a name or a key
        raise ValueError(f"not a submission id: {sid!r}")
    return storage.resolve(tenant.output).join("submissions", sid)


def _inbox(tenant: Tenant) -> list[storage.ObjectInfo]:
    try:
        objects = storage.list_objects(tenant.inbox)
    except InputNotFound:
        return []
    return [o for o in objects if o.uri.lower().endswith(MANIFEST_SUFFIXES)]


def _totals(out: storage.Location) -> dict[str, Any]:
    from jobs import ledger as costs_ledger

    table = costs_ledger.read_results(out.join("transcripts"), ["item_id", "status", "duration_s"])
    costs = costs_ledger.read_results(out.join("costs"), ["cost_usd"])
    if table is None:
        return {"recordings": 0, "audio_minutes": 0.0, "failures": 0, "cost_usd": 0.0}
    return {
        "recordings": len(set(table["item_id"].to_pylist())),
        "audio_minutes": round((pc.sum(table["duration_s"]).as_py() or 0.0) / 60, 4),
        "failures": int(pc.sum(pc.equal(table["status"], "error")).as_py() or 0),
        "cost_usd": round(pc.sum(costs["cost_usd"]).as_py() or 0.0, 8)
        if costs is not None
        else 0.0,
    }


def _write_trusted_manifest(out: storage.Location, rows: list[dict]) -> str:
    loc = out.join("_submission", "manifest.jsonl")
    storage.write_bytes_atomic(
        loc, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode()
    )
    return loc.url()


def _run(
    config: TenantsConfig,
    tenant: Tenant,
    manifest_url: str,
    out: storage.Location,
    run_id: str,
    ray_address: str | None,
    progress: bool,
) -> dict:
    from jobs.spec import build_spec
    from jobs.transcribe import run_transcribe

    data: dict[str, Any] = {
        "job": {
            "input": manifest_url,
            "output": out.url(),
            "run_id": run_id,
            "ray_address": ray_address,
            "progress": progress,
            # Checked again on each opened file: the URIs were checked long before.
            "allowed_input_prefixes": list(tenant.allowed_input_prefixes),
        },
        "transcribe": config.transcribe.model_dump(exclude_none=True),
    }
    if config.prices:
        data["prices"] = dict(config.prices)
    return run_transcribe(build_spec(data))


def _manifest_key(obj: storage.ObjectInfo) -> str:
    """Which inbox object (and version) a record came from: lets a rerun skip it unread."""
    return hashlib.sha256(f"{obj.uri}\n{obj.etag}\n{obj.size}".encode()).hexdigest()[:32]


def process_one(
    config: TenantsConfig,
    ledger: Ledger,
    name: str,
    obj: storage.ObjectInfo,
    *,
    ray_address: str | None = None,
    progress: bool = True,
) -> dict | None:
    """Handle one manifest of the inbox; returns its ledger record, or None if nothing to do."""
    tenant = config.tenants[name]
    try:
        data = storage.read_bytes(obj.uri)
    except FileNotFoundError:  # removed since the listing
        return None
    sid = submission_id(data)
    record = ledger.get(name, sid)
    if record is not None:
        if record["status"] in (DONE, REJECTED):
            return None
        if record.get("attempts", 0) >= config.submissions.max_attempts:
            if record["status"] == RUNNING:
                return ledger.put(
                    {
                        **record,
                        "status": FAILED,
                        "reason": f"gave up after {record['attempts']} attempts; the last one "
                        "stopped without recording a cause (its process died: see its logs)",
                    }
                )
            return None
    base = record or {
        "tenant": name,
        "submission_id": sid,
        "manifest": shown(obj.uri, 500),
        "received_at": _now(),
        "attempts": 0,
        "manifest_key": _manifest_key(obj),
    }
    try:
        rows = trusted_rows(
            parse_manifest(obj.uri, data), name, tenant, sid, config.submissions.max_recordings
        )
    except Rejected as exc:
        _say(f"{name}/{sid}: rejected: {exc}")
        return ledger.put(
            {**base, "status": REJECTED, "reason": storage.redact(str(exc)), "recordings": 0}
        )

    out = output_for(tenant, sid)
    attempt = int(base.get("attempts", 0)) + 1
    record = ledger.put(
        {
            **base,
            "status": RUNNING,
            "attempts": attempt,
            "reason": None,
            "output": out.url(),
            "recordings_listed": len(rows),
        }
    )
    _say(f"{name}/{sid}: {len(rows)} recordings, attempt {attempt} -> {shown(out.url(), 300)}")
    try:
        manifest_url = _write_trusted_manifest(out, rows)
        summary = _run(config, tenant, manifest_url, out, f"{sid}-{attempt}", ray_address, progress)
        totals = _totals(out)
    except StorageUnavailable:
        # Recording the failure needs the storage that just failed: leave the record at
        # "running" and stop; the next run resumes this submission.
        raise
    except Exception as exc:
        # Whatever one submission raises is its own failure, recorded with its cause; the
        # other tenants' submissions still run. Only storage that is down stops them all.
        reason = str(exc) if isinstance(exc, OvernightError) else f"{type(exc).__name__}: {exc}"
        _say(f"{name}/{sid}: failed: {reason}")
        return ledger.put({**record, "status": FAILED, "reason": storage.redact(reason)[:2000]})
    return ledger.put(
        {
            **record,
            **totals,
            "status": DONE,
            "run_id": summary["run_id"],
            "summary": summary.get("summary_path"),
        }
    )


def process(
    config: TenantsConfig,
    *,
    tenants: list[str] | None = None,
    ray_address: str | None = None,
    progress: bool = True,
) -> list[dict]:
    """Every new (or unfinished) submission of every tenant; returns the records written."""
    unknown = sorted(set(tenants or ()) - set(config.tenants))
    if unknown:
        raise ConfigError(f"unknown tenant(s) {unknown}; the config has {sorted(config.tenants)}")
    ledger = Ledger(config.submissions.state)
    address = ray_address or config.submissions.ray_address
    touched = []
    for name in sorted(tenants or config.tenants):
        inbox = _inbox(config.tenants[name])
        if not inbox:
            continue
        finished = {
            r.get("manifest_key") for r in ledger.all(name) if r["status"] in (DONE, REJECTED)
        }
        for obj in inbox:
            if _manifest_key(obj) in finished:
                continue
            record = process_one(config, ledger, name, obj, ray_address=address, progress=progress)
            if record is not None:
                touched.append(record)
    return touched


def add(config: TenantsConfig, tenant: str, manifest: str) -> dict:
    """Copy a manifest into the tenant's inbox as ``<submission id><suffix>``, after checking it.

    A manifest that would be rejected is recorded as rejected and not copied.
    """
    if tenant not in config.tenants:
        raise ConfigError(f"unknown tenant {tenant!r}; the config has {sorted(config.tenants)}")
    suffix = next((s for s in MANIFEST_SUFFIXES if manifest.lower().endswith(s)), None)
    if suffix is None:
        raise ConfigError(f"{shown(manifest)!r} is not a manifest: use .csv, .jsonl or .parquet")
    t = config.tenants[tenant]
    data = storage.read_bytes(manifest)
    sid = submission_id(data)
    ledger = Ledger(config.submissions.state)
    existing = ledger.get(tenant, sid)
    if existing is not None:
        if existing["status"] == REJECTED:
            raise AccessDenied(f"submission {sid} was rejected: {existing.get('reason')}")
        return existing
    try:
        trusted_rows(
            parse_manifest(manifest, data), tenant, t, sid, config.submissions.max_recordings
        )
    except Rejected as exc:
        ledger.put(
            {
                "tenant": tenant,
                "submission_id": sid,
                "manifest": shown(manifest, 500),
                "received_at": _now(),
                "attempts": 0,
                "status": REJECTED,
                "reason": storage.redact(str(exc)),
                "recordings": 0,
            }
        )
        raise AccessDenied(f"submission {sid} rejected (recorded): {exc}") from None
    storage.write_bytes_atomic(storage.resolve(t.inbox).join(f"{sid}{suffix}"), data)
    return {
        "tenant": tenant,
        "submission_id": sid,
        "status": "queued",
        "inbox": shown(t.inbox, 500),
    }


# --- command line --------------------------------------------------------------------------

_COLUMNS = (
    "tenant",
    "submission_id",
    "status",
    "recordings",
    "audio_minutes",
    "failures",
    "cost_usd",
    "attempts",
)


def _table(records: list[dict]) -> str:
    rows = [[*_COLUMNS, "reason"]]
    for r in records:
        rows.append(
            [
                *("" if r.get(c) is None else str(r[c]) for c in _COLUMNS),
                shown(r.get("reason") or "", 200),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1]
        for row in rows
    )


def _cmd_add(args: argparse.Namespace) -> int:
    result = add(load_config(args.config), args.tenant, args.manifest)
    print(json.dumps(result, sort_keys=True))
    return 0


def _cmd_process(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    records = process(
        config, tenants=args.tenant, ray_address=args.address, progress=not args.quiet
    )
    for r in records:
        print(json.dumps({k: r.get(k) for k in (*_COLUMNS, "reason", "output")}, sort_keys=True))
    failed = [r for r in records if r["status"] == FAILED]
    print(
        f"[submissions] {len(records)} submission(s) handled, {len(failed)} failed", file=sys.stderr
    )
    return 1 if failed else 0


def _cmd_list(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    records = Ledger(config.submissions.state).all(args.tenant)
    if args.json:
        for r in records:
            print(json.dumps(r, sort_keys=True))
    else:
        print(_table(records))
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "submissions", help="contact-center bulk submissions: add, process, list"
    )
    sub = p.add_subparsers(dest="submissions_command", required=True)
    config_help = "central tenants config (TOML): [submissions], [transcribe], [tenants.NAME]"

    a = sub.add_parser("add", help="check a manifest and copy it into a tenant's inbox")
    a.add_argument("tenant")
    a.add_argument("manifest", help="CSV, JSONL or Parquet of recording URIs (a path or URL)")
    a.add_argument("--config", required=True, help=config_help)
    a.set_defaults(handler=_cmd_add)

    r = sub.add_parser("process", help="run every new submission of every tenant once")
    r.add_argument("--config", required=True, help=config_help)
    r.add_argument("--tenant", action="append", help="only this tenant (repeatable)")
    r.add_argument(
        "--address", help="Ray cluster address (default: [submissions] ray_address, else local)"
    )
    r.add_argument("--quiet", action="store_true", help="no progress lines")
    r.set_defaults(handler=_cmd_process)

    ls = sub.add_parser("list", help="status and totals of every submission")
    ls.add_argument("--config", required=True, help=config_help)
    ls.add_argument("--tenant")
    ls.add_argument("--json", action="store_true", help="one JSON object per line")
    ls.set_defaults(handler=_cmd_list)
