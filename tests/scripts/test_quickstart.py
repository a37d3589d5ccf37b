"""scripts/quickstart.sh picks the Python it installs into: the active virtual environment,
else a .venv it makes (and reuses), and says how to activate it.

install.sh and the demo are stand-ins here that record the interpreter they were given (the
real install downloads a few hundred MB; .ci/run and the image exercise it); the virtual
environment is real.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

from tests.conftest import REPO

INSTALL = """#!/usr/bin/env bash
set -euo pipefail
cd "$(dirname "$0")/.."
"$PYTHON" -c 'import sys; print("install into", sys.prefix)' >> calls.log
"""
DEMO = """import sys
print("demo with", sys.prefix, sys.argv[1:])
"""


def checkout(tmp_path: Path) -> Path:
    root = tmp_path / "clone"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "quickstart.sh", root / "scripts" / "quickstart.sh")
    (root / "scripts" / "install.sh").write_text(INSTALL)
    (root / "overnight" / "jobs").mkdir(parents=True)
    (root / "overnight" / "__init__.py").write_text("")
    (root / "overnight" / "jobs" / "__init__.py").write_text("")
    (root / "overnight" / "jobs" / "cli.py").write_text(DEMO)
    return root


def run(root: Path, path_dir: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHON")}
    clean["PATH"] = f"{path_dir}{os.pathsep}{clean['PATH']}"
    return subprocess.run(
        ["bash", str(root / "scripts" / "quickstart.sh")],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def base_python(tmp_path: Path) -> Path:
    """A folder whose python3 is the base interpreter, outside any virtual environment."""
    folder = tmp_path / "bin"
    folder.mkdir()
    base = (
        Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    )
    (folder / "python3").symlink_to(base)
    return folder


def test_without_a_virtual_environment_quickstart_makes_dot_venv_uses_it_and_says_how_to_activate(
    tmp_path,
):
    root = checkout(tmp_path)
    done = run(root, base_python(tmp_path))
    assert done.returncode == 0, done.stderr
    venv_prefix = str(root / ".venv")
    assert (root / ".venv" / "bin" / "python").exists()
    assert (root / "calls.log").read_text() == f"install into {venv_prefix}\n"
    assert f"demo with {venv_prefix} ['demo', '--output', 'demo-output']" in done.stdout
    assert "making one in .venv" in done.stdout
    assert ". .venv/bin/activate" in done.stdout
    again = run(root, tmp_path / "bin")
    assert again.returncode == 0, again.stderr
    assert "using the one in .venv" in again.stdout and "making one" not in again.stdout


def test_with_an_active_virtual_environment_quickstart_installs_into_it(tmp_path):
    root = checkout(tmp_path)
    env_dir = tmp_path / "active-venv"
    venv.create(env_dir, with_pip=False)
    done = run(root, env_dir / "bin", VIRTUAL_ENV=str(env_dir))
    assert done.returncode == 0, done.stderr
    assert (root / "calls.log").read_text() == f"install into {env_dir}\n"
    assert not (root / ".venv").exists()
    assert "activate" not in done.stdout
