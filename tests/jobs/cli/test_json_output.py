"""``--json``: stdout is one JSON document and nothing else, in one format for every command
(``jobs/cli/output.py``); on the job commands it is the run summary, or the dry run's report,
for a scheduler to parse as it is, and progress stays on stderr."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq

from overnight.jobs.cli import main
from overnight.jobs.cli.output import print_json
from tests.conftest import REPO
from tests.jobs.cli.test_cli_messages import cli_env
from tests.jobs.ops.test_show import write_output


def _overnight(*args: str) -> tuple[int, str, str]:
    """The command line in a child process: (exit status, stdout, stderr)."""
    proc = subprocess.run(
        [sys.executable, "-m", "overnight.jobs.cli", *args],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    return proc.returncode, proc.stdout, proc.stderr


def _printed(document: object) -> str:
    """What the shared ``print_json`` prints for ``document``."""
    with contextlib.redirect_stdout(io.StringIO()) as out:
        print_json(document)
    return out.getvalue()


def _json_of(*args: str) -> tuple[int, dict, str]:
    code, stdout, stderr = _overnight(*args, "--json")
    document = json.loads(stdout)
    assert stdout == _printed(document)  # the one format of every command's --json
    return code, document, stderr


def test_print_json_is_one_indented_utf8_document_with_other_values_as_str(capsys):
    print_json({"b": 1, "a": ["Grüße", datetime(2026, 12, 3, tzinfo=UTC)], "p": Path("/x")})
    assert capsys.readouterr().out == (
        '{\n  "b": 1,\n  "a": [\n    "Grüße",\n    "2026-12-03 00:00:00+00:00"\n  ],\n'
        '  "p": "/x"\n}\n'
    )


def test_specification_every_command_prints_its_json_in_the_same_format(tmp_path, capsys):
    out = str(write_output(tmp_path / "out"))
    (tmp_path / "rec").mkdir()
    (tmp_path / "rec" / "a.wav").write_bytes(b"RIFF")
    manifest, config = tmp_path / "manifest.csv", tmp_path / "tenants.toml"
    manifest.write_text(f"uri\n{tmp_path}/rec/a.wav\n")
    config.write_text(
        f'[submissions]\nstate = "{tmp_path}/state"\n\n[tenants.acme]\n'
        f'allowed_input_prefixes = ["{tmp_path}/rec/"]\ninbox = "{tmp_path}/inbox/"\n'
        f'output = "{tmp_path}/tenant-out"\n'
    )
    plan = ["--audio-hours", "10", "--deadline", "6h", "--gpu", "l4", "--throughput", "300"]
    commands = (
        ["show", out, "--limit", "1", "--json"],
        ["report", out, "--json"],
        ["plan", *plan, "--json"],
        # One document without a flag: the submission it queued.
        ["submissions", "add", "acme", str(manifest), "--config", str(config)],
    )
    for argv in commands:
        assert main(argv) == 0, argv
        stdout = capsys.readouterr().out
        assert stdout[:4] in ("{\n  ", "[\n  "), (argv, stdout[:80])  # indented, one document
        assert stdout == _printed(json.loads(stdout)), argv


def _one_call(synth_calls, tmp_path) -> tuple[Path, Path]:
    """A folder holding one synthesized call, and an output folder beside it."""
    folder, refs = synth_calls
    one = tmp_path / "in"
    one.mkdir()
    name = sorted(refs)[0]
    shutil.copy(folder / name, one / name)
    return one, tmp_path / "out"


def test_a_run_with_json_prints_only_its_summary_on_stdout(synth_calls, tmp_path):
    one, out = _one_call(synth_calls, tmp_path)
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


def test_log_format_json_writes_one_event_per_stderr_line_and_no_transcript_text(
    synth_calls, tmp_path
):
    one, out = _one_call(synth_calls, tmp_path)
    code, _, stderr = _json_of(
        "transcribe", str(one), str(out), "--device", "cpu", "--log-format", "json"
    )
    assert code == 0
    events = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    assert events, stderr
    kinds = {e["event"] for e in events}
    assert {"start", "progress"} <= kinds, kinds
    last = [e for e in events if e["event"] == "progress"][-1]
    assert last["done"] == last["total"] == 1 and last["errors"] == 0
    assert all({"ts", "level", "message"} <= e.keys() for e in events)
    # Counts and names, never what was said.
    said = pq.read_table(out / "transcripts").column("text").to_pylist()[0]
    assert said and said.strip() not in stderr
    # A systemic failure is an event too, with its exit status.
    code, _, stderr = _overnight(
        "transcribe", str(tmp_path / "missing"), str(out), "--log-format", "json"
    )
    [error] = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    assert code == 4 and error["event"] == "error" and error["exit_code"] == 4
