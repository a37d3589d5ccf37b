"""An S3 endpoint that accepts connections and never answers (a hung server, a black-holed
proxy) kept every command silent for up to an hour: a 60 s read timeout, tried 3 times by
botocore, 5 times by s3fs and 4 times by ``storage.with_retries`` (`submissions list` was
stopped after 15 minutes in a probe). Each test states what must hold now."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from overnight.jobs.dataset import storage
from overnight.jobs.errors import StorageUnavailable
from tests.conftest import REPO, LoopbackServer, _free_port, secrets_in
from tests.jobs.cli.test_cli_messages import assert_one_clean_paragraph

# A command must have stopped by then: the first contact gives up after
# storage.PROBE_READ_TIMEOUT_S (10 s); the rest is nine interpreters starting at once on two
# shared cores (48 s each at a load average of 18). Without the deadline it was an hour.
WITHIN_S = 90


class SilentEndpoint(LoopbackServer):
    """A loopback port that accepts every connection and never sends a byte."""

    def __init__(self) -> None:
        self.held: list[socket.socket] = []
        super().__init__()

    def accepted(self, conn: socket.socket) -> None:
        self.held.append(conn)  # held open, unanswered

    def close(self) -> None:
        super().close()
        for conn in self.held:
            with contextlib.suppress(OSError):
                conn.close()


def _s3_at(env: pytest.MonkeyPatch, url: str) -> None:
    """The environment's S3 endpoint is ``url``, reached directly, with test credentials."""
    env.setenv("AWS_ENDPOINT_URL", url)
    env.setenv("AWS_ACCESS_KEY_ID", "AKIAOVERNIGHTTEST000")
    env.setenv("AWS_SECRET_ACCESS_KEY", "overnight-test-secret-key-do-not-log")
    env.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY"):
        env.delenv(name, raising=False)
        env.delenv(name.lower(), raising=False)


@pytest.fixture
def silent(clean_env):
    """A silent endpoint as the environment's S3 endpoint."""
    endpoint = SilentEndpoint()
    _s3_at(clean_env, endpoint.url)
    yield endpoint
    endpoint.close()


def test_the_first_request_to_a_silent_endpoint_is_one_attempt_that_fails_in_seconds(
    silent, monkeypatch
):
    monkeypatch.setattr(storage, "PROBE_READ_TIMEOUT_S", 2)  # the suite's time; 10 s in use
    started = time.monotonic()
    with pytest.raises(StorageUnavailable) as caught:
        storage.reach("s3://night-calls/2026-12-01/", "the input s3://night-calls/2026-12-01/")
    assert time.monotonic() - started < storage.PROBE_DEADLINE_S
    assert len(silent.held) == 1  # no retry of any layer
    message = str(caught.value)
    assert caught.value.exit_code == 3
    assert message.startswith("storage unreachable: the endpoint " + silent.url), message
    assert "the input s3://night-calls/2026-12-01/" in message and "\n" not in message
    assert not secrets_in(message)


def test_an_endpoint_that_refuses_connections_is_left_to_the_retries_that_bridge_an_outage(
    clean_env,
):
    # Refused is fast, and may be a restart: with_retries waits it out (as in
    # test_brief_storage_outage_is_retried_with_backoff) or says so in seconds.
    _s3_at(clean_env, f"http://127.0.0.1:{_free_port()}")
    storage.reach("s3://night-calls/x")  # no error: not silence


def test_a_read_that_never_answers_during_a_run_ends_after_the_clients_retries_alone(
    silent, monkeypatch
):
    # The worker's path (read_bytes with the driver's StorageConfig), at a shorter read
    # timeout: 15 requests (botocore's 3 inside s3fs's 5), not 60 (again 4 times ours). At
    # READ_TIMEOUT_S that is 5 minutes where it was an hour.
    monkeypatch.setattr(storage, "READ_TIMEOUT_S", 0.25)
    config = storage.StorageConfig.from_env()
    with pytest.raises(StorageUnavailable, match="no answer, after the storage client's own"):
        storage.read_bytes("s3://night-calls/2026-12-01/a.wav", config)
    assert len(silent.held) == (storage.BOTOCORE_RETRIES + 1) * storage.S3FS_TRIES == 15


def _commands(tmp: Path) -> dict[str, list[str]]:
    """Every command that starts by touching S3, each at a silent endpoint."""
    (tmp / "calls").mkdir()
    (tmp / "calls" / "a.wav").write_bytes(b"RIFF")  # never read: the output is checked first
    (tmp / "docs").mkdir()
    (tmp / "docs" / "a.txt").write_text("a letter")
    (tmp / "m.csv").write_text("uri\ns3://acme-calls/rec/a.wav\n")
    config = tmp / "tenants.toml"
    config.write_text(
        '[submissions]\nstate = "s3://ovn-state/submissions"\n\n'
        "[tenants.acme]\n"
        'allowed_input_prefixes = ["s3://acme-calls/rec/"]\n'
        'inbox = "s3://ovn-inbox/acme/"\n'
        'output = "s3://acme-out/overnight"\n'
    )
    out = "s3://acme-out/night"
    return {
        "submissions list": ["submissions", "list", "--config", str(config)],
        "submissions add": [
            "submissions",
            "add",
            "acme",
            str(tmp / "m.csv"),
            "--config",
            str(config),
        ],
        "submissions process": ["submissions", "process", "--config", str(config), "--quiet"],
        "transcribe to S3": ["transcribe", str(tmp / "calls"), out, "--quiet"],
        "transcribe from S3": ["transcribe", "s3://acme-calls/rec/", str(tmp / "o1"), "--quiet"],
        "process to S3": ["process", str(tmp / "docs"), out, "--task", "summarize", "--quiet"],
        "show": ["show", out],
        "report": ["report", out],
        "export": ["export", out, str(tmp / "exported")],
    }


def test_every_command_stops_at_a_silent_s3_endpoint_with_exit_3_in_one_paragraph_within_a_minute(
    silent, tmp_path
):
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def run(argv: list[str]) -> tuple[int | str, str, float]:
        started = time.monotonic()
        try:
            done = subprocess.run(
                [sys.executable, "-m", "overnight.jobs.cli", *argv],
                env=env,
                capture_output=True,
                text=True,
                timeout=WITHIN_S + 30,
            )
        except subprocess.TimeoutExpired:
            return "hung", "", time.monotonic() - started
        return done.returncode, done.stdout + done.stderr, time.monotonic() - started

    commands = _commands(tmp_path)
    # All at once: the probes wait in parallel.
    with ThreadPoolExecutor(max_workers=len(commands)) as pool:
        results = dict(zip(commands, pool.map(run, commands.values()), strict=True))
    for name, (status, output, took) in results.items():
        assert status == 3, f"{name}: exit {status} after {took:.0f} s\n{output[-3000:]}"
        assert took < WITHIN_S, f"{name}: {took:.0f} s"
        assert_one_clean_paragraph(output)
        assert f"storage unreachable: the endpoint {silent.url} did not answer" in output, name
        assert not secrets_in(output), name
