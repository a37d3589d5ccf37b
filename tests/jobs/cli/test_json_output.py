"""``--json`` on the job commands: stdout is one JSON object (the run summary, or the dry run's
report) and nothing else, for a scheduler to parse as it is; progress stays on stderr."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from tests.conftest import REPO
from tests.jobs.cli.test_cli_messages import cli_env


def _json_of(*args: str) -> tuple[int, dict, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "overnight.jobs.cli", *args, "--json"],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def test_a_run_with_json_prints_only_its_summary_on_stdout(synth_calls, tmp_path):
    folder, refs = synth_calls
    one = tmp_path / "in"
    one.mkdir()
    name = sorted(refs)[0]
    shutil.copy(folder / name, one / name)
    out = tmp_path / "out"
    code, summary, _ = _json_of("transcribe", str(one), str(out), "--device", "cpu")
    assert code == 0
    assert summary["kind"] == "transcribe" and summary["items"] == 1
    assert summary["succeeded"] == 1 and summary["cost_usd"] is not None
    # A rerun does nothing and still prints one object, the same shape.
    code, again, _ = _json_of("transcribe", str(one), str(out), "--device", "cpu")
    assert code == 0 and again["items"] == 0 and again["items_already_done"] == 1


def test_a_dry_run_with_json_prints_its_report_as_one_object(synth_calls, tmp_path):
    folder, _ = synth_calls
    code, report, _ = _json_of("transcribe", str(folder), str(tmp_path / "out"), "--dry-run")
    assert code == 0 and report["dry_run"] is True
    assert not (tmp_path / "out" / "transcripts").exists()
