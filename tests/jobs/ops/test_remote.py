"""``overnight submit`` without a cluster: ids, what is shipped, and a cluster that is not there.

``FakeJobs`` stands in for Ray's ``JobSubmissionClient`` where only the Jobs API's answers
matter (an id taken, a job's status); the real Jobs API round trip (and a worker node lost
mid-run) is in test_cluster.py.
"""

from __future__ import annotations

import http.server
import threading
import tomllib
from pathlib import Path

import pytest

from overnight.jobs.cli import main
from overnight.jobs.errors import ClusterJobFailed, ConfigError, InputNotFound
from overnight.jobs.ops import remote
from overnight.jobs.spec import build_spec
from tests.conftest import _free_port, secrets_in

ADDRESS = "http://127.0.0.1:9"  # never reached: FakeJobs answers


class FakeJobs:
    """The part of ``JobSubmissionClient`` that remote.py calls, answering as Ray does (its
    error texts, ``JobDetails``); ``shipped`` keeps each submission's job file."""

    _address = ADDRESS

    def __init__(self):
        self.jobs: dict = {}
        self.shipped: dict[str, dict] = {}

    def submit_job(self, *, submission_id, entrypoint, runtime_env, metadata, **_):
        from ray.job_submission import JobDetails, JobStatus, JobType

        if submission_id in self.jobs:
            raise RuntimeError(
                f"Request failed with status code 400: Job with submission_id {submission_id} "
                "already exists. Please use a different submission_id."
            )
        job_file = Path(runtime_env["working_dir"]) / remote.JOB_FILE
        self.shipped[submission_id] = tomllib.loads(job_file.read_text())
        self.jobs[submission_id] = JobDetails(
            type=JobType.SUBMISSION,
            submission_id=submission_id,
            status=JobStatus.RUNNING,
            entrypoint=entrypoint,
            metadata=metadata,
        )
        return submission_id

    def get_job_info(self, submission_id):
        if submission_id not in self.jobs:
            raise RuntimeError(
                f"Request failed with status code 404: Job {submission_id} does not exist."
            )
        return self.jobs[submission_id]

    def end(self, submission_id: str, status: str) -> None:
        from ray.job_submission import JobStatus

        self.jobs[submission_id] = self.jobs[submission_id].model_copy(
            update={"status": JobStatus(status)}
        )


@pytest.fixture
def jobs(monkeypatch) -> FakeJobs:
    fake = FakeJobs()
    monkeypatch.setattr(remote, "client", lambda address: fake)
    return fake


def job_file(path: Path, input: str, output: str, extra: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'[job]\ninput = "{input}"\noutput = "{output}"\n{extra}')
    return path


def test_submission_id_is_the_same_for_the_same_night_and_job_file():
    a = remote.submission_id_for("/etc/overnight/jobs/nightly.toml", date="2026-12-01")
    b = remote.submission_id_for("other/place/nightly.toml", date="2026-12-01")
    assert a == b == "overnight-nightly-20261201"
    assert (
        remote.submission_id_for("Nightly Calls.toml", run_id="Run 7/b")
        == "overnight-nightly-calls-run-7-b"
    )
    named = remote.submission_id_for("j" * 200, date="2026-12-01", identity="0123abcd")
    assert len(named) == 128 and named.endswith("j-0123abcd")
    assert remote.check_submission_id(named) == named
    with pytest.raises(ConfigError, match="YYYY-MM-DD"):
        remote.submission_id_for("nightly.toml", date="01/12/2026")
    with pytest.raises(ConfigError, match="not valid"):
        remote.check_submission_id("../etc; rm -rf")


