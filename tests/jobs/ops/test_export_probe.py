"""Specifications for `overnight export` found by a hostile probe: unique names, one client a
DEST, failures in one paragraph, reruns, and the guards on DEST."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from overnight.jobs.cli import main
from overnight.jobs.dataset import storage
from overnight.jobs.errors import ConfigError
from overnight.jobs.ops import export as export_module
from overnight.jobs.ops.export import export
from overnight.schemas.tables import TRANSCRIPTS
from tests.jobs.ops.test_export import _output_of, _row


def _sources(folder: Path) -> dict[str, str]:
    """Each JSON file's name and the recording it holds."""
    return {p.name: json.loads(p.read_text())["source_uri"] for p in folder.iterdir()}


def test_a_tagged_name_never_lands_on_another_recordings_plain_name(tmp_path: Path):
    twins = [_row("a" * 16, "s3://calls/x/dup.wav"), _row("b" * 16, "s3://calls/y/dup.wav")]
    export(str(_output_of(tmp_path / "first", twins)), str(tmp_path / "first-json"), "json")
    tagged = sorted(p.stem for p in (tmp_path / "first-json").iterdir())[0]
    # A third recording whose plain name is the tagged name of one of the twins.
    rows = [*twins, _row("c" * 16, f"s3://calls/z/{tagged}.wav")]
    summary = export(str(_output_of(tmp_path / "second", rows)), str(tmp_path / "json"), "json")
    found = _sources(tmp_path / "json")
    assert summary["files"] == len(found) == 3, found
    assert sorted(found.values()) == sorted(r["source_uri"] for r in rows)


def test_control_characters_are_cleaned_out_of_export_file_names(tmp_path: Path):
    rows = [_row("a1", "s3://calls/a\nb\tc\x1bd\x7f.wav"), _row("b2", "/calls/\r.wav")]
    export(str(_output_of(tmp_path, rows)), str(tmp_path / "srt"), "srt")
    names = sorted(p.name for p in (tmp_path / "srt").iterdir())
    assert names == ["_.srt", "a_b_c_d_.srt"], names


def _many(tmp_path: Path, n: int) -> Path:
    rows = [_row(f"i{k:03d}", f"s3://calls/call-{k:03d}.wav") for k in range(n)]
    return _output_of(tmp_path / f"out{n}", rows)


def test_export_resolves_dest_once_however_many_files_it_writes(tmp_path: Path, monkeypatch):
    real = storage.resolve
    dest_resolves: list[str] = []

    def counting(url, *args, **kwargs):
        if str(url).startswith(str(tmp_path / "d")):
            dest_resolves.append(url)
        return real(url, *args, **kwargs)

    monkeypatch.setattr(storage, "resolve", counting)
    counts = []
    for n in (2, 40):
        dest_resolves.clear()
        assert export(str(_many(tmp_path, n)), str(tmp_path / f"d{n}"), "srt")["files"] == n
        counts.append(len(dest_resolves))
    assert counts[0] == counts[1] <= 3, counts  # an S3 resolve builds a new client


def test_a_ray_batch_resolves_dest_once_for_all_its_files(tmp_path: Path, monkeypatch):
    real = storage.resolve
    calls: list[str] = []
    monkeypatch.setattr(storage, "resolve", lambda url, *a, **k: calls.append(url) or real(url))
    rows = [
        {**_row(f"i{k}", f"s3://c/call-{k}.wav"), "file_name": f"call-{k}.srt"} for k in range(5)
    ]
    export_module._write_batch(pa.Table.from_pylist(rows), str(tmp_path / "d"), "srt", None)
    assert len(calls) == 1 and len(list((tmp_path / "d").iterdir())) == 5


def test_a_long_export_prints_how_many_files_are_written(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setattr(export_module, "PROGRESS_EVERY_S", 0.0)
    export(str(_many(tmp_path, 5)), str(tmp_path / "d"), "srt")
    err = capsys.readouterr().err
    assert "of 5 files written to" in err, err


def test_an_export_to_s3_writes_every_file_through_one_client(s3, tmp_path: Path):
    s3.create_bucket(Bucket="exports")
    summary = export(str(_many(tmp_path, 3)), "s3://exports/subs", "vtt")
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="exports")["Contents"])
    assert summary["files"] == 3
    assert keys == [f"subs/call-{k:03d}.vtt" for k in range(3)]


def test_a_file_that_cannot_be_written_stops_the_export_in_one_paragraph_with_exit_11(
    tmp_path: Path, capsys
):
    out = _many(tmp_path, 4)
    dest = tmp_path / "d"
    (dest / "call-002.srt").mkdir(parents=True)  # a folder where a file goes: EISDIR
    assert main(["export", str(out), str(dest)]) == 11
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "'call-002.srt'" in err and "IsADirectoryError" in err
    written = [p for p in dest.iterdir() if p.is_file()]
    assert f"{len(written)} of 4 files were written" in err, err


