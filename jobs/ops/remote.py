"""Run a job on a Ray cluster through the Ray Jobs API: ``overnight submit``, ``status``, ``logs``.

The job file is validated here, on the submitting machine, then shipped as the only file of
the job's ``working_dir`` and run there as ``overnight run job.toml``. Code and dependencies
come from the cluster's image; credentials come from the cluster's own environment (instance
profile, IRSA, a Kubernetes Secret) and are never put into the runtime environment.

The submission id is deterministic (``overnight-<job file name>-<run date or run id>-<digest>``,
the digest of the job's kind, input and output), so a scheduler that retries the submit does
not start a second run: Ray refuses a second job with the same submission id, and we report
the existing one instead. Two jobs that only share a file name or a kind (two tenants'
``nightly.toml``, two DAGs' mappings) get different ids. The existing job is reported only if
it is this job: one with other options (a corrected job file) is refused, so two versions of a
job never write into one output at once. The run id inside the job is the same for every
attempt, and runs resume from committed items, so ``--retry-failed`` after a failed attempt
(``<id>-retry1``, ``-retry2``, ...) only does the work that is left.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
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
from overnight.jobs.errors import (
    ClusterJobFailed,
    ClusterUnreachable,
    ConfigError,
    InputNotFound,
    OvernightError,
)
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


def _night(date: str | None) -> str | None:
    """``date`` checked as YYYY-MM-DD, or None."""
    if date is None:
        return None
    try:
        return datetime.strptime(date, "%Y-%m-%d").strftime("%Y-%m-%d")
    except ValueError:
        raise ConfigError(f"--date must be YYYY-MM-DD, got {date!r}") from None


def submission_id_for(
    job_file: str | Path,
    *,
    run_id: str | None = None,
    date: str | None = None,
    identity: str | None = None,
) -> str:
    """``overnight-<job file stem>-<run id or YYYYMMDD>[-<identity>]``: the same job on the same
    night gives the same id. ``identity`` (``job_identity``) tells apart jobs that share a file
    name or a kind; it is kept whole when a long name is cut to Ray's 128 characters."""
    if run_id:
        key = _slug(run_id)
    else:
        key = (_night(date) or datetime.now(UTC).strftime("%Y-%m-%d")).replace("-", "")
    head = f"overnight-{_slug(Path(job_file).stem)}-{key}"
    if not identity:
        return head[:128]
    return f"{head[: 127 - len(identity)].rstrip('-._')}-{identity}"


def _digest(data: Any, length: int) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:length]


def job_identity(spec: JobSpec) -> str:
    """What makes a job that job, as 8 hex digits: its kind, input and output (local paths
    absolute, as shipped). Options are left out on purpose: a corrected job file is the same
    job, and is told apart from the running one by ``spec_digest`` instead."""
    job = spec.job
    return _digest([job.kind, _absolute(job.input), _absolute(job.output)], 8)


def spec_digest(shipped: Mapping[str, Any]) -> str:
    """The shipped job file's digest, without its run id: a JobSpec built again by a retried
    task has a new random run id, and is still the same job."""
    job = {k: v for k, v in shipped["job"].items() if k != "run_id"}
    return _digest({**shipped, "job": job}, 16)


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


def _local_folder(value: str) -> bool:
    # A model is a name (``small``), a hub id (``org/name``) or a local folder: only the last
    # is a path, and a hub id must not become /home/me/org/name.
    return "://" not in value and (
        value.startswith(("/", "./", "../", "~")) or os.path.isdir(os.path.expanduser(value))
    )


