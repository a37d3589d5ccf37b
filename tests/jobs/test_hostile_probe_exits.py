"""Specifications from a hostile probe of the command line (issue #35): each systemic failure
is one paragraph and its exit status, never a traceback, and leaves nothing behind."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from overnight.jobs.cli import main
from overnight.jobs.demo import noise, write_wav
from tests.jobs.test_cli_messages import assert_one_clean_paragraph


@pytest.fixture
def recording(tmp_path) -> Path:
    path = tmp_path / "calls" / "x.wav"
    path.parent.mkdir()
    write_wav(path, noise(1.0))
    return path


@pytest.fixture
def full_disk(tmp_path, monkeypatch) -> Path:
    """A folder on a disk with no space left: files can be created (inodes are free), but
    their data cannot be stored, which a full disk reports at the latest when it is synced."""
    disk = tmp_path / "disk"
    disk.mkdir()
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(disk)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return disk


def test_an_output_on_a_full_disk_is_exit_11_in_one_line_and_leaves_nothing(
    full_disk, recording, capsys
):
    out = full_disk / "out"
    out.mkdir()
    status = main(["transcribe", str(recording), str(out), "--quiet"])
    captured = capsys.readouterr()
    assert status == 11, captured.err
    assert_one_clean_paragraph(captured.out + captured.err)
    assert "No space left on device" in captured.err
    assert list(full_disk.rglob("*")) == [out]  # no claim, no temporary file, no manifest
