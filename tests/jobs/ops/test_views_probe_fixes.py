"""`overnight views` reads only what overnight reads and prints no credential; `probe` gives a
file the error code transcription gives it; `plan --profile` takes no throughput from probe
runs; a manifest row naming a looping link is that item's error, not a storage outage."""

from __future__ import annotations

import json
import os
import shutil
from datetime import date
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from overnight.jobs.cli import main
from overnight.jobs.dataset import storage
from overnight.jobs.dataset.manifest import records_from_manifest
from overnight.jobs.ops.demo import noise, write_wav
from overnight.jobs.ops.plan import load_profiles
from overnight.jobs.probe import Prober
from overnight.schemas import TRANSCRIPTS

duckdb = pytest.importorskip("duckdb")

NIGHT = date(2026, 12, 1)


def _write_night(out: Path, items: list[str]) -> Path:
    folder = out / "transcripts" / f"run_date={NIGHT.isoformat()}"
    folder.mkdir(parents=True)
    rows = [
        {
            **dict.fromkeys(TRANSCRIPTS.names),
            "item_id": item,
            "source_uri": f"s3://calls/{item}.wav",
            "status": "ok",
            "run_id": "r1",
        }
        for item in items
    ]
    pq.write_table(pa.Table.from_pylist(rows, schema=TRANSCRIPTS), folder / "part-0.parquet")
    return folder


def _duckdb_rows(capsys: pytest.CaptureFixture[str], output: Path, query: str) -> list[tuple]:
    capsys.readouterr()
    assert main(["views", str(output), "--engine", "duckdb"]) == 0
    con = duckdb.connect()
    con.execute(capsys.readouterr().out)
    return con.sql(query).fetchall()


def _refusal(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["views", *args])
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1, captured.err
    return code, captured.err


# -- views ------------------------------------------------------------------------------------


def test_duckdb_views_read_only_run_date_partitions_with_run_date_a_date(tmp_path, capsys):
    out = tmp_path / "out"
    night = _write_night(out, ["a", "b"])
    # Copies that overnight's own readers (show, report) leave alone.
    shutil.copytree(night, out / "transcripts" / "run_date=garbage")
    (out / "transcripts" / "backup").mkdir()
    shutil.copy(night / "part-0.parquet", out / "transcripts" / "backup" / "part-0.parquet")
    rows = _duckdb_rows(
        capsys,
        out,
        "select count(*), typeof(any_value(run_date)) from transcripts "
        "where run_date >= DATE '2026-12-01'",
    )
    assert rows == [(2, "DATE")]


@pytest.mark.parametrize("name", ["out [x]", "out?q", "out*"])
def test_duckdb_views_read_an_output_whose_path_holds_pattern_characters_as_it_is(
    tmp_path, capsys, name
):
    out = tmp_path / name
    _write_night(out, ["a", "b"])
    _write_night(tmp_path / "outZq", ["sibling"])  # what `out?q` and `out*` also matched
    rows = _duckdb_rows(capsys, out, "select item_id from transcripts order by item_id")
    assert rows == [("a",), ("b",)]


def test_duckdb_views_over_a_path_with_a_backslash_are_refused_in_one_line(tmp_path, capsys):
    out = tmp_path / "a\\b"
    _write_night(out, ["a"])
    code, err = _refusal(capsys, str(out), "--engine", "duckdb")
    assert code == 2 and "backslash" in err


@pytest.mark.parametrize("engine", ["athena", "trino", "duckdb"])
@pytest.mark.parametrize(
    "url",
    [
        "s3://AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY@bucket/o1",
        "s3://bucket/o1?X-Amz-Signature=0123456789abcdef&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE",
    ],
)
def test_views_refuse_an_object_store_url_carrying_credentials_and_never_print_them(
    capsys, engine, url
):
    code, err = _refusal(capsys, url, "--engine", engine, "--dataset", "transcripts")
    assert code == 2 and "carries credentials in the URL" in err
    for secret in ("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI", "0123456789abcdef"):
        assert secret not in err


def test_views_of_a_file_say_it_is_not_an_output_folder(tmp_path, capsys):
    path = tmp_path / "summary.json"
    path.write_text("{}")
    for extra in ([], ["--dataset", "costs"]):
        code, err = _refusal(capsys, str(path), "--engine", "duckdb", *extra)
        assert code == 4 and "is a file: OUTPUT must be an output folder" in err
        assert "unreachable" not in err and "network" not in err


# -- probe ------------------------------------------------------------------------------------


def _probed(uri: str, size: int | None) -> dict:
    return Prober(storage.StorageConfig(), 2**30)._probe({"item_id": "i", "uri": uri, "size": size})