def test_shipped_job_file_is_the_validated_spec_with_absolute_paths_and_no_ray_address(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    spec = build_spec(
        {
            "job": {
                "input": "calls",
                "output": "s3://results/nightly",
                "ray_address": "auto",
                "run_id": "r1",
            },
            "transcribe": {"actors": 8, "accelerator_type": "H100"},
        }
    )
    shipped = remote.cluster_job_file(spec)
    assert shipped["job"]["input"] == str(tmp_path / "calls")
    assert shipped["job"]["output"] == "s3://results/nightly"
    assert "ray_address" not in shipped["job"]
    assert shipped["job"]["run_id"] == "r1"
    assert (shipped["transcribe"]["actors"], shipped["transcribe"]["accelerator_type"]) == (
        8,
        "H100",
    )
    import tomli_w

    assert build_spec(tomllib.loads(tomli_w.dumps(shipped))).transcribe == spec.transcribe


def test_only_non_secret_settings_travel_in_the_runtime_env(s3):
    env = remote.runtime_env_vars()
    assert {"AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION"} <= set(env) <= set(remote.FORWARDED_ENV)
    assert not secrets_in(str(env))


def test_unreachable_cluster_exits_with_a_clear_message_and_no_credentials(tmp_path, s3, capsys):
    job = tmp_path / "nightly.toml"
    job.write_text('[job]\ninput = "s3://calls/x/"\noutput = "s3://out/y"\n')
    address = f"http://127.0.0.1:{_free_port()}"
    assert main(["submit", str(job), "--address", address]) == remote.ClusterUnreachable.exit_code
    err = capsys.readouterr().err
    assert f"cannot reach the Ray Jobs API at {address}" in err and "dashboard port" in err
    assert not secrets_in(err)


def test_invalid_job_file_is_refused_before_contacting_the_cluster(tmp_path, capsys):
    job = tmp_path / "nightly.toml"
    job.write_text('[job]\ninput = "calls"\noutput = "out"\n\n[transcribe]\nactors = 0\n')
    assert main(["submit", str(job), "--address", "http://127.0.0.1:9"]) == ConfigError.exit_code
    assert "transcribe.actors" in capsys.readouterr().err


def test_submit_without_an_address_says_how_to_give_one(tmp_path, monkeypatch, capsys):
    for key in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        monkeypatch.delenv(key, raising=False)
    job = tmp_path / "nightly.toml"
    job.write_text('[job]\ninput = "calls"\noutput = "out"\n')
    assert main(["submit", str(job)]) == ConfigError.exit_code
    assert "--address http://HEAD:8265" in capsys.readouterr().err


def test_an_empty_run_or_submission_id_is_refused_not_replaced_by_a_default(tmp_path, capsys):
    job = tmp_path / "nightly.toml"
    job.write_text('[job]\ninput = "calls"\noutput = "out"\n')
    address = "http://127.0.0.1:9"  # never reached: both are refused first
    assert main(["submit", str(job), "--address", address, "--run-id", ""]) == ConfigError.exit_code
    assert "run id" in capsys.readouterr().err
    argv = ["submit", str(job), "--address", address, "--submission-id", ""]
    assert main(argv) == ConfigError.exit_code
    assert "submission id '' is not valid" in capsys.readouterr().err


# -- ids: one per job, not per file name -------------------------------------------------------


def test_two_tenants_nightly_toml_on_the_same_night_are_two_submissions(tmp_path, jobs, capsys):
    a = job_file(tmp_path / "nightly.toml", "s3://calls/a/", "s3://out/a")
    b = job_file(tmp_path / "tenantB" / "nightly.toml", "s3://calls/b/", "s3://out/b")
    for path in (a, b):
        assert main(["submit", str(path), "--address", ADDRESS, "--date", "2026-12-07"]) == 0
        assert "submitted overnight-nightly-20261207-" in capsys.readouterr().out
    assert len(jobs.jobs) == 2
    assert {s["job"]["output"] for s in jobs.shipped.values()} == {"s3://out/a", "s3://out/b"}
    for submission_id in jobs.jobs:
        assert remote.check_submission_id(submission_id) == submission_id


def test_two_dags_submitting_mappings_of_one_kind_the_same_night_are_two_submissions(jobs):
    def night(tenant: str) -> dict:
        return {"job": {"kind": "transcribe", "input": f"s3://in/{tenant}/", "output": "s3://o"}}

    first = remote.submit(night("a"), ADDRESS, date="2026-11-30")
    second = remote.submit(night("b"), ADDRESS, date="2026-11-30")
    assert first.created and second.created
    assert first.submission_id != second.submission_id
    assert first.submission_id.startswith("overnight-transcribe-20261130-")


def test_the_same_job_resubmitted_the_same_night_reports_the_run_id_of_the_job_that_runs(
    tmp_path, jobs, capsys
):
    job = {"job": {"kind": "transcribe", "input": "s3://in/", "output": "s3://out/"}}
    # An orchestrator's retried task builds its JobSpec again: a new random run id each time.
    first = remote.submit(build_spec(job), ADDRESS, date="2026-12-01")
    again = remote.submit(build_spec(job), ADDRESS, date="2026-12-01")
    assert first.created and not again.created
    assert again.submission_id == first.submission_id and again.status == "RUNNING"
    assert again.run_id == first.run_id == jobs.shipped[first.submission_id]["job"]["run_id"]

    path = job_file(tmp_path / "nightly.toml", "s3://in/", "s3://out/")
    argv = ["submit", str(path), "--address", ADDRESS, "--date", "2026-12-01"]
    assert main(argv) == 0
    assert main(argv) == 0  # idempotent: a scheduler's retry
    assert "already exists" in capsys.readouterr().out
    assert len(jobs.jobs) == 2


def test_a_corrected_job_file_for_a_running_submission_is_refused_and_says_how_to_proceed(
    tmp_path, jobs, capsys
):
    path = job_file(tmp_path / "nightly.toml", "s3://in/", "s3://out/")
    argv = ["submit", str(path), "--address", ADDRESS, "--date", "2026-12-01"]
    assert main(argv) == 0
    (submission_id,) = jobs.jobs
    capsys.readouterr()

    job_file(path, "s3://in/", "s3://out/", "\n[transcribe]\nbeam_size = 1\n")
    assert main(argv) == ConfigError.exit_code  # never a second writer into s3://out/
    err = capsys.readouterr().err
    assert "another version of this job" in err and f"ray job stop {submission_id}" in err
    assert "--retry-failed" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert list(jobs.jobs) == [submission_id]

    # Once it has failed, --retry-failed runs the corrected file as a retry of the same run.
    jobs.end(submission_id, "FAILED")
    assert main(argv) == ConfigError.exit_code
    assert "resubmit with --retry-failed" in capsys.readouterr().err
    assert main([*argv, "--retry-failed"]) == 0
    retry = jobs.shipped[f"{submission_id}-retry1"]
    assert retry["transcribe"]["beam_size"] == 1
    assert retry["job"]["run_id"] == jobs.shipped[submission_id]["job"]["run_id"]


# -- --date is the run's date ---------------------------------------------------------------------


def test_date_is_the_run_date_of_the_shipped_job_not_only_its_name(tmp_path, jobs):
    path = job_file(tmp_path / "nightly.toml", "s3://in/", "s3://out/")
    assert main(["submit", str(path), "--address", ADDRESS, "--date", "2026-12-01"]) == 0
    job = {"job": {"kind": "transcribe", "input": "s3://in/2026-11-30/", "output": "s3://o"}}
    remote.submit(job, ADDRESS, date="2026-11-30")
    assert sorted(s["job"]["run_date"] for s in jobs.shipped.values()) == [
        "2026-11-30",
        "2026-12-01",
    ]


def test_a_job_files_run_date_names_the_submission_and_another_date_is_refused(
    tmp_path, jobs, capsys
):
    path = job_file(tmp_path / "nightly.toml", "s3://in/", "s3://out/", "run_date = 2026-11-29\n")
    assert main(["submit", str(path), "--address", ADDRESS]) == 0
    (submission_id,) = jobs.jobs
    assert submission_id.startswith("overnight-nightly-20261129-")
    assert jobs.shipped[submission_id]["job"]["run_date"] == "2026-11-29"
    capsys.readouterr()
    argv = ["submit", str(path), "--address", ADDRESS, "--date", "2026-12-01"]
    assert main(argv) == ConfigError.exit_code
    assert "--date 2026-12-01 but the job file's run_date is 2026-11-29" in capsys.readouterr().err
    assert len(jobs.jobs) == 1


# -- the job file is all the cluster gets ---------------------------------------------------------


def test_schema_and_prompt_files_travel_inside_the_shipped_job_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "schema.json").write_text('{"type": "object", "properties": {"a": {}}}')
    (tmp_path / "prompt.txt").write_text("Tell me about {text}\n")
    (tmp_path / "models" / "llm").mkdir(parents=True)
    spec = build_spec(
        {
            "job": {"kind": "process", "input": "docs", "output": "out"},
            "process": {
                "task": ["extract", "prompt"],
                "schema": "schema.json",
                "prompt": "prompt.txt",
                "model": "models/llm",
            },
            "transcribe": {"model": "Systran/faster-whisper-small"},
        }
    )
    shipped = remote.cluster_job_file(spec)
    assert shipped["process"]["schema"] == {"type": "object", "properties": {"a": {}}}
    assert shipped["process"]["prompt"] == "Tell me about {text}\n"
    assert shipped["process"]["model"] == str(tmp_path / "models" / "llm")
    assert shipped["transcribe"]["model"] == "Systran/faster-whisper-small"  # a hub id

    import tomli_w

    from overnight.jobs.process import task_spec

    elsewhere = tmp_path / "cluster-working-dir"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # where the driver reads the job file, without the files
    on_cluster = build_spec(tomllib.loads(tomli_w.dumps(shipped)))
    for task in on_cluster.process.tasks:
        task_spec(task, on_cluster.process)


