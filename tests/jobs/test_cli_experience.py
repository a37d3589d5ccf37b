"""The first hour of a user, through the `overnight` command as a subprocess: a run prints
no Ray notices, a folder listing takes only recordings and says what it left out, a no-op
rerun starts no Ray, a long run keeps printing progress, and the quick start keeps its calls
under its output and shows every turn of every call beside its script."""

from __future__ import annotations

import os
import subprocess
import sys

from jobs.errors import InputNotFound
from jobs.manifest import Selection, select_items
from tests.conftest import REPO
from workers.audio import MEDIA_EXTENSIONS


def overnight(*args: str, env: dict[str, str] | None = None, timeout: float = 600):
    return subprocess.run(
        [sys.executable, "-m", "jobs.cli", *args],
        env={**os.environ, **(env or {}), "PYTHONPATH": str(REPO), "COLUMNS": "100"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_include_and_exclude_globs_choose_the_files_of_a_folder(tmp_path):
    for name in ("a.wav", "b.WAV", "sub/c.flac", "notes.txt", "sub/video.mkv", "x_trans.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")

    def names(include=None, exclude=None):
        listing = select_items(
            str(tmp_path), Selection.of(MEDIA_EXTENSIONS, "media", include, exclude)
        )
        return sorted(os.path.relpath(i["uri"], tmp_path) for i in listing.items), listing

    taken, listing = names()
    assert taken == ["a.wav", "b.WAV", "sub/c.flac", "sub/video.mkv"]
    assert listing.skipped == {"not_media_extension": 2}
    taken, listing = names(include=["*.txt"], exclude=["*_trans.txt"])
    assert taken == ["notes.txt"]
    assert listing.skipped == {"excluded": 1, "not_included": 4}
    taken, _ = names(exclude=["sub/*"])  # the path under the input, or the file name
    assert taken == ["a.wav", "b.WAV"]
    taken, _ = names(include=["*"])
    assert len(taken) == 6


def test_a_manifest_row_and_a_named_file_are_items_whatever_their_extension(tmp_path):
    (tmp_path / "notes.txt").write_text("not audio")
    manifest = tmp_path / "m.csv"
    manifest.write_text(f"uri\n{tmp_path / 'notes.txt'}\n")
    media = Selection.of(MEDIA_EXTENSIONS, "media")
    assert len(select_items(str(manifest), media).items) == 1
    assert len(select_items(str(tmp_path / "notes.txt"), media).items) == 1


def test_a_folder_with_no_recording_left_is_exit_4_saying_what_was_skipped(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "call.wav").write_bytes(b"RIFF")
    (tmp_path / "in" / "librispeech_trans.txt").write_text("x\n")
    done = overnight(
        "transcribe", str(tmp_path / "in"), str(tmp_path / "out"), "--exclude", "*.wav"
    )
    assert done.returncode == InputNotFound.exit_code
    assert "Traceback" not in done.stdout + done.stderr
    assert done.stderr.count("\n") == 1
    assert "holds no audio or video files: 2 skipped (1 excluded, 1 not_media_extension)" in (
        done.stderr
    )
    assert "--include GLOB" in done.stderr
