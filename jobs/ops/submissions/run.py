"""Processing submissions: every new one of every tenant once, resumed after a failure."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

import pyarrow.compute as pc

from overnight.jobs.dataset import storage
from overnight.jobs.dataset.manifest import MANIFEST_SUFFIXES
from overnight.jobs.errors import (
    AccessDenied,
    ConfigError,
    InputNotFound,
    ModelNotFound,
    OutputNotWritable,
    OvernightError,
    StorageUnavailable,
)
from overnight.jobs.ops.submissions.config import Tenant, TenantsConfig
from overnight.jobs.ops.submissions.manifests import (
    Rejected,
    parse_manifest,
    submission_id,
    trusted_rows,
)
from overnight.jobs.ops.submissions.state import (
    DONE,
    FAILED,
    REJECTED,
    RUNNING,
    SubmissionStore,
    _now,
)
from overnight.jobs.ops.submissions.urls import shown

_SUBMISSION = re.compile(r"^sub-[0-9a-f]{24}$")


def _silent(line: str) -> None:
    pass


def output_for(tenant: Tenant, sid: str) -> storage.Location:
    if not _SUBMISSION.match(sid):  # built by submission_id(); never from a name or a key
        raise ValueError(f"not a submission id: {sid!r}")
    return storage.resolve(tenant.output).join("submissions", sid)


def _bucket_exists(url: str, what: str) -> None:
    """``OutputNotWritable`` when an object store location's bucket is missing or refused
    (a local folder is made when first written)."""
    from overnight.jobs import preflight

    if storage.resolve(url).scheme != "file":
        preflight.check_output(url, what)


def _inbox(name: str, tenant: Tenant) -> list[storage.ObjectInfo]:
    # A missing inbox bucket read as an empty inbox, and the step said all was done.
    _bucket_exists(tenant.inbox, f"tenant {name}'s inbox")
    try:
        objects = storage.list_objects(tenant.inbox)
    except InputNotFound:  # nothing submitted yet
        return []
    return [o for o in objects if o.uri.lower().endswith(MANIFEST_SUFFIXES)]


def _totals(out: storage.Location) -> dict[str, Any]:
    from overnight.jobs.dataset import commits

    table = commits.CommittedDataset(out.join("transcripts")).read_results(
        ["item_id", "status", "duration_s"]
    )
    costs = commits.CommittedDataset(out.join("costs")).read_results(["cost_usd"])
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
    verbose: bool = False,
) -> dict:
    from overnight.jobs.spec import build_spec
    from overnight.jobs.transcribe import run_transcribe

    data: dict[str, Any] = {
        "job": {
            "input": manifest_url,
            "output": out.url(),
            "run_id": run_id,
            "ray_address": ray_address,
            "progress": progress,
            "verbose": verbose,
            # Checked again on each opened file: the URIs were checked long before.
            "allowed_input_prefixes": list(tenant.allowed_input_prefixes),
        },
        "transcribe": config.transcribe.model_dump(exclude_none=True),
    }
    if config.prices:
        data["prices"] = dict(config.prices)
    return run_transcribe(build_spec(data))


def _received(tenant: str, sid: str, manifest: str, **more: Any) -> dict[str, Any]:
    """A new submission's record, before any attempt."""
    return {
        "tenant": tenant,
        "submission_id": sid,
        "manifest": shown(manifest, 500),
        "received_at": _now(),
        "attempts": 0,
        **more,
    }


def _rejected(record: dict[str, Any], reason: str) -> dict[str, Any]:
    return {**record, "status": REJECTED, "reason": storage.scrub_secrets(reason), "recordings": 0}


def _manifest_key(obj: storage.ObjectInfo) -> str:
    """Which inbox object (and version) a record came from: lets a rerun skip it unread."""
    return hashlib.sha256(f"{obj.uri}\n{obj.etag}\n{obj.size}".encode()).hexdigest()[:32]


