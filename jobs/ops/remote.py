"""Run a job on a Ray cluster through the Ray Jobs API: ``overnight submit``, ``status``, ``logs``.

The job file is validated here, on the submitting machine, then shipped as the only file of
the job's ``working_dir`` and run there as ``overnight run job.toml``. Code and dependencies
come from the cluster's image; credentials come from the cluster's own environment (instance
profile, IRSA, a Kubernetes Secret) and are never put into the runtime environment.

The submission id is deterministic (``overnight-<job file name>-<run date or run id>``), so a
scheduler that retries the submit does not start a second run: Ray refuses a second job with
the same submission id, and we report the existing one instead. The run id inside the job is
the same for every attempt, and runs resume from committed items, so ``--retry-failed`` after a
failed attempt (``<id>-retry1``, ``-retry2``, ...) only does the work that is left.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import tomli_w

from overnight.jobs.dataset.storage import scrub_secrets
from overnight.jobs.errors import ClusterJobFailed, ClusterUnreachable, ConfigError
from overnight.jobs.spec import JobSpec, build_spec, read_job_file

JOB_FILE = "job.toml"
# Settings the driver and workers need that are not secrets. Credentials stay in the cluster's
# own environment: they never travel in a runtime_env, which Ray shows on its dashboard.
FORWARDED_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION")
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_MAX_RETRIES = 20


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._") or "job"


def submission_id_for(
    job_file: str | Path, *, run_id: str | None = None, date: str | None = None
) -> str:
    """``overnight-<job file stem>-<run id or YYYYMMDD>``: the same night gives the same id."""
    if run_id:
        key = _slug(run_id)
    else:
        day = date or datetime.now(UTC).strftime("%Y-%m-%d")
        try:
            key = datetime.strptime(day, "%Y-%m-%d").strftime("%Y%m%d")
        except ValueError:
            raise ConfigError(f"--date must be YYYY-MM-DD, got {day!r}") from None
    return f"overnight-{_slug(Path(job_file).stem)}-{key}"[:128]


def check_submission_id(value: str) -> str:
    if not _ID.fullmatch(value):  # not match: its $ also matches before a final newline
        raise ConfigError(
            f"submission id {value!r} is not valid: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return value


# Any id a submission of ours has (a ``--retry-failed`` candidate, ``<id>-retryN``, may pass
# the 128 characters of a base id) or Ray makes (``raysubmit_...``).
_LOOKUP_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,255}")


def _check_lookup(submission_id: str) -> None:
    """``status``, ``logs`` and ``wait`` ask the Jobs API for ``/api/jobs/<id>``: an id that
    is empty or holds '/', '?' or '#' would ask for another of its paths (``../version``
    answers with the cluster's version), so it is refused before any request (exit 2)."""
    if not _LOOKUP_ID.fullmatch(submission_id):
        raise ConfigError(
            f"submission id {submission_id!r} is not valid: an id `overnight submit` printed is "
            "letters, digits, '.', '_' and '-', starting with a letter or digit"
        )


def _absolute(url: str) -> str:
    return url if "://" in url else os.path.abspath(os.path.expanduser(url))


def cluster_job_file(spec: JobSpec) -> dict[str, Any]:
    """The job file the cluster runs: the validated spec, every value explicit.

    Written from the validated model rather than copied, so comments or stray keys of the
    original never leave this machine. Local paths become absolute (the driver's working
    directory on the cluster is a temporary folder); ``ray_address`` is dropped because the
    driver joins the cluster it runs in (Ray Jobs sets ``RAY_ADDRESS``).
    """
    data = spec.model_dump(mode="json", exclude_none=True)
    job = data["job"]
    job.pop("ray_address", None)
    job["input"], job["output"] = _absolute(job["input"]), _absolute(job["output"])
    return data


def runtime_env_vars(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    env: Mapping[str, str] = os.environ if environ is None else environ
    return {k: env[k] for k in FORWARDED_ENV if env.get(k)}


@dataclass(frozen=True)
class Submitted:
    submission_id: str
    run_id: str
    status: str
    created: bool  # False: a job with this id existed and is reported instead
    message: str = ""
    local_paths: tuple[str, ...] = ()  # input/output the cluster must see at the same path


def api_address(address: str | None) -> str:
    found = address or os.environ.get("RAY_API_SERVER_ADDRESS") or os.environ.get("RAY_ADDRESS")
    if not found:
        raise ConfigError(
            "no cluster address: pass --address http://HEAD:8265 (the head node's dashboard port) "
            "or set RAY_API_SERVER_ADDRESS"
        )
    return found


def client(address: str | None):
    """A JobSubmissionClient, or ClusterUnreachable with what to check."""
    from ray.job_submission import JobSubmissionClient

    url = api_address(address)
    try:
        return JobSubmissionClient(url)
    except Exception as exc:  # ConnectionError, RuntimeError (version check), auth errors
        raise ClusterUnreachable(
            scrub_secrets(
                f"cannot reach the Ray Jobs API at {url}: {type(exc).__name__}: {str(exc)[:500]}. "
                "Check the address (the head node's dashboard port, usually 8265), that the "
                "cluster runs ray[default], and a port-forward or tunnel if you use one."
            )
        ) from None


def _job_info(cl, submission_id: str):
    """The job's details, or None when no job has this id."""
    try:
        return cl.get_job_info(submission_id)
    except RuntimeError as exc:
        if "404" in str(exc) or "does not exist" in str(exc):
            return None
        raise ClusterUnreachable(scrub_secrets(f"the Jobs API failed: {str(exc)[:1000]}")) from None
    except OSError as exc:  # requests' ConnectionError: the head went away
        raise ClusterUnreachable(
            scrub_secrets(f"lost the Ray Jobs API: {type(exc).__name__}: {str(exc)[:500]}")
        ) from None


def _status_text(info) -> str:
    return getattr(info.status, "value", str(info.status))


def _submit_once(cl, submission_id: str, job: dict[str, Any]) -> Submitted | None:
    """Submit ``job`` (the Jobs API's entrypoint, runtime_env and metadata) as
    ``submission_id``; None when the id is taken (the caller reports the existing job)."""
    try:
        # The driver only coordinates: it must fit on a head that advertises 0 CPUs.
        cl.submit_job(submission_id=submission_id, entrypoint_num_cpus=0, **job)
    except RuntimeError as exc:
        if "already exists" in str(exc):
            return None
        raise ClusterUnreachable(
            scrub_secrets(f"the cluster refused the job: {str(exc)[:1000]}")
        ) from None
    except OSError as exc:  # requests' ConnectionError
        raise ClusterUnreachable(
            scrub_secrets(f"lost the Ray Jobs API: {type(exc).__name__}: {str(exc)[:500]}")
        ) from None
    return Submitted(submission_id, job["metadata"]["run_id"], "PENDING", created=True)


def submit(
    job_file: str | Path | Mapping[str, Any] | JobSpec,
    address: str | None = None,
    *,
    submission_id: str | None = None,
    run_id: str | None = None,
    date: str | None = None,
    retry_failed: bool = False,
) -> Submitted:
    """Submit a job to the cluster at most once per submission id: a job file's path, or the
    spec itself (a ``JobSpec`` or its sections as a mapping, named by its kind in the id)."""
    if isinstance(job_file, str | Path):
        file_data = read_job_file(job_file)
        name: str | Path = job_file
    else:
        file_data = (
            job_file.model_dump(mode="json", exclude_none=True)
            if isinstance(job_file, JobSpec)
            else dict(job_file)
        )
        name = str((file_data.get("job") or {}).get("kind") or "job")
    # An empty id given (an unset template variable, `--run-id ""`) is refused by the checks
    # below, never replaced by a default: the run would land under another id than asked.
    base_id = check_submission_id(
        submission_id
        if submission_id is not None
        else submission_id_for(name, run_id=run_id, date=date)
    )
    if run_id is None:
        run_id = (file_data.get("job") or {}).get("run_id") or base_id
    spec = build_spec(file_data, {"job": {"run_id": run_id}})
    staged = cluster_job_file(spec)
    local = tuple(p for p in (staged["job"]["input"], staged["job"]["output"]) if "://" not in p)
    cl = client(address)

    work = Path(tempfile.mkdtemp(prefix="overnight-submit-"))
    try:
        (work / JOB_FILE).write_text(tomli_w.dumps(staged))
        # The same job under each candidate id.
        job = {
            "entrypoint": f"overnight run {JOB_FILE} --run-id {shlex.quote(spec.run_id)}",
            "runtime_env": {"working_dir": str(work), "env_vars": runtime_env_vars()},
            "metadata": {
                "overnight_job": Path(name).name,
                "run_id": spec.run_id,
                "base_submission_id": base_id,
            },
        }
        candidates = [base_id] + (
            [f"{base_id}-retry{n}" for n in range(1, _MAX_RETRIES + 1)] if retry_failed else []
        )
        existing = None
        for candidate in candidates:
            done = _submit_once(cl, candidate, job)
            if done is not None:
                return replace(done, local_paths=local)
            existing = _job_info(cl, candidate)
            status = _status_text(existing) if existing is not None else "UNKNOWN"
            if not retry_failed or status not in ("FAILED", "STOPPED"):
                return Submitted(
                    candidate,
                    spec.run_id,
                    status,
                    created=False,
                    message=scrub_secrets(str(getattr(existing, "message", "") or "")),
                )
        raise ClusterJobFailed(
            f"{base_id}: every retry up to {base_id}-retry{_MAX_RETRIES} has failed; "
            "look at `overnight logs` of the last one"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def wait(
    address: str | None, submission_id: str, *, timeout_s: float | None = None, poll_s: float = 2.0
) -> str:
    """Block until the job ends; returns its final status."""
    _check_lookup(submission_id)
    cl = client(address)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        info = _job_info(cl, submission_id)
        if info is None:
            raise ConfigError(f"no job with submission id {submission_id!r} on this cluster")
        status = _status_text(info)
        if status in TERMINAL:
            return status
        if deadline is not None and time.monotonic() > deadline:
            return status
        time.sleep(poll_s)


def status(address: str | None, submission_id: str) -> dict[str, Any]:
    _check_lookup(submission_id)
    cl = client(address)
    info = _job_info(cl, submission_id)
    if info is None:
        raise ConfigError(f"no job with submission id {submission_id!r} on this cluster")

    def when(ms: int | None) -> str | None:
        return (
            None
            if not ms
            else datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        )

    return {
        "submission_id": info.submission_id,
        "status": _status_text(info),
        "message": scrub_secrets(info.message or ""),
        "start_time": when(info.start_time),
        "end_time": when(info.end_time),
        "entrypoint": info.entrypoint,
        "driver_exit_code": info.driver_exit_code,
        "run_id": (info.metadata or {}).get("run_id"),
    }


def logs(address: str | None, submission_id: str) -> str:
    _check_lookup(submission_id)
    cl = client(address)
    if _job_info(cl, submission_id) is None:
        raise ConfigError(f"no job with submission id {submission_id!r} on this cluster")
    try:
        return scrub_secrets(cl.get_job_logs(submission_id))
    except (RuntimeError, OSError) as exc:
        raise ClusterUnreachable(
            scrub_secrets(f"cannot read the job's logs: {str(exc)[:500]}")
        ) from None


def follow_logs(address: str | None, submission_id: str, out=None) -> None:
    _check_lookup(submission_id)
    out = out or sys.stdout
    cl = client(address)
    if _job_info(cl, submission_id) is None:
        raise ConfigError(f"no job with submission id {submission_id!r} on this cluster")

    async def tail() -> None:
        async for chunk in cl.tail_job_logs(submission_id):
            out.write(scrub_secrets(chunk))
            out.flush()

    asyncio.run(tail())
