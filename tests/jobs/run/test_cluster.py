"""A real two-node Ray cluster on this machine: jobs go in through the Jobs API, and a worker
node dies mid-run.

The head starts with ``ray start --head`` (one CPU: the driver and some decoding), the worker
with ``ray start --address`` and the custom resource ``accelerator_type:OVERNIGHTTEST``; job
files ask for that accelerator type, so the Whisper actors can only run on worker nodes, as
they would on a GPU node. Every process gets its own temp dir and free ports, and teardown
kills exactly the process trees started here (never a global ``ray stop``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pyarrow.dataset as pads
import pytest

import overnight
from overnight.jobs.cli import main
from overnight.jobs.ops import remote as submit
from tests.conftest import _free_port, wer

pytestmark = pytest.mark.slow

ACCELERATOR = "OVERNIGHTTEST"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    # A loopback test cluster: no token (Ray enables token auth when ~/.ray/auth_token exists).
    env.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    return env


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def processes_of(temp_dir: str) -> list[int]:
    """Every process of the Ray node(s) using ``temp_dir``, with all their descendants.

    Ray workers rename themselves (``ray::IDLE``), so they are found as descendants of the
    node's raylet, whose command line names the temp dir.
    """
    tree = _children()
    roots = [int(p) for p in os.listdir("/proc") if p.isdigit() and temp_dir in _cmdline(int(p))]
    found, stack = set(), list(roots)
    while stack:
        pid = stack.pop()
        if pid in found or pid == os.getpid():
            continue
        found.add(pid)
        stack.extend(tree.get(pid, []))
    return sorted(found)


def kill_all(pids: list[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


class TwoNodeCluster:
    def __init__(self) -> None:
        self.head_dir = tempfile.mkdtemp(
            prefix="ovh-", dir="/tmp"
        )  # short: socket paths < 108 chars
        self.worker_dirs: list[str] = []
        self.workers: list[subprocess.Popen] = []
        self.gcs_port, self.dashboard_port = _free_port(), _free_port()
        self.address = f"http://127.0.0.1:{self.dashboard_port}"

    def start_head(self) -> None:
        cmd = [
            "ray",
            "start",
            "--head",
            f"--port={self.gcs_port}",
            f"--dashboard-port={self.dashboard_port}",
            "--dashboard-host=127.0.0.1",
            f"--ray-client-server-port={_free_port()}",
            f"--dashboard-agent-listen-port={_free_port()}",
            "--num-cpus=1",
            "--include-dashboard=true",
            f"--temp-dir={self.head_dir}",
            "--disable-usage-stats",
        ]
        done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=240)
        if done.returncode != 0:
            raise RuntimeError(
                f"ray start --head failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )

    def start_worker(self) -> None:
        temp = tempfile.mkdtemp(prefix="ovw-", dir="/tmp")
        cmd = [
            "ray",
            "start",
            f"--address=127.0.0.1:{self.gcs_port}",
            "--num-cpus=2",
            f'--resources={{"accelerator_type:{ACCELERATOR}": 1}}',
            f"--dashboard-agent-listen-port={_free_port()}",
            f"--temp-dir={temp}",
            "--block",
        ]
        log = open(Path(temp) / "ray-start.log", "w")  # noqa: SIM115 - closed with the process
        self.workers.append(
            subprocess.Popen(
                cmd, env=_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        )
        self.worker_dirs.append(temp)

    def alive_nodes(self) -> list[dict]:
        from ray.util.state import list_nodes

        try:
            return [
                n.__dict__ if hasattr(n, "__dict__") else dict(n)
                for n in list_nodes(address=self.address, filters=[("state", "=", "ALIVE")])
            ]
        except Exception:
            return []

    def wait_for_workers(self, count: int, timeout_s: float = 150) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            workers = [n for n in self.alive_nodes() if not n["is_head_node"]]
            if len(workers) >= count:
                return
            time.sleep(2)
        log = Path(self.worker_dirs[-1]) / "ray-start.log"
        tail = log.read_text()[-2000:] if log.exists() else "(no log)"
        raise TimeoutError(f"{count} worker node(s) did not join within {timeout_s} s:\n{tail}")

    def add_worker(self, count: int) -> None:
        """Start a worker node and wait until ``count`` workers are alive; one more try if not."""
        for attempt in range(2):
            self.start_worker()
            try:
                self.wait_for_workers(count)
                return
            except TimeoutError:
                if attempt:
                    raise
                kill_all(processes_of(self.worker_dirs[-1]))

    def kill_worker(self, index: int) -> list[int]:
        pids = processes_of(self.worker_dirs[index])
        kill_all(pids)
        self.workers[index].wait(timeout=30)
        return pids

    def stop(self) -> None:
        for temp in [*self.worker_dirs, self.head_dir]:
            kill_all(processes_of(temp), signal.SIGTERM)
        time.sleep(3)
        for temp in [*self.worker_dirs, self.head_dir]:
            kill_all(processes_of(temp))
        for proc in self.workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        for temp in [*self.worker_dirs, self.head_dir]:
            shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster():
    if shutil.which("ray") is None:
        pytest.skip("the ray command is not installed")
    try:
        import aiohttp_cors  # noqa: F401 - the Jobs API lives in ray[default]'s dashboard
    except ImportError:
        pytest.skip("ray[default] is not installed: the Jobs API needs the full dashboard")
    c = TwoNodeCluster()
    try:
        c.start_head()
        c.add_worker(1)
        yield c
    finally:
        c.stop()


def job_file(path: Path, input_: str, output: str, **transcribe) -> Path:
    lines = [
        "[job]",
        f'input = "{input_}"',
        f'output = "{output}"',
        "",
        "[transcribe]",
        "actors = 1",
        "cpus_per_actor = 1",
        f'accelerator_type = "{ACCELERATOR}"',
    ]
    lines += [
        f"{k} = {v!r}" if not isinstance(v, str) else f'{k} = "{v}"' for k, v in transcribe.items()
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def rows(output: Path) -> list[dict]:
    """Every committed transcript row: published, and staged by a run not yet published
    (a run publishes at its end; its actors' commits are durable before that)."""
    files = [
        *(output / "transcripts").glob("**/*.parquet"),
        *(output / "_staging" / "transcripts").glob("*/*/part-*.parquet"),
    ]
    if not files:
        return []
    return (
        pads.dataset([str(f) for f in files], format="parquet")
        .to_table(columns=["item_id", "source_uri", "status", "error_code", "text", "worker"])
        .to_pylist()
    )


def test_job_submitted_through_jobs_api_runs_whisper_on_the_worker_node_once(
    cluster, synth_calls, tmp_path, capsys
):
    folder, refs = synth_calls
    manifest = tmp_path / "calls.csv"
    names = ["call_billing.wav", "call_refund.wav", "call_corrupt.wav"]
    manifest.write_text("uri\n" + "\n".join(str(folder / n) for n in names) + "\n")
    spec = job_file(tmp_path / "nightly.toml", str(manifest), str(tmp_path / "out"))

    # Through the public API an orchestrator's task calls (docs/orchestrators.md's recipes).
    first = overnight.submit(spec, cluster.address, date="2026-12-01")
    assert first.created and first.submission_id.startswith("overnight-nightly-20261201-")
    # A scheduler retrying the same night gets the existing job back, never a second run.
    again = overnight.submit(spec, cluster.address, date="2026-12-01")
    assert not again.created and again.submission_id == first.submission_id
    assert overnight.wait(first.submission_id, cluster.address, timeout=420) == "SUCCEEDED", (
        overnight.logs(first.submission_id, cluster.address)[-3000:]
    )
    state = overnight.status(first.submission_id, cluster.address)
    assert state["status"] == "SUCCEEDED" and state["driver_exit_code"] == 0

    got = {Path(r["source_uri"]).name: r for r in rows(tmp_path / "out")}
    assert sorted(got) == sorted(names)
    assert len(rows(tmp_path / "out")) == len(names)
    for name in ("call_billing.wav", "call_refund.wav"):
        assert got[name]["status"] == "ok"
        assert wer(refs[name], got[name]["text"]) <= 0.1, got[name]["text"]
    assert got["call_corrupt.wav"]["error_code"] == "corrupt_audio"
    head = next(n["node_id"] for n in cluster.alive_nodes() if n["is_head_node"])
    assert all(not r["worker"].startswith(head[:12]) for r in got.values()), (
        "Whisper ran on the head"
    )

    from ray.job_submission import JobSubmissionClient

    jobs = [
        j
        for j in JobSubmissionClient(cluster.address).list_jobs()
        if (j.metadata or {}).get("base_submission_id") == first.submission_id
    ]
    assert len(jobs) == 1

    capsys.readouterr()
    assert main(["status", first.submission_id, "--address", cluster.address]) == 0
    assert "SUCCEEDED" in capsys.readouterr().out
    assert main(["logs", first.submission_id, "--address", cluster.address]) == 0
    assert "3 processed, 2 ok, 1 failed" in capsys.readouterr().out
    assert main(["submit", str(spec), "--address", cluster.address, "--date", "2026-12-01"]) == 0
    assert "already exists" in capsys.readouterr().out


def test_worker_node_lost_mid_run_still_ends_with_one_row_per_item(cluster, synth_calls, tmp_path):
    folder, _ = synth_calls
    calls = tmp_path / "calls"
    calls.mkdir()
    speech = ["call_billing.wav", "call_address.wav", "call_cancel.wav"]
    for copy in range(2):
        for name in speech:
            shutil.copy(folder / name, calls / f"{copy}_{name}")
    expected = sorted(p.name for p in calls.iterdir())
    out = tmp_path / "out"
    # One recording per actor call: each is committed on its own, so the kill lands mid-run.
    spec = job_file(
        tmp_path / "nodeloss.toml", str(calls), str(out), items_per_call=1, batch_size=1
    )

    first = submit.submit(spec, cluster.address, run_id="nodeloss")
    deadline = time.monotonic() + 450
    while not rows(out):
        assert time.monotonic() < deadline, submit.logs(cluster.address, first.submission_id)[
            -3000:
        ]
        assert submit.status(cluster.address, first.submission_id)["status"] not in submit.TERMINAL
        time.sleep(1)
    killed = cluster.kill_worker(-1)
    committed_at_kill = len(rows(out))
    assert killed and committed_at_kill < len(expected), "the run ended before the node was lost"

    cluster.start_worker()
    final = submit.wait(cluster.address, first.submission_id, timeout_s=420)
    attempts = [first.submission_id]
    if final != "SUCCEEDED":
        # The driver may give up when the node's objects are lost; a rerun resumes.
        retry = submit.submit(spec, cluster.address, run_id="nodeloss", retry_failed=True)
        attempts.append(retry.submission_id)
        final = submit.wait(cluster.address, retry.submission_id, timeout_s=420)
    print(
        f"node loss: {committed_at_kill} committed at the kill, attempts {attempts}, final {final}"
    )
    assert final == "SUCCEEDED", submit.logs(cluster.address, attempts[-1])[-3000:]

    result = rows(out)
    ids = [r["item_id"] for r in result]
    assert len(ids) == len(set(ids)) == len(expected)
    assert sorted(Path(r["source_uri"]).name for r in result) == expected
    assert all(r["status"] == "ok" for r in result)
