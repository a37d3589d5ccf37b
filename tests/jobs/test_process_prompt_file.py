"""Specifications for `--prompt`: a template file, or the template itself; anything else is
refused in one line before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

from overnight.jobs.cli import main


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_text("The customer asked for a refund of the late fee.")
    return folder


def _process(docs: Path, prompt: str) -> list[str]:
    return ["process", str(docs), str(docs.parent / "out"), "--task", "prompt", "--prompt", prompt]


@pytest.mark.parametrize(
    "make, said",
    [
        (lambda d: d / "latin.txt", "is not UTF-8 text (byte 1); save it as UTF-8"),
        (lambda d: d / "nowhere.txt", "is no file"),
        (lambda d: d, "is a folder"),
    ],
    ids=["not UTF-8", "missing", "a folder"],
)
def test_a_prompt_file_that_cannot_be_read_as_a_template_is_exit_2_in_one_line(
    docs: Path, tmp_path: Path, capsys, make, said: str
):
    (tmp_path / "latin.txt").write_bytes(b"R\xe9sume this: {text}\n")
    prompt = make(tmp_path)
    assert main([*_process(docs, str(prompt)), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert said in err and "process.prompt" in err


def test_a_prompt_given_as_a_file_or_as_the_template_itself_is_taken(
    docs: Path, tmp_path: Path, capsys
):
    (tmp_path / "t.txt").write_text("Résume this in French: {text}\n", encoding="utf-8")
    assert main([*_process(docs, str(tmp_path / "t.txt")), "--dry-run"]) == 0
    assert main([*_process(docs, "Say what this is about: {text}"), "--dry-run"]) == 0
    assert "Traceback" not in capsys.readouterr().err
