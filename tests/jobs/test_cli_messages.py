"""What a user meets when something is wrong: one paragraph, a documented exit status, no
traceback, and for systemic failures, no Ray start.

Each test runs ``overnight`` as a subprocess, as a user would. The hub is made unreachable
deterministically (``HF_ENDPOINT`` at a closed local port), or answered by a small local
server that knows no repository; the Hugging Face cache is an empty temporary folder.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import pytest

from jobs import errors, submit
from tests.conftest import REPO, _free_port


def overnight(*args: str, env: dict[str, str] | None = None, **kwargs) -> tuple[int, str]:
    """Run the CLI; (exit status, stdout and stderr together)."""
    proc = subprocess.run(
        [sys.executable, "-m", "jobs.cli", *args],
        env=env or cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
        **kwargs,
    )
    return proc.returncode, proc.stdout + proc.stderr


def cli_env(**extra: str) -> dict[str, str]:
    """The caller's environment without Hugging Face or Ray settings, plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HF_", "HUGGING_FACE_", "RAY_ADDRESS"))
    }
    return {**env, "PYTHONPATH": str(REPO), **extra}


def assert_one_clean_paragraph(output: str) -> None:
    """One paragraph (one line), besides overnight's own progress lines, and nothing else."""
    assert "Traceback" not in output, output
    assert "\x1b[" not in output, output  # no raw ANSI codes (Ray's colored logs)
    assert "fix the cause and rerun" not in output, output  # not the crashed-engine message
    lines = [line for line in output.strip().splitlines() if not line.startswith("[overnight] ")]
    assert len(lines) == 1, output


# -- exit codes -------------------------------------------------------------------------------


def test_every_systemic_failure_has_its_own_exit_code_and_the_readme_lists_it():
    classes = {
        cls
        for module in (errors, submit)
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, errors.OvernightError) and cls is not errors.OvernightError
    }
    codes = {cls.__name__: cls.exit_code for cls in classes}
    assert len(set(codes.values())) == len(codes), codes
    assert errors.Superseded.exit_code == 8 and errors.ClusterUnreachable.exit_code == 10
    readme = (REPO / "README.md").read_text()
    for code in codes.values():
        assert f"\n| {code} | " in readme, f"exit status {code} is not in the README's table"


def test_an_unreachable_cluster_is_exit_10_not_the_superseded_8():
    address = f"http://127.0.0.1:{_free_port()}"
    status, output = overnight("status", "overnight-nightly", "--address", address)
    assert status == 10, output
    assert_one_clean_paragraph(output)
    assert f"cannot reach the Ray Jobs API at {address}" in output


# -- flags, printing --------------------------------------------------------------------------


def test_a_mistyped_option_prints_the_subcommands_usage_and_the_option_it_meant(tmp_path):
    status, output = overnight("transcribe", "in", "out", "--batchsize", "8")
    assert status == 2, output
    assert "Traceback" not in output
    assert output.startswith("usage: overnight transcribe ")
    assert "overnight transcribe: error: unrecognized arguments: --batchsize 8" in output
    assert "did you mean --batch-size?" in output

    status, output = overnight("process", "in", "out", "--tsak=summarize")
    assert status == 2 and output.startswith("usage: overnight process "), output
    assert "did you mean --task?" in output


def test_config_prints_the_value_of_defaults_made_by_a_factory():
    status, output = overnight("config")
    assert status == 0, output
    assert "PydanticUndefined" not in output
    assert "  labels = []  #" in output and "  required_phrases = []  #" in output
    assert "  engine_kwargs = {}  #" in output


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["config"], 141),  # as a shell reports a writer stopped by SIGPIPE
        (
            [
                "plan",
                "--audio-hours",
                "10",
                "--deadline",
                "6h",
                "--gpu",
                "h100",
                "--throughput",
                "50",
            ],
            141,
        ),
        (["transcribe", "--help"], 0),  # argparse drops its own failed write and exits 0
    ],
)
def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(args, expected):
    """``overnight config | head``: the reader is gone before the first line is written."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "jobs.cli", *args],
            env=cli_env(),
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert proc.stderr == "", proc.stderr  # no BrokenPipeError, no traceback
    assert proc.returncode == expected