def _inline_files(process: dict[str, Any]) -> None:
    """Put the contents of a local ``schema`` or ``prompt`` file into the job file, read as
    the run reads them (``jobs.process``): the cluster gets the job file only, and a path
    there named a file it does not have (exit 9 after the job started, although
    ``run --dry-run`` passed here)."""
    from overnight.jobs.process import read_schema, read_template

    try:
        schema = process.get("schema")
        if isinstance(schema, str) and not schema.lstrip().startswith("{"):
            process["schema"] = read_schema(os.path.expanduser(schema), "schema")
        prompt = process.get("prompt")
        if isinstance(prompt, str) and os.path.isfile(os.path.expanduser(prompt)):
            process["prompt"] = read_template(os.path.expanduser(prompt))
    except ConfigError as exc:
        raise ConfigError(
            f"{exc}; the cluster gets the job file only, so it is read here and sent inside it"
        ) from None


def cluster_job_file(spec: JobSpec) -> dict[str, Any]:
    """The job file the cluster runs: the validated spec, every value explicit.

    Written from the validated model rather than copied, so comments or stray keys of the
    original never leave this machine. Local paths become absolute (the driver's working
    directory on the cluster is a temporary folder), and the ``schema`` and ``prompt`` files
    are inlined (the job file is all the cluster gets); ``ray_address`` is dropped because the
    driver joins the cluster it runs in (Ray Jobs sets ``RAY_ADDRESS``).
    """
    data = spec.model_dump(mode="json", exclude_none=True, by_alias=True)
    job = data["job"]
    job.pop("ray_address", None)
    job["input"], job["output"] = _absolute(job["input"]), _absolute(job["output"])
    if job.get("allowed_input_prefixes"):
        job["allowed_input_prefixes"] = [_absolute(p) for p in job["allowed_input_prefixes"]]
    for section in ("transcribe", "process"):
        model = data.get(section, {}).get("model")
        if isinstance(model, str) and _local_folder(model):
            data[section]["model"] = _absolute(model)
    if "process" in data:
        _inline_files(data["process"])
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


# Where Ray's Jobs client looks for the token (docs.ray.io, "Ray token authentication").
_AUTH_HELP = (
    "set RAY_AUTH_MODE=token here and give the cluster's token in RAY_AUTH_TOKEN, in a file "
    "named by RAY_AUTH_TOKEN_PATH, or in ~/.ray/auth_token (`ray get-auth-token` on the head "
    "node prints it)"
)


def _one_line(text: str, limit: int = 500) -> str:
    """``text`` as one line of at most about ``limit`` characters, cut after a sentence or a
    word: the Jobs API's answers hold newlines, escaped ones (``\\n`` from a JSON body) and
    whole HTML pages."""
    text = " ".join(text.replace("\\n", " ").split())
    if len(text) <= limit:
        return text
    cut = text[:limit]
    sentence = cut.rfind(". ")
    if sentence > limit // 2:
        return cut[: sentence + 1]
    return cut.rsplit(" ", 1)[0].rstrip(",;:") + " ..."


def _auth_refused(exc: BaseException) -> str | None:
    """How token authentication refused the request (no token, a wrong one), or None."""
    text = str(exc)
    # Ray's AuthenticationError (2.52 and later) by name: older Rays have no such class.
    if type(exc).__name__ != "AuthenticationError" and not re.search(
        r"status code 40[13]\b|authentication token", text, re.IGNORECASE
    ):
        return None
    if "403" in text or "Invalid authentication token" in text or "Authentication failed" in text:
        return "the token it was sent is not the cluster's"
    return "it was sent no token"


def _api_failure(exc: BaseException, url: str, doing: str) -> OvernightError:
    """One paragraph for a failed Jobs API call: a refused token says where the token goes,
    anything else what to check."""
    refused = _auth_refused(exc)
    if refused:
        return ClusterUnreachable(
            f"the Ray Jobs API at {url} uses token authentication, and {refused}: {_AUTH_HELP}."
        )
    said = f"{doing} at {url}: {type(exc).__name__}: {_one_line(str(exc))}"
    said += "" if said.endswith(".") else "."
    advice = (
        " Check the address (the head node's dashboard port, usually 8265), that the cluster "
        "runs ray[default], and a port-forward or tunnel if you use one."
        if doing.startswith("cannot reach")
        else ""
    )
    return ClusterUnreachable(scrub_secrets(said + advice))


