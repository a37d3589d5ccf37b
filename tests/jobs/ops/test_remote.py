"""``overnight submit`` without a cluster: ids, what is shipped, and a cluster that is not there.

The real Jobs API round trip (and a worker node lost mid-run) is in test_cluster.py.
"""

from __future__ import annotations

import tomllib

import pytest

from overnight.jobs.cli import main
from overnight.jobs.errors import ConfigError
from overnight.jobs.ops import remote
from overnight.jobs.spec import build_spec
from tests.conftest import _free_port, secrets_in


def test_submission_id_is_the_same_for_the_same_night_and_job_file():
    a = remote.submission_id_for("/etc/overnight/jobs/nightly.toml", date="2026-12-01")
    b = remote.submission_id_for("other/place/nightly.toml", date="2026-12-01")
    assert a == b == "overnight-nightly-20261201"
    assert (
        remote.submission_id_for("Nightly Calls.toml", run_id="Run 7/b")
        == "overnight-nightly-calls-run-7-b"
    )
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
