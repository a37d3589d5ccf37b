"""What a second hostile probe found (2026-12-07): a file whose name is not UTF-8 stopped the
whole job, and the commands that read an output (``show``, ``report``, ``export``, ``plan``,
``vacuum``) met damaged or foreign files in it with tracebacks or wrong figures. Each test
states what must hold."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from overnight.jobs.cli import main
from overnight.jobs.dataset import storage
from overnight.jobs.ops.demo import espeak_available, speak, write_wav
from tests.jobs.test_transcribe import rows, transcribe

pytestmark = pytest.mark.usefixtures("ray_local")

# A Latin-1 name, as an old PBX export writes it: "réunion_ÿ.wav" in bytes that are not UTF-8.
LATIN1 = os.fsdecode("r\xe9union_\xff.wav".encode("latin-1"))


def test_a_local_name_that_is_not_utf8_is_listed_as_text_and_read_from_disk(tmp_path):
    (tmp_path / LATIN1).write_bytes(b"RIFF....")
    (tmp_path / "plain.wav").write_bytes(b"RIFF")
    [odd, plain] = sorted(
        storage.list_objects(str(tmp_path)), key=lambda o: o.uri.endswith("plain.wav")
    )
    assert odd.uri.endswith("r\\xe9union_\\xff.wav") and odd.uri.encode("utf-8")
    assert odd.size == 8 and plain.uri == str(tmp_path / "plain.wav")
    assert storage.read_bytes(odd.uri) == b"RIFF...."
    # a missing name with an escape in it stays missing (fetch_failed), not another file
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(str(tmp_path / "r\\xe9union_\\xfe.wav"))


def test_a_recording_whose_name_is_not_utf8_is_transcribed_beside_the_others(tmp_path, capsys):
    # It stopped the job before any work with a UnicodeEncodeError traceback from its item id,
    # so the other recordings of the folder were not transcribed either.
    if not espeak_available():
        pytest.skip("espeak-ng is not installed")
    calls = tmp_path / "calls"
    calls.mkdir()
    write_wav(calls / LATIN1, speak("I would like to check my balance please."))
    write_wav(calls / "plain.wav", speak("Thank you for calling, how can I help you today?"))
    out = tmp_path / "out"
    summary = transcribe(str(calls), str(out), device="cpu")
    assert summary["succeeded"] == 2
    found = {Path(r["source_uri"]).name: r for r in rows(out)}
    assert set(found) == {"r\\xe9union_\\xff.wav", "plain.wav"}
    assert "balance" in found["r\\xe9union_\\xff.wav"]["text"].lower()
    again = transcribe(str(calls), str(out), device="cpu")
    assert again["items_already_done"] == 2 and len(rows(out)) == 2  # a rerun adds nothing
    assert main(["export", str(out), str(tmp_path / "srt"), "--format", "srt"]) == 0
    assert sorted(p.name for p in (tmp_path / "srt").iterdir()) == [
        "plain.srt",
        "r\\xe9union_\\xff.srt",
    ]
    shutil.rmtree(tmp_path / "srt")