def _url(cl) -> str:
    return str(getattr(cl, "_address", "") or "the cluster")


def client(address: str | None):
    """A JobSubmissionClient, or ClusterUnreachable with what to check."""
    from ray.job_submission import JobSubmissionClient

    url = api_address(address)
    try:
        return JobSubmissionClient(url)
    except Exception as exc:  # ConnectionError, RuntimeError (version check), auth errors
        raise _api_failure(exc, url, "cannot reach the Ray Jobs API") from None


def _job_info(cl, submission_id: str):
    """The job's details, or None when no job has this id."""
    try:
        return cl.get_job_info(submission_id)
    except Exception as exc:  # RuntimeError (an answer), OSError (the head went away), auth
        text = str(exc)
        if (
            isinstance(exc, RuntimeError)
            and not _auth_refused(exc)
            and ("404" in text or "does not exist" in text)
        ):
            return None
        raise _api_failure(exc, _url(cl), "the Jobs API failed") from None


def _no_such(submission_id: str, cl) -> InputNotFound:
    return InputNotFound(
        f"no such submission: no job has the id {submission_id!r} on {_url(cl)}; give an id "
        "`overnight submit` printed, and the address of the cluster it was submitted to"
    )


def _status_text(info) -> str:
    return getattr(info.status, "value", str(info.status))


def _run_id_of(info) -> str | None:
    """The run id a submitted job runs as: its metadata, else its entrypoint's --run-id."""
    found = (getattr(info, "metadata", None) or {}).get("run_id")
    if found:
        return str(found)
    try:
        words = shlex.split(getattr(info, "entrypoint", "") or "")
    except ValueError:
        return None
    return next((b for a, b in itertools.pairwise(words) if a == "--run-id"), None)


def _submit_once(cl, submission_id: str, job: dict[str, Any]) -> Submitted | None:
    """Submit ``job`` (the Jobs API's entrypoint, runtime_env and metadata) as
    ``submission_id``; None when the id is taken (the caller reports the existing job)."""
    try:
        # The driver only coordinates: it must fit on a head that advertises 0 CPUs.
        cl.submit_job(submission_id=submission_id, entrypoint_num_cpus=0, **job)
    except Exception as exc:  # RuntimeError (an answer), OSError (the head went away), auth
        if isinstance(exc, RuntimeError) and "already exists" in str(exc):
            return None
        raise _api_failure(exc, _url(cl), "the cluster refused the job") from None
    return Submitted(submission_id, job["metadata"]["run_id"], "PENDING", created=True)


