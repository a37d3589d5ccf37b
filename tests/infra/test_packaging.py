"""Specifications of the installed distribution: one import name, ``overnight``.

The repository keeps the design layout's top-level folders (jobs/, workers/, schemas/); the
wheel must put nothing but ``overnight`` into site-packages, and an environment that also
holds PyPI's ``schemas`` and ``workers`` packages must run overnight unchanged.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_wheel_installs_only_the_overnight_package(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    [wheel] = tmp_path.glob("overnight-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"overnight"}
    packages = {n.rsplit("/", 1)[0] for n in names if n.endswith("/__init__.py")}
    # every package folder of the layout is in the wheel, as real files
    for folder in ("jobs", "workers", "schemas"):
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO).as_posix()
            assert f"overnight/{rel}" in packages, rel
    entry = (
        zipfile.ZipFile(wheel)
        .read(next(n for n in names if n.endswith("entry_points.txt")))
        .decode()
    )
    assert "overnight = overnight.jobs.cli:main" in entry
    # typed (PEP 561) and licensed: the license file travels in the metadata
    assert "overnight/py.typed" in names
    assert any(
        n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names
    ), [n for n in names if "dist-info" in n]


def test_pypi_packages_named_schemas_and_workers_do_not_shadow_overnights(tmp_path: Path) -> None:
    # Stand-ins for PyPI's `schemas` and `workers`, first on the path: if any of our modules
    # still imported the bare names, it would get these and fail.
    for name in ("schemas", "workers", "jobs"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('the PyPI {name}')\n")
    code = (
        "import overnight.jobs.spec, overnight.jobs.transcribe, overnight.jobs.process\n"
        "import overnight.workers.whisper, overnight.workers.llm.tasks.run, overnight.schemas\n"
        "from overnight.jobs.spec import build_spec\n"
        "spec = build_spec(overrides={'job': {'kind': 'transcribe', 'input': 'a', 'output': 'b'}})\n"
        "print(spec.job.kind)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "transcribe"
