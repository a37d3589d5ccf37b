"""Specifications from a hostile probe of the command line (issue #35): each systemic failure
is one paragraph and its exit status, never a traceback, and leaves nothing behind."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from overnight.jobs.cli import main
from overnight.jobs.ops.demo import espeak_available, noise, stereo_dialogue, write_wav
from tests.conftest import LoopbackProxy, upload_folder
from tests.jobs.cli.test_cli_messages import assert_one_clean_paragraph


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


@pytest.mark.skipif(not espeak_available(), reason="espeak-ng not installed")
@pytest.mark.usefixtures("ray_local")
def test_a_251_character_name_with_redacted_audio_is_an_ok_row_and_a_bad_item_an_error_row(
    tmp_path,
):
    """A legal long name once failed its whole batch (exit 6, no rows); a recording whose
    redacted audio cannot be written (here a folder in the way) is that item's error row."""
    from overnight.jobs.dataset import storage
    from overnight.jobs.dataset.manifest import item_id
    from overnight.jobs.redaction import audio_name
    from tests.jobs.test_redaction_job import TURNS
    from tests.jobs.test_transcribe import by_name, rows

    calls = tmp_path / "calls"
    calls.mkdir()
    long_name = "c" * 247 + ".wav"  # 251 characters
    audio = stereo_dialogue(TURNS[:2], gap_s=0.4)[0]
    for name in (long_name, "blocked.wav", "plain.wav"):
        write_wav(calls / name, audio)
    out = tmp_path / "out"
    (blocked,) = [o for o in storage.list_objects(str(calls)) if o.uri.endswith("blocked.wav")]
    in_the_way = (
        out
        / "redacted_audio"
        / audio_name(
            {"source_uri": blocked.uri, "item_id": item_id(blocked.uri, blocked.size, blocked.etag)}
        )
    )
    in_the_way.mkdir(parents=True)
    labels = ["--channel-labels", "agent,customer"]
    redact = ["--redact", "pci", "--redact-audio"]
    assert main(["transcribe", str(calls), str(out), *labels, *redact, "--quiet"]) == 0
    got = by_name(rows(out))
    assert got[long_name]["status"] == got["plain.wav"]["status"] == "ok", got[long_name]
    assert got["blocked.wav"]["error_code"] == "redaction_failed"
    assert "IsADirectoryError" in got["blocked.wav"]["error_message"]
    flacs = sorted(p.name for p in (out / "redacted_audio").iterdir() if p.is_file())
    assert len(flacs) == 2 and all(len(n.encode()) <= 255 for n in flacs), flacs
    assert any(n.startswith("c" * 200) for n in flacs)
    assert not list((out / "redacted_audio").glob(".*"))  # no temporary file left


@pytest.mark.usefixtures("ray_local")
def test_a_skipped_file_named_with_a_newline_prints_escaped_in_the_summary(recording, capsys):
    forged = "notes\n[overnight] 0 items failed.txt"
    (recording.parent / forged).write_text("not a recording")
    out = recording.parent.parent / "out"
    assert main(["transcribe", str(recording.parent), str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert not [line for line in printed.splitlines() if line.startswith("[overnight]")]
    assert "notes\\n[overnight] 0 items failed.txt" in printed


def test_an_output_bucket_that_does_not_exist_is_exit_11_in_one_paragraph_also_when_dry(
    s3, recording, capsys
):
    upload_folder(s3, "calls-in", recording.parent, "in")
    for dry in (["--dry-run"], []):
        status = main(["transcribe", "s3://calls-in/in", "s3://no-such-bucket/out", *dry])
        captured = capsys.readouterr()
        assert status == 11, captured.err
        assert_one_clean_paragraph(captured.out + captured.err)
        assert "the bucket s3://no-such-bucket does not exist" in captured.err
        assert "aws s3 mb s3://no-such-bucket" in captured.err
    assert "no-such-bucket" not in {b["Name"] for b in s3.list_buckets()["Buckets"]}


class _StorageDownAtPublish(LoopbackProxy):
    """An S3 endpoint in front of moto that goes down at the publish's first write to
    ``costs/``: every open connection is cut, and from then on each new one is accepted and
    dropped at once (a load balancer whose backends are gone), which is how an outage met
    aiohttp between taking a connection and writing its request."""

    def __init__(self, upstream: str):
        import socket

        self.down = False
        self.open: list[socket.socket] = []
        super().__init__(upstream)

    def accepted(self, conn) -> None:
        import socket
        import threading

        if self.down:
            conn.close()
            return
        up = socket.create_connection(self.upstream)
        self.open += [conn, up]
        threading.Thread(target=self._pump, args=(conn, up, True), daemon=True).start()
        threading.Thread(target=self._pump, args=(up, conn, False), daemon=True).start()

    def _pump(self, src, dst, requests: bool) -> None:
        import contextlib
        import socket

        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if requests and data.startswith(b"PUT ") and b"/costs/" in data.split(b"\r\n")[0]:
                    self.down = True
                    for s in self.open:
                        with contextlib.suppress(OSError):
                            s.shutdown(socket.SHUT_RDWR)
                    return
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


@pytest.mark.slow
def test_an_outage_during_the_publish_is_exit_3_in_one_line_and_the_rerun_repairs_it(
    s3, s3_server, tmp_path
):
    from tests.jobs.test_transcribe import _cli

    src = tmp_path / "in"
    src.mkdir()
    for i in range(6):
        write_wav(src / f"call_{i}.wav", noise(1.0, seed=i))
    s3.create_bucket(Bucket="out-down")
    proxy = _StorageDownAtPublish(s3_server)
    try:
        env = {**os.environ, "AWS_ENDPOINT_URL": proxy.url}
        result = _cli("transcribe", str(src), "s3://out-down/night", env=env)
    finally:
        proxy.close()
    assert proxy.down  # the outage met the publish
    assert result.returncode == 3, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr[-3000:]
    assert "storage unreachable" in result.stderr
    again = _cli("transcribe", str(src), "s3://out-down/night")
    assert again.returncode == 0, again.stderr[-3000:]
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="out-down")["Contents"]]
    assert any(k.startswith("night/costs/run_date=") for k in keys)
    assert not any(k.startswith("night/_staging/") and k.endswith(".parquet") for k in keys)