def test_probe_gives_a_fifo_and_a_device_not_a_file_as_transcription_does(tmp_path):
    fifo = tmp_path / "pipe.wav"
    os.mkfifo(fifo)
    for uri in (str(fifo), "/dev/zero"):
        size = storage.stat(uri).size  # 0: as the listing gives it
        row = _probed(uri, size)
        with pytest.raises(storage.Unreadable) as fetched:  # the transcription job's fetch
            storage.read_bytes(uri)
        assert (row["status"], row["error_code"]) == ("error", fetched.value.code.value)
        assert row["error_code"] == "not_a_file"


def test_probe_still_gives_an_empty_file_empty_file(tmp_path):
    empty = tmp_path / "empty.wav"
    empty.touch()
    row = _probed(str(empty), 0)
    assert (row["status"], row["error_code"]) == ("error", "empty_file")
    write_wav(tmp_path / "ok.wav", noise(1.0))
    row = _probed(str(tmp_path / "ok.wav"), (tmp_path / "ok.wav").stat().st_size)
    assert row["status"] == "ok" and row["duration_s"] == pytest.approx(1.0, abs=0.01)


# -- plan --profile ---------------------------------------------------------------------------


def _probe_run(run_id: str) -> dict:
    """A probe run's summary as `overnight probe` writes it (the figures a plan reads)."""
    return {
        "run_id": run_id,
        "kind": "probe",
        "accelerator": "cpu",
        "device": "cpu",
        "model": None,
        "options": {
            "actors": 2,
            "cpus_per_actor": 0.25,
            "gpus_per_actor": 0.0,
            "max_file_mb": 2048,
        },
        "prices": {"cpu": 0.0425, "h100": 2.69},
        "items": 7,
        "audio_seconds": 43.418,
        "accelerator_seconds": 2.376,
        "accelerator_reserved_seconds": 37.195,
        "cost_usd": 7.01e-06,
        "audio_hours": 0.01206,
    }


def _transcribe_run(run_id: str) -> dict:
    return {
        "run_id": run_id,
        "kind": "transcribe",
        "model": "tiny",
        "accelerator": "cpu",
        "device": "cpu",
        "options": {"compute_type": "int8", "batch_size": 8, "beam_size": 1},
        "prices": {"cpu": 0.0425},
        "items": 7,
        "audio_seconds": 60.0,
        "accelerator_seconds": 10.0,
        "accelerator_reserved_seconds": 12.0,
        "cost_usd": 0.001,
    }


def _runs(folder: Path, runs: list[dict]) -> str:
    (folder / "runs").mkdir(parents=True)
    for run in runs:
        (folder / "runs" / f"{run['run_id']}.json").write_text(json.dumps(run))
    return str(folder)


def test_a_profile_of_past_runs_takes_no_throughput_from_probe_runs(tmp_path):
    out = _runs(tmp_path / "out", [_probe_run("p1"), _transcribe_run("t1")])
    [profile] = load_profiles([out])
    assert profile.unit == "audio_s" and profile.source == f"{out}: 1 run(s), t1"


def test_a_plan_from_probe_runs_alone_says_they_measure_no_throughput(tmp_path, capsys):
    out = _runs(tmp_path / "out", [_probe_run("p1")])
    for unit in (["--documents", "1000"], ["--audio-hours", "10"]):
        capsys.readouterr()
        code = main(["plan", *unit, "--deadline", "6h", "--profile", out])
        captured = capsys.readouterr()
        assert code == 4 and captured.out == "", captured.out
        assert "probe runs read headers and measure no throughput" in captured.err
        assert len(captured.err.strip().splitlines()) == 1, captured.err


# -- a manifest row naming a looping link ---------------------------------------------------


def test_a_manifest_row_naming_a_looping_link_is_listed_as_an_unreadable_item(tmp_path):
    (tmp_path / "loop1.wav").symlink_to(tmp_path / "loop2.wav")
    (tmp_path / "loop2.wav").symlink_to(tmp_path / "loop1.wav")
    write_wav(tmp_path / "ok.wav", noise(1.0))
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text(
        "".join(json.dumps({"uri": str(tmp_path / n)}) + "\n" for n in ("loop1.wav", "ok.wav"))
    )
    loop, ok = records_from_manifest(str(manifest))
    assert (loop["size"], loop["etag"]) == (None, None)  # as a link in a listed folder
    assert ok["size"] == (tmp_path / "ok.wav").stat().st_size
    # Read, it is that item's error row (fetch_failed), as the same link in a folder gives.
    row = _probed(loop["uri"], loop["size"])
    assert (row["status"], row["error_code"]) == ("error", "fetch_failed")