def test_a_recording_transcribed_again_under_a_new_item_id_is_one_file_of_its_newest_row(
    tmp_path: Path,
):
    # A touched local file gets a new item id; it is still one recording.
    rows = [_row("old1", "/calls/call.wav", when=0), _row("new2", "/calls/call.wav", when=5)]
    summary = export(str(_output_of(tmp_path, rows)), str(tmp_path / "json"), "json")
    assert summary["files"] == 1 and summary["items_without_transcript"] == 0
    [doc] = [json.loads(p.read_text()) for p in (tmp_path / "json").iterdir()]
    assert doc["run_id"] == "r5"


def test_colliding_names_stay_the_same_when_a_recording_gets_a_new_item_id(tmp_path: Path):
    first = [_row("a1", "/x/call.wav"), _row("b1", "/y/call.wav")]
    again = [_row("a2", "/x/call.wav"), _row("b2", "/y/call.wav")]  # both touched since
    export(str(_output_of(tmp_path / "1", first)), str(tmp_path / "e1"), "json")
    export(str(_output_of(tmp_path / "2", again)), str(tmp_path / "e2"), "json")
    assert _sources(tmp_path / "e1") == _sources(tmp_path / "e2")


def test_dest_through_a_link_into_the_datasets_is_refused(output_dir: Path, tmp_path: Path):
    (tmp_path / "link").symlink_to(output_dir / "transcripts")
    with pytest.raises(ConfigError, match="inside transcripts/ of OUTPUT"):
        export(str(output_dir), str(tmp_path / "link"), "srt")
    with pytest.raises(ConfigError, match="inside transcripts/ of OUTPUT"):
        export(str(output_dir), str(tmp_path / "link" / "sub"), "srt")


@pytest.fixture
def output_dir(tmp_path: Path) -> Path:
    return _output_of(tmp_path, [_row("a1", "s3://calls/call-1.wav")])


def _s3_output(s3) -> str:
    s3.create_bucket(Bucket="night")
    buf = io.BytesIO()
    pq.write_table(
        pa.Table.from_pylist([_row("a1", "s3://calls/call-1.wav")], schema=TRANSCRIPTS), buf
    )
    s3.put_object(Bucket="night", Key="out/transcripts/part-0.parquet", Body=buf.getvalue())
    return "s3://night/out"


@pytest.mark.parametrize(
    ("dest", "folder"),
    [("s3://night/out//transcripts", "transcripts"), ("s3://night/out/./costs", "costs")],
)
def test_an_s3_dest_spelt_with_doubled_slashes_or_dots_is_checked_as_written(
    s3, dest: str, folder: str
):
    with pytest.raises(ConfigError, match=f"inside {folder}/ of OUTPUT"):
        export(_s3_output(s3), dest, "srt")


def test_an_s3_dest_that_is_an_object_is_exit_11_like_a_local_file(s3, capsys):
    out = _s3_output(s3)
    s3.put_object(Bucket="night", Key="afile", Body=b"not a folder")
    assert main(["export", out, "s3://night/afile"]) == 11
    err = capsys.readouterr().err
    assert "it is a file, not a folder" in err and "Traceback" not in err


def test_redacted_only_refusal_says_to_transcribe_into_a_new_output(output_dir: Path, tmp_path):
    with pytest.raises(ConfigError, match="into a new OUTPUT with --redact"):
        export(str(output_dir), str(tmp_path / "d"), "srt", redacted_only=True)


def test_the_export_line_names_a_few_recordings_with_only_error_rows_and_counts_the_rest(
    tmp_path: Path, capsys
):
    failed = [_row(f"e{k}", f"s3://calls/bad-{k}.wav", status="error") for k in range(5)]
    out = _output_of(tmp_path, [_row("a1", "s3://calls/call-1.wav"), *failed])
    assert main(["export", str(out), str(tmp_path / "d")]) == 0
    line = capsys.readouterr().out
    assert "5 recording(s) have only error rows: " in line
    assert "s3://calls/bad-0.wav, s3://calls/bad-1.wav, s3://calls/bad-2.wav and 2 more" in line


def test_a_file_that_cannot_be_written_by_a_ray_task_stops_the_export_the_same_way(
    tmp_path: Path,
):
    from overnight.jobs.errors import OutputNotWritable

    out = _many(tmp_path, 4)
    dest = tmp_path / "d"
    (dest / "call-002.srt").mkdir(parents=True)  # a folder where a file goes: EISDIR
    with pytest.raises(OutputNotWritable) as caught:
        export(str(out), str(dest), "srt", ray_threshold=1)
    message = str(caught.value)
    assert "Traceback" not in message and len(message.strip().splitlines()) == 1, message
    assert "'call-002.srt'" in message and "IsADirectoryError" in message
    assert "files were written" in message and "rerun" in message
