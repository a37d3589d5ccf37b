"""The layer contract (ARCHITECTURE.md, "Dependencies point one way"), checked on the source.

cli -> jobs -> workers -> schemas, never up: a worker never imports ``overnight.jobs``;
``schemas`` imports neither ``jobs`` nor ``workers``; nothing outside ``jobs/cli`` imports
``overnight.jobs.cli``, so that ``jobs`` works as a library without the command line.
Inside ``jobs/`` the subpackages are layers too (``JOB_LAYERS``): cli -> api -> ops -> the job
kinds -> run -> accounting -> dataset -> the spec and its lists, each importing only below.

Every import counts, at module level or inside a function (the code imports lazily to keep
``--help`` and the workers light), under ``if TYPE_CHECKING:`` too, relative ones resolved.
It is the same check import-linter's ``forbidden`` contracts make, written with ``ast`` so that
it needs no dependency beyond the lock. A failure names the file, the line and the import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("jobs", "workers", "schemas")

# (what the rule covers, the importing modules it applies to, prefixes they may not import).
# A module "under" a prefix is the prefix itself or one of its submodules.
RULES: list[tuple[str, str, tuple[str, ...], tuple[str, ...]]] = [
    (
        "a worker never imports from jobs",
        "overnight.workers",
        (),
        ("overnight.jobs",),
    ),
    (
        "schemas import neither jobs nor workers",
        "overnight.schemas",
        (),
        ("overnight.jobs", "overnight.workers"),
    ),
    (
        "jobs works as a library without the CLI: only jobs/cli imports overnight.jobs.cli",
        "overnight",
        ("overnight.jobs.cli",),
        ("overnight.jobs.cli",),
    ),
]


# Inside jobs/, top to bottom: a module may import its own layer and those below, never one
# above. The job kinds are the modules left at the top of jobs/ (a job each, and the helpers
# only they use); the base is the job spec and the lists and errors every layer shares.
JOB_LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("cli", ("overnight.jobs.cli",)),
    ("api", ("overnight.jobs.api",)),
    ("ops", ("overnight.jobs.ops",)),
    (
        "job kinds",
        tuple(
            f"overnight.jobs.{m}"
            for m in (
                "transcribe",
                "process",
                "probe",
                "documents",
                "preflight",
                "models",
                "redaction",
            )
        ),
    ),
    ("run", ("overnight.jobs.run",)),
    ("accounting", ("overnight.jobs.accounting",)),
    ("dataset", ("overnight.jobs.dataset",)),
    (
        "base",
        tuple(
            f"overnight.jobs.{m}" for m in ("spec", "config_model", "choices", "errors", "secrets")
        ),
    ),
]


def job_layer(module: str) -> int | None:
    for i, (_, prefixes) in enumerate(JOB_LAYERS):
        if any(_under(module, p) for p in prefixes):
            return i
    return None


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _module_name(path: Path) -> tuple[str, bool]:
    """The dotted name of a source file under the one import name, and whether it is a package."""
    parts = path.relative_to(REPO).with_suffix("").parts
    is_package = parts[-1] == "__init__"
    if is_package:
        parts = parts[:-1]
    return ".".join(("overnight", *parts)), is_package


def _sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (REPO / package).rglob("*.py"))


def imports(path: Path) -> list[tuple[int, str, str]]:
    """(line, imported module, source text) for every import in a file, however nested.

    ``from a import b`` yields both ``a`` and ``a.b`` (b may be a submodule); relative imports
    are resolved against the file's package; ``importlib.import_module("...")`` with a literal
    name counts as an import of that name.
    """
    name, is_package = _module_name(path)
    package = name if is_package else name.rpartition(".")[0]
    source = path.read_text(encoding="utf-8")
    found: list[tuple[int, str, str]] = []
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source, filename=str(path))):
        text = lines[node.lineno - 1] if isinstance(node, ast.stmt | ast.expr) else ""
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, text) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.append((node.lineno, target, text))
            found += [(node.lineno, f"{target}.{alias.name}", text) for alias in node.names]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value, text))
    return found


def violations(path: Path) -> list[str]:
    name, _ = _module_name(path)
    out = []
    for rule, applies_to, exempt, forbidden in RULES:
        if not _under(name, applies_to) or any(_under(name, e) for e in exempt):
            continue
        for line, target, text in imports(path):
            if any(_under(target, f) for f in forbidden):
                out.append(f"{path.relative_to(REPO)}:{line}: {text.strip()}  ({rule})")
    mine = job_layer(name)
    if mine is not None:
        for line, target, text in imports(path):
            theirs = job_layer(target)
            if theirs is not None and theirs < mine:
                out.append(
                    f"{path.relative_to(REPO)}:{line}: {text.strip()}  (jobs layer "
                    f"{JOB_LAYERS[mine][0]!r} imports {JOB_LAYERS[theirs][0]!r}, above it)"
                )
    return sorted(set(out))


def test_every_module_of_jobs_has_its_layer():
    """A new module or subpackage of jobs/ is placed in JOB_LAYERS, or this fails."""
    loose = [
        name
        for p in _sources()
        if p.relative_to(REPO).parts[0] == "jobs"
        and (name := _module_name(p)[0]) != "overnight.jobs"
        and job_layer(name) is None
    ]
    assert not loose, f"modules of jobs/ in no layer of JOB_LAYERS: {loose}"


def test_an_upward_import_inside_jobs_is_named(tmp_path, monkeypatch):
    fake = tmp_path / "jobs" / "dataset"
    fake.mkdir(parents=True)
    module = fake / "fake.py"
    module.write_text("from overnight.jobs.run import stage\nfrom overnight.jobs import errors\n")
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    found = violations(module)
    assert len(found) == 1 and "fake.py:1:" in found[0], found
    assert "'dataset' imports 'run', above it" in found[0]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_import_points_down(package):
    found = [
        v for p in _sources() if p.relative_to(REPO).parts[0] == package for v in violations(p)
    ]
    assert not found, "imports against the layer contract:\n" + "\n".join(found)


def test_the_check_sees_lazy_relative_and_dynamic_imports(tmp_path, monkeypatch):
    """The checker itself: an upward import inside a function, a relative one, a dynamic one."""
    fake = tmp_path / "workers" / "llm"
    fake.mkdir(parents=True)
    module = fake / "fake.py"
    module.write_text(
        "import importlib\n"
        "def f():\n"
        "    from overnight.jobs import runner\n"
        "    from ...jobs.cli import main\n"
        "    return importlib.import_module('overnight.jobs.run.stage')\n"
        "from overnight.schemas import tables\n"
    )
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    found = violations(module)
    lines = [(v.split(":")[1], "only jobs/cli" in v) for v in found]
    assert lines == [("3", False), ("4", False), ("4", True), ("5", False)], found
    assert "fake.py:4: from ...jobs.cli import main" in found[1]


def test_every_package_is_checked():
    """A new top-level folder under overnight/ needs its place in the contract."""
    linked = {p.name for p in (REPO / "overnight").iterdir() if p.is_dir()}
    assert linked == set(PACKAGES), linked
    assert len(_sources()) > 50


def test_tests_mirror_the_source_tree():
    """Each folder of tests/jobs, tests/workers and tests/schemas is the test folder of the
    source package at the same place (tests/jobs/run/ tests jobs/run/), and each source
    subpackage with tests of its own has its folder: a newcomer finds a module's tests by
    its path."""
    stray = [
        str(d.relative_to(REPO))
        for package in PACKAGES
        for d in (REPO / "tests" / package).rglob("*")
        if d.is_dir()
        and d.name != "__pycache__"
        and not (REPO / d.relative_to(REPO / "tests")).is_dir()
    ]
    assert not stray, f"test folders with no source package at their place: {stray}"
    missing_init = [
        str(d.relative_to(REPO))
        for package in PACKAGES
        for d in [REPO / "tests" / package, *(REPO / "tests" / package).rglob("*")]
        if d.is_dir() and d.name != "__pycache__" and not (d / "__init__.py").exists()
    ]
    assert not missing_init, f"test folders that are not packages: {missing_init}"
