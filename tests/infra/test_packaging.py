"""Specifications of the installed distribution: one import name, ``overnight``.

The repository keeps the design layout's top-level folders (jobs/, workers/, schemas/); the
wheel must put nothing but ``overnight`` into site-packages, and an environment that also
holds PyPI's ``schemas`` and ``workers`` packages must run overnight unchanged.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

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


_PIP_WHEEL = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]


def _build_wheel(into: Path) -> Path:
    subprocess.run(
        [*_PIP_WHEEL, "-w", str(into), str(REPO)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    [wheel] = into.glob("overnight-*.whl")
    return wheel


@pytest.mark.skipif(
    shutil.which("espeak-ng") is None, reason="the demo speaks its calls with espeak-ng"
)
def test_the_wheel_installs_in_a_fresh_venv_and_runs_the_demo(tmp_path: Path) -> None:
    """The built wheel, installed in a new virtual environment, runs ``overnight demo``.

    The wheel goes in without its dependencies, which come from the development venv through
    a ``.pth`` line in the fresh venv's site-packages: a real install downloads about 1 GB
    (Ray, CTranslate2, pyarrow, spaCy, ...), which cannot be done here in reasonable time
    (.github/workflows/lowest.yml does a real install, with the lowest versions). A ``.pth``
    path is appended to ``sys.path`` after the venv's own site-packages, so ``overnight``
    itself is the wheel's copy (checked through ``overnight.__file__``), never the checkout's
    or the development venv's editable install (whose finder .pth is not run: a path line does
    not process the .pth files of the folder it adds).
    """
    wheel = _build_wheel(tmp_path / "dist")
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", wheel],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    [fresh_site] = (venv / "lib").glob("python3*/site-packages")
    # Where the development install's dependencies live: a venv's site-packages here, the
    # interpreter's own in CI (which installs into the system Python).
    import ray

    dev_site = Path(ray.__file__).resolve().parents[1]
    (fresh_site / "zz_overnight_dev_dependencies.pth").write_text(f"{dev_site}\n")

    work = tmp_path / "work"  # not the checkout: nothing of the source tree on the path
    work.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV", "RAY_ADDRESS") and not k.startswith("HF_")
    }
    env["PATH"] = os.pathsep.join(
        [str(venv / "bin"), str(Path(sys.executable).parent), env["PATH"]]
    )
    where = subprocess.run(
        [
            str(python),
            "-c",
            "import overnight, ray; print(overnight.__file__); print(ray.__file__)",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert where.returncode == 0, where.stderr[-2000:]
    ours, ray_file = where.stdout.split()
    assert Path(ours).is_relative_to(fresh_site), ours
    assert Path(ray_file).is_relative_to(dev_site), ray_file

    output = tmp_path / "demo"
    done = subprocess.run(
        [str(venv / "bin" / "overnight"), "demo", "--output", str(output)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    transcripts = list((output / "transcripts").rglob("*.parquet"))
    assert transcripts, sorted(p.relative_to(output).as_posix() for p in output.rglob("*"))
    assert "the calls' scripts and their transcripts" in done.stdout