def process_one(
    config: TenantsConfig,
    store: SubmissionStore,
    name: str,
    obj: storage.ObjectInfo,
    *,
    ray_address: str | None = None,
    progress: bool = True,
    verbose: bool = False,
    echo: Callable[[str], None] = _silent,
) -> dict | None:
    """Handle one manifest of the inbox; returns its submission record, or None if nothing to do.
    ``echo`` gets a line (credentials redacted) when a submission starts, fails or is rejected."""

    def say(text: str) -> None:
        echo(f"[submissions] {storage.scrub_secrets(text)}")

    tenant = config.tenants[name]
    try:
        # Confined to the inbox: a link there to /etc/passwd or to another tenant's
        # manifest was read, and what it held went into this tenant's record.
        data = storage.read_bytes(obj.uri, within=[tenant.inbox])
    except FileNotFoundError:  # removed since the listing
        return None
    except (storage.Unreadable, PermissionError, IsADirectoryError) as exc:
        # One unreadable object (a dangling link, a FIFO) stopped every tenant's step in a
        # traceback; it is this object's rejection, recorded so that the next run skips it.
        key = _manifest_key(obj)
        sid = submission_id(key.encode())
        say(f"{name}/{sid}: rejected: the inbox object cannot be read: {exc}")
        return store.put(
            _rejected(
                _received(name, sid, obj.uri, manifest_key=key),
                f"the inbox object cannot be read: {exc}",
            )
        )
    sid = submission_id(data)
    record = store.get(name, sid)
    if record is not None:
        if record["status"] in (DONE, REJECTED):
            return None
        if record.get("attempts", 0) >= config.submissions.max_attempts:
            if record["status"] == RUNNING:
                return store.put(
                    {
                        **record,
                        "status": FAILED,
                        "reason": f"gave up after {record['attempts']} attempts; the last one "
                        "stopped without recording a cause (its process died: see its logs)",
                    }
                )
            return None
    base = record or _received(name, sid, obj.uri, manifest_key=_manifest_key(obj))
    try:
        rows = trusted_rows(
            parse_manifest(obj.uri, data), name, tenant, sid, config.submissions.max_recordings
        )
    except Rejected as exc:
        say(f"{name}/{sid}: rejected: {exc}")
        return store.put(_rejected(base, str(exc)))

    out = output_for(tenant, sid)
    attempt = int(base.get("attempts", 0)) + 1
    record = store.put(
        {
            **base,
            "status": RUNNING,
            "attempts": attempt,
            "reason": None,
            "output": out.url(),
            "recordings_listed": len(rows),
        }
    )
    say(f"{name}/{sid}: {len(rows)} recordings, attempt {attempt} -> {shown(out.url(), 300)}")
    try:
        _bucket_exists(out.url(), f"tenant {name}'s output")
        manifest_url = _write_trusted_manifest(out, rows)
        summary = _run(
            config, tenant, manifest_url, out, f"{sid}-{attempt}", ray_address, progress, verbose
        )
        totals = _totals(out)
    except StorageUnavailable:
        # Recording the failure needs the storage that just failed: leave the record at
        # "running" and stop; the next run resumes this submission.
        raise
    except ModelNotFound as exc:
        # The model is every submission's: the next one would fail the same way, and each
        # failure would spend one of its attempts on an outage that is not its own. Record
        # the cause without counting the attempt, and stop the step.
        say(f"{name}/{sid}: stopped: the model cannot be loaded (not counted as an attempt)")
        store.put(
            {
                **record,
                "status": FAILED,
                "attempts": attempt - 1,
                "reason": storage.scrub_secrets(f"not run: {exc}")[:2000],
            }
        )
        raise ModelNotFound(
            f"{exc} The submissions step stopped at {name}/{sid}, which runs again at the "
            "next `overnight submissions process`, with the submissions not reached yet; "
            "this stop did not count against their attempts."
        ) from None
    except OutputNotWritable as exc:
        # The tenant's output (a missing bucket, refused credentials) is not this submission's
        # fault: counted, it spent every attempt before the bucket was made, and then the
        # submission was never run again.
        say(f"{name}/{sid}: not run: {exc} (not counted as an attempt)")
        return store.put(
            {
                **record,
                "status": FAILED,
                "attempts": attempt - 1,
                "reason": storage.scrub_secrets(f"not run: {exc}")[:2000],
            }
        )
    except Exception as exc:
        # Whatever one submission raises is its own failure, recorded with its cause; the
        # other tenants' submissions still run. Only storage that is down stops them all.
        reason = str(exc) if isinstance(exc, OvernightError) else f"{type(exc).__name__}: {exc}"
        say(f"{name}/{sid}: failed: {reason}")
        return store.put(
            {**record, "status": FAILED, "reason": storage.scrub_secrets(reason)[:2000]}
        )
    return store.put(
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
    verbose: bool = False,
    echo: Callable[[str], None] = _silent,
) -> list[dict]:
    """Every new (or unfinished) submission of every tenant; returns the records written."""
    unknown = sorted(set(tenants or ()) - set(config.tenants))
    if unknown:
        raise ConfigError(f"unknown tenant(s) {unknown}; the config has {sorted(config.tenants)}")
    store = SubmissionStore(config.submissions.state)
    address = ray_address or config.submissions.ray_address
    pending: list[tuple[str, storage.ObjectInfo]] = []
    for name in sorted(tenants or config.tenants):
        inbox = _inbox(name, config.tenants[name])
        if not inbox:
            continue
        finished = {
            r.get("manifest_key") for r in store.all(name) if r["status"] in (DONE, REJECTED)
        }
        pending += [(name, obj) for obj in inbox if _manifest_key(obj) not in finished]
    if pending:
        from overnight.jobs.run import on_ray

        on_ray.check_reachable(address)  # before any record says "running"
        _check_model(config, address, progress)
    touched = []
    for name, obj in pending:
        record = process_one(
            config,
            store,
            name,
            obj,
            ray_address=address,
            progress=progress,
            verbose=verbose,
            echo=echo,
        )
        if record is not None:
            touched.append(record)
    return touched