def test_a_schema_file_that_cannot_be_read_is_refused_before_submitting(tmp_path, jobs, capsys):
    path = tmp_path / "nightly.toml"
    path.write_text(
        '[job]\nkind = "process"\ninput = "s3://in/"\noutput = "s3://out/"\n\n'
        '[process]\ntask = "extract"\nschema = "missing.json"\n'
    )
    assert main(["submit", str(path), "--address", ADDRESS]) == ConfigError.exit_code
    err = capsys.readouterr().err
    assert "process.schema: cannot read the JSON schema file 'missing.json'" in err
    assert not jobs.jobs


# -- messages from the Jobs API -------------------------------------------------------------------


@pytest.fixture
def token_cluster():
    """A Jobs API that answers as a head with RAY_AUTH_MODE=token does to a request without
    its token (Ray's own client talks to it)."""

    class Refuses(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"Unauthorized: Missing authentication token"
            self.send_response(401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuses)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_a_cluster_asking_for_a_token_says_where_the_token_goes(token_cluster, capsys, monkeypatch):
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(key, raising=False)
    assert main(["status", "overnight-nightly", "--address", token_cluster]) == 10
    err = capsys.readouterr().err
    assert "uses token authentication, and it was sent no token" in err
    for where in ("RAY_AUTH_MODE=token", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "auth_token"):
        assert where in err
    assert "Check the address" not in err and "\\n" not in err
    assert len(err.strip().splitlines()) == 1
    wrong = RuntimeError(
        "Request failed with status code 403: Forbidden: Invalid authentication token"
    )
    assert "the token it was sent is not the cluster's" in str(
        remote._api_failure(wrong, ADDRESS, "the Jobs API failed")
    )


def test_a_long_answer_of_the_jobs_api_is_one_line_cut_after_a_sentence():
    answer = "word " * 60 + "ends here.\\nTraceback (most recent call last):\\n" + "word " * 200
    failure = remote._api_failure(RuntimeError(answer), ADDRESS, "the Jobs API failed")
    text = str(failure)
    assert "\\n" not in text and "\n" not in text
    assert text.endswith("word ends here.")
    cut = str(
        remote._api_failure(RuntimeError("x" + " word" * 300), ADDRESS, "the Jobs API failed")
    )
    assert cut.endswith("word ...")


# -- status for a cron wrapper --------------------------------------------------------------------


def test_status_exit_code_says_how_the_job_ended_and_an_unknown_id_is_4(tmp_path, jobs, capsys):
    path = job_file(tmp_path / "nightly.toml", "s3://in/", "s3://out/")
    assert main(["submit", str(path), "--address", ADDRESS]) == 0
    (submission_id,) = jobs.jobs
    for status, code in (("RUNNING", 0), ("SUCCEEDED", 0), ("FAILED", 9), ("STOPPED", 9)):
        if status != "RUNNING":
            jobs.end(submission_id, status)
        assert main(["status", submission_id, "--address", ADDRESS]) == code, status
        assert main(["status", submission_id, "--address", ADDRESS, "--json"]) == code, status
    assert ClusterJobFailed.exit_code == 9
    capsys.readouterr()
    assert main(["status", "overnight-other", "--address", ADDRESS]) == InputNotFound.exit_code
    assert "no such submission: no job has the id 'overnight-other'" in capsys.readouterr().err
