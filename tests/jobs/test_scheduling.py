"""Specifications for what schedulers drive: the Python API, --dry-run and --max-error-rate.

On the real model (bundled tiny.en) and synthesized calls, one of which is a broken file.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import overnight as overnight_api  # the public API: overnight.transcribe, .process, .run
from overnight.jobs.errors import ConfigError, ErrorRateExceeded

pytestmark = pytest.mark.usefixtures("ray_local")

COUNTS = ("items", "succeeded", "failed", "errors_by_code", "audio_seconds", "kind")


def _cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "overnight.jobs.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def api_run(synth_calls, tmp_path_factory):
    folder, _ = synth_calls
    out = tmp_path_factory.mktemp("api") / "out"
    return out, overnight_api.transcribe(
        folder, out, progress=False, batch_size=8, run_date="2026-11-30"
    )


def test_the_python_api_returns_the_summary_the_run_wrote(api_run):
    out, summary = api_run
    written = json.loads((out / "runs" / f"{summary.run_id}.json").read_text())
    assert {k: v for k, v in summary.raw.items() if k != "summary_path"} == {
        k: v for k, v in written.items() if k != "summary_path"
    }
    assert summary.kind == "transcribe" and summary.items == summary.succeeded + summary.failed
    assert summary.failed == 1 and summary.errors_by_code  # the demo's broken file
    assert summary.error_rate == pytest.approx(1 / summary.items)
    # and its row in the run table, under the logical date it was given (a backfill)
    [part] = (out / "run_table" / "run_date=2026-11-30").glob("*.parquet")
    assert part.name == f"{summary.run_id}.parquet"


def test_the_api_names_a_mistyped_option_before_any_work(tmp_path):
    with pytest.raises(ConfigError, match="did you mean 'batch_size'"):
        overnight_api.transcribe(tmp_path, tmp_path / "out", batchsize=8)
    assert not (tmp_path / "out").exists()


def test_max_error_rate_fails_the_run_after_writing_it_in_the_api_and_the_cli(
    api_run, synth_calls, tmp_path
):
    folder, _ = synth_calls
    _, api_summary = api_run
    with pytest.raises(ErrorRateExceeded) as raised:
        overnight_api.transcribe(folder, tmp_path / "a", progress=False, max_error_rate=0.0)
    assert raised.value.exit_code == 12 and raised.value.summary["failed"] == 1
    assert list((tmp_path / "a" / "runs").glob("*.json"))  # written before it failed

    done = _cli("transcribe", str(folder), str(tmp_path / "b"), "--quiet", "--max-error-rate", "0")
    assert done.returncode == 12, done.stderr[-2000:]
    assert "more than the 0.0% that max_error_rate allows" in done.stderr
    assert "Traceback" not in done.stderr
    [written] = (tmp_path / "b" / "runs").glob("*.json")
    cli_summary = json.loads(written.read_text())
    # the CLI and the API ran the same input: the same summary, but for times and ids
    assert {k: cli_summary[k] for k in COUNTS} == {k: api_summary.raw[k] for k in COUNTS}
    assert set(cli_summary) == set(api_summary.raw) - {"summary_path"}  # where it was written

    within = _cli("run", _spec_file(tmp_path, folder, tmp_path / "b"), "--max-error-rate", "0.5")
    assert within.returncode == 0, within.stderr[-2000:]  # rerun: nothing failed this time


def _spec_file(tmp_path: Path, input: Path, output: Path) -> str:
    path = tmp_path / "job.toml"
    path.write_text(
        f'[job]\nkind = "transcribe"\ninput = "{input}"\noutput = "{output}"\nprogress = false\n'
    )
    return str(path)


def test_dry_run_counts_pending_against_done_and_prices_from_past_runs(
    api_run, synth_calls, tmp_path
):
    folder, _ = synth_calls
    out, summary = api_run
    fresh = _cli("transcribe", str(folder), str(tmp_path / "new"), "--dry-run")
    assert fresh.returncode == 0, fresh.stderr
    assert f"{summary.items} listed, 0 already done, {summary.items} to do" in fresh.stdout
    assert "no cost estimate" in fresh.stdout
    assert not (tmp_path / "new").exists()  # nothing written
    assert "Ray" not in fresh.stderr  # nothing started

    part = tmp_path / "part"
    first = overnight_api.transcribe(folder, part, progress=False, max_items=3)
    runs_before = sorted(p.name for p in (part / "runs").iterdir())
    again = _cli("transcribe", str(folder), str(part), "--dry-run")
    assert again.returncode == 0, again.stderr
    left = summary.items - first.items
    assert f"{summary.items} listed, {first.items} already done, {left} to do" in again.stdout
    assert " of audio (headers of" in again.stdout
    assert "at the cost per unit of 1 past run(s)" in again.stdout
    assert sorted(p.name for p in (part / "runs").iterdir()) == runs_before
    # error rows count as done: a rerun does not retry a file that failed for its content
    full = _cli("transcribe", str(folder), str(out), "--dry-run")
    assert f"{summary.items} listed, {summary.items} already done, 0 to do" in full.stdout


def test_dry_run_reports_a_missing_input_as_the_run_would(tmp_path):
    done = _cli("transcribe", str(tmp_path / "nope"), str(tmp_path / "out"), "--dry-run")
    assert done.returncode == 4 and "Traceback" not in done.stderr