def _check_model(config: TenantsConfig, address: str | None, progress: bool) -> None:
    """The speech model, once, before any submission starts: a missing model is every
    submission's failure, and would otherwise spend an attempt of each."""
    from overnight.jobs import preflight
    from overnight.jobs.run import on_ray

    try:
        preflight.whisper_model(
            config.transcribe.model, download=on_ray.local_run(address), progress=progress
        )
    except ModelNotFound as exc:
        raise ModelNotFound(
            f"{exc} No submission was started: they all run at the next `overnight "
            "submissions process` once the model can be loaded (the [transcribe] section's "
            "model in the tenants config)."
        ) from None


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
    storage.reach(manifest, f"the manifest {shown(manifest)}")  # the first contact, in seconds
    try:
        data = storage.read_bytes(manifest)
    except FileNotFoundError:
        raise InputNotFound(f"manifest {shown(manifest)!r} does not exist") from None
    except (storage.Unreadable, IsADirectoryError) as exc:
        raise InputNotFound(f"manifest {shown(manifest)!r} cannot be read: {exc}") from None
    except PermissionError:
        raise StorageUnavailable(
            f"reading the manifest {shown(manifest)!r} is denied to these credentials (AWS_* / "
            "GOOGLE_* environment)"
        ) from None
    _bucket_exists(t.inbox, f"tenant {tenant}'s inbox")
    sid = submission_id(data)
    store = SubmissionStore(config.submissions.state)
    existing = store.get(tenant, sid)
    if existing is not None:
        if existing["status"] == REJECTED:
            raise AccessDenied(f"submission {sid} was rejected: {existing.get('reason')}")
        return existing
    try:
        trusted_rows(
            parse_manifest(manifest, data), tenant, t, sid, config.submissions.max_recordings
        )
    except Rejected as exc:
        store.put(_rejected(_received(tenant, sid, manifest), str(exc)))
        raise AccessDenied(f"submission {sid} rejected (recorded): {exc}") from None
    storage.write_bytes_atomic(storage.resolve(t.inbox).join(f"{sid}{suffix}"), data)
    return {
        "tenant": tenant,
        "submission_id": sid,
        "status": "queued",
        "inbox": shown(t.inbox, 500),
    }