def _another_version(
    submission_id: str, status: str, address: str, output: str, *, ours: bool
) -> ConfigError:
    """The refusal when ``submission_id`` runs or ran another spec than this one."""
    what = f"{submission_id} exists on {address} ({status}) " + (
        "with another version of this job (the same kind, input and output, other options)"
        if ours
        else "and is not this job (it was not submitted by `overnight submit` of this job)"
    )
    if status in ("FAILED", "STOPPED"):
        how = (
            ": resubmit with --retry-failed to run this version as a retry of the same run "
            "(finished items are kept)"
        )
    elif status == "SUCCEEDED":
        how = (
            ": that night is done; to run this version as well, give it another --run-id (a "
            "new run) or another --date"
        )
    else:
        how = (
            f", so that two versions do not write into {output} at once: wait for it to end, or "
            f"stop it (`ray job stop {submission_id} --address {address}`) and resubmit with "
            "--retry-failed"
        )
    return ConfigError(f"{what}; this one was not submitted{how}.")


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
    spec itself (a ``JobSpec`` or its sections as a mapping, named by its kind in the id).

    ``date`` (YYYY-MM-DD) is the run's ``run_date`` (the partition its rows land in) as well
    as the night in its id; a job file's own ``run_date`` names the id when ``date`` is not
    given, and one that differs from ``date`` is refused. ``Submitted.run_id`` is the run id
    of the job that runs: the existing job's when it is reported instead."""
    if isinstance(job_file, str | Path):
        file_data = read_job_file(job_file)
        name: str | Path = job_file
    else:
        file_data = (
            job_file.model_dump(mode="json", exclude_none=True, by_alias=True)
            if isinstance(job_file, JobSpec)
            else dict(job_file)
        )
        name = str((file_data.get("job") or {}).get("kind") or "job")
    night = _night(date)
    first = build_spec(file_data, {"job": {"run_id": run_id}})
    own = first.job.run_date.isoformat() if first.job.run_date else None
    if night and own and own != night:
        raise ConfigError(
            f"--date {night} but the job file's run_date is {own}: the submission would be "
            "named for one night and its rows written under the other; leave out one of them "
            "or make them the same"
        )
    # A night-named submission runs as that night, not as the day the cluster starts it.
    named_by_night = submission_id is None and not run_id
    if named_by_night and not (night or own):
        night = datetime.now(UTC).strftime("%Y-%m-%d")
    run_date = night if (night and not own and (date or named_by_night)) else None
    # An empty id given (an unset template variable, `--run-id ""`) is refused by the checks
    # below, never replaced by a default: the run would land under another id than asked.
    base_id = check_submission_id(
        submission_id
        if submission_id is not None
        else submission_id_for(name, run_id=run_id, date=night or own, identity=job_identity(first))
    )
    if run_id is None:
        run_id = (file_data.get("job") or {}).get("run_id") or base_id
    spec = build_spec(file_data, {"job": {"run_id": run_id, "run_date": run_date}})
    staged = cluster_job_file(spec)
    digest = spec_digest(staged)
    local = tuple(p for p in (staged["job"]["input"], staged["job"]["output"]) if "://" not in p)
    cl = client(address)
    where = api_address(address)

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
                "spec_digest": digest,
            },
        }
        candidates = [base_id] + (
            [f"{base_id}-retry{n}" for n in range(1, _MAX_RETRIES + 1)] if retry_failed else []
        )
        for candidate in candidates:
            done = _submit_once(cl, candidate, job)
            if done is not None:
                return replace(done, local_paths=local)
            existing = _job_info(cl, candidate)
            status = _status_text(existing) if existing is not None else "UNKNOWN"
            if retry_failed and status in ("FAILED", "STOPPED"):
                continue
            theirs = (getattr(existing, "metadata", None) or {}).get("spec_digest")
            if existing is not None and theirs != digest:
                raise _another_version(
                    candidate, status, where, staged["job"]["output"], ours=theirs is not None
                )
            return Submitted(
                candidate,
                (_run_id_of(existing) if existing is not None else None) or spec.run_id,
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
            raise _no_such(submission_id, cl)
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
        raise _no_such(submission_id, cl)

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
        "run_id": _run_id_of(info),
    }


def logs(address: str | None, submission_id: str) -> str:
    _check_lookup(submission_id)
    cl = client(address)
    if _job_info(cl, submission_id) is None:
        raise _no_such(submission_id, cl)
    try:
        return scrub_secrets(cl.get_job_logs(submission_id))
    except Exception as exc:  # RuntimeError (an answer), OSError (the head went away), auth
        raise _api_failure(exc, _url(cl), "cannot read the job's logs") from None


def follow_logs(address: str | None, submission_id: str, out=None) -> None:
    _check_lookup(submission_id)
    out = out or sys.stdout
    cl = client(address)
    if _job_info(cl, submission_id) is None:
        raise _no_such(submission_id, cl)

    async def tail() -> None:
        async for chunk in cl.tail_job_logs(submission_id):
            out.write(scrub_secrets(chunk))
            out.flush()

    try:
        asyncio.run(tail())
    except Exception as exc:  # the stream broke: the head went away, or a refused token
        raise _api_failure(exc, _url(cl), "lost the job's logs") from None
