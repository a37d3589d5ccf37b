"""Damaged and foreign files in an OUTPUT: the read-side commands (show, report, export, plan
--profile, vacuum, views, status/logs) answer with one clear paragraph and a documented exit
status, or skip what is not overnight's with a warning line; never a traceback, nothing lost.

Outputs are built with pyarrow directly (and the ledger code the jobs use), not by a job.
"""

from __future__ import annotations

import json
import logging
import shutil
from datetime import UTC, date, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from overnight.jobs.cli import main
from overnight.jobs.dataset import storage
from overnight.jobs.dataset.commits import CommittedDataset, partition_date
from overnight.jobs.errors import ConfigError, InputNotFound
from overnight.jobs.ops import remote, views
from overnight.jobs.ops.plan import load_profiles, read_summaries
from overnight.jobs.ops.report import load
from overnight.jobs.ops.vacuum import vacuum
from overnight.schemas import TRANSCRIPTS
from tests.jobs.ops.test_report import _speech_rows, _write_run

DAY = datetime(2026, 12, 1, 2, 40, tzinfo=UTC)
PARTITION = "run_date=2026-12-01"


@pytest.fixture
def output(tmp_path: Path) -> Path:
    """One night's output: 6 transcripts in a run_date= partition, its ledger and summary."""
    out = tmp_path / "out"
    _write_run(out, "night-1", "transcribe", _speech_rows("night-1", 6, 1, DAY, "cpu"), DAY, 9.0)
    for name in ("transcripts", "costs"):  # published, as a job leaves them
        (out / name / PARTITION).mkdir()
        for part in (out / name).glob("*.parquet"):
            part.rename(out / name / PARTITION / part.name)
    return out


def _part(out: Path, dataset: str = "transcripts") -> Path:
    [part] = (out / dataset / PARTITION).glob("*.parquet")
    return part


@pytest.fixture
def events() -> list[str]:
    """The operator events logged while the test runs (warnings of skipped files)."""
    seen: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    logger = logging.getLogger("overnight.events")
    handler = _Keep(logging.WARNING)
    logger.addHandler(handler)
    yield seen
    logger.removeHandler(handler)


def _foreign(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"foo": [1, 2, 3]}), path)


# -- 1: a part file cut short or of zero bytes ---------------------------------------------------


@pytest.mark.parametrize("cut", ["zero bytes", "cut short"])
@pytest.mark.parametrize("command", ["show", "report", "export"])
def test_a_damaged_transcripts_file_is_exit_4_naming_it_without_a_traceback(
    output: Path, tmp_path: Path, capsys, cut: str, command: str
):
    part = _part(output)
    data = part.read_bytes()
    part.write_bytes(b"" if cut == "zero bytes" else data[: len(data) // 2])
    args = [command, str(output)] + ([str(tmp_path / "srt")] if command == "export" else [])
    assert main(args) == 4
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert part.name in err and "restore the file" in err
    assert part.read_bytes() == (b"" if cut == "zero bytes" else data[: len(data) // 2])


def test_a_damaged_ledger_file_stops_the_report_naming_it(output: Path, capsys):
    _part(output, "costs").write_bytes(b"")
    assert main(["report", str(output)]) == 4
    err = capsys.readouterr().err
    assert _part(output, "costs").name in err and "Traceback" not in err


def test_a_damaged_file_is_reported_by_the_done_index_reader_too(output: Path):
    flat = output / "transcripts" / "part-flat.parquet"
    flat.write_bytes(_part(output).read_bytes()[:100])
    with pytest.raises(InputNotFound, match=r"part-flat\.parquet"):
        CommittedDataset(storage.resolve(str(output / "transcripts"))).committed_files(
            flat_only=True
        )


# -- 2: a Parquet file that is not overnight's ----------------------------------------------------


def test_a_foreign_parquet_file_is_skipped_with_a_warning_and_read_results_reads_the_rest(
    output: Path, events: list[str]
):
    _foreign(output / "transcripts" / PARTITION / "foreign.parquet")
    _foreign(output / "transcripts" / "top.parquet")
    dataset = CommittedDataset(storage.resolve(str(output / "transcripts")))
    table = dataset.read_results(["item_id", "run_id", "status"])
    assert table is not None and table.num_rows == 6
    assert set(table["run_id"].to_pylist()) == {"night-1"}
    assert sorted(m.split(": ")[1].rsplit("/", 1)[1] for m in events) == [
        "foreign.parquet",
        "top.parquet",
    ]
    assert all("item_id" in m for m in events)
    assert "top.parquet" not in str(dataset.committed_files(flat_only=True))


def test_a_foreign_file_in_costs_or_another_tables_rows_are_skipped_not_counted(
    output: Path, events: list[str]
):
    before = load([str(output)])
    _foreign(output / "costs" / PARTITION / "foreign.parquet")
    # overnight's own transcripts rows, dropped into costs/: another table's file
    shutil.copy(_part(output), output / "costs" / PARTITION / "transcripts-copy.parquet")
    after = load([str(output)])
    assert after.ledger.num_rows == before.ledger.num_rows
    assert after.ledger.to_pylist() == before.ledger.to_pylist()
    assert len(events) == 2 and any("'transcripts' rows" in m for m in events)


def test_show_report_and_export_skip_a_foreign_file_and_count_only_overnights_rows(
    output: Path, tmp_path: Path, capsys
):
    _foreign(output / "transcripts" / PARTITION / "foreign.parquet")
    _foreign(output / "transcripts" / "top.parquet")
    _foreign(output / "costs" / PARTITION / "foreign.parquet")
    assert main(["show", str(output), "--limit", "1"]) == 0
    shown = capsys.readouterr()
    assert "transcripts: 6 of 6 rows" in shown.out
    assert "warning: skipped" in shown.err and "Traceback" not in shown.err
    assert main(["report", str(output), "--json"]) == 0
    report = capsys.readouterr()
    assert "given twice" not in report.out + report.err
    assert report.err.count("warning: skipped") == 3
    assert main(["export", str(output), str(tmp_path / "txt"), "--format", "txt"]) == 0
    assert "wrote 5 txt file(s)" in capsys.readouterr().out  # the 5 ok of 6; none foreign
    assert len(list((tmp_path / "txt").rglob("*.txt"))) == 5


# -- 3: folders that are not run dates ------------------------------------------------------------


def test_a_run_date_folder_that_is_not_a_date_is_not_a_partition():
    assert partition_date("out/transcripts/run_date=garbage/part.parquet") is None
    assert partition_date("run_date=2026-12-01") == date(2026, 12, 1)


def test_readers_and_vacuum_leave_a_run_date_garbage_folder_alone(output: Path, capsys):
    stray = output / "transcripts" / "run_date=garbage"
    stray.mkdir()
    shutil.copy(_part(output), stray / "part.parquet")
    table = CommittedDataset(storage.resolve(str(output / "transcripts"))).read_results(["item_id"])
    assert table is not None and table.num_rows == 6
    assert main(["show", str(output)]) == 0
    assert main(["report", str(output)]) == 0
    done = vacuum(str(output), date(2027, 1, 1), dry_run=True)
    assert not any("garbage" in p for p in done.partitions)
    assert (stray / "part.parquet").exists()


def test_a_stray_folder_in_staging_stops_neither_publish_nor_vacuum(output: Path):
    stray = output / "_staging" / "transcripts" / "backup"
    stray.mkdir(parents=True)
    shutil.copy(_part(output), stray / "part.parquet")
    dataset = CommittedDataset(storage.resolve(str(output / "transcripts")))
    assert dataset.publish(TRANSCRIPTS, keep_run="night-1").rows == 0
    vacuum(str(output), date(2027, 1, 1))
    assert (stray / "part.parquet").exists()
    assert not (output / "transcripts" / PARTITION).exists()  # the real night went


# -- 4: files in runs/ that are not run summaries -------------------------------------------------


def test_files_in_runs_that_are_not_run_summaries_are_skipped_with_a_warning(
    output: Path, events: list[str], capsys
):
    runs = output / "runs"
    (runs / "hello.json").write_text('{"hello": 1}')
    (runs / "list.json").write_text("[]")
    (runs / "broken.json").write_text("{")
    (runs / "latin1.json").write_bytes(b'{"run_id": "\xe9"}')
    summaries = read_summaries(storage.resolve(str(output)))
    assert [s["run_id"] for s in summaries] == ["night-1"]
    assert len(events) == 4 and all("warning: skipped" in m for m in events)
    assert list(load([str(output)]).summaries) == ["night-1"]
    assert len(load_profiles([str(output)])) == 1
    assert main(["report", str(output)]) == 0
    assert main(["plan", "--profile", str(output), "--audio-hours", "1", "--deadline", "6h"]) == 0
    assert "Traceback" not in capsys.readouterr().err


# -- 5: vacuum of an OUTPUT that is not there -----------------------------------------------------


def test_vacuum_of_a_missing_output_is_exit_4_and_creates_nothing(tmp_path: Path, capsys):
    missing = tmp_path / "DOES_NOT_EXIST"
    assert main(["vacuum", str(missing), "--older-than", "1d"]) == 4
    assert not missing.exists()
    assert "does not exist" in capsys.readouterr().err


# -- 6: submission ids that are not ids -----------------------------------------------------------


@pytest.mark.parametrize("bad", ["", "?x", "../version", "a/b", "x#y", "ok\n", ".hidden"])
@pytest.mark.parametrize("command", ["status", "logs"])
def test_status_and_logs_refuse_an_id_that_is_no_submission_id_with_exit_2(
    bad: str, command: str, capsys
):
    assert main([command, bad, "--address", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert "is not valid" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_ids_submit_makes_are_still_looked_up():
    base = remote.submission_id_for("j" * 200 + ".toml", run_id="r")
    for good in (base, f"{base}-retry20", "raysubmit_AbC123", "overnight-a.b_c-20261201"):
        with pytest.raises(ConfigError, match="no cluster address"):
            remote.status(None, good)  # past the id check, to the address it needs


# -- 7: a location that would end the SQL comment -------------------------------------------------


def test_a_newline_in_the_location_stays_inside_the_views_header_comment(tmp_path: Path):
    where = str(tmp_path / "o") + "\nSELECT 42 AS injected;--"
    sql = views.ddl(where, "duckdb", ["transcripts"])
    header = sql.split("CREATE OR REPLACE VIEW", 1)[0]
    assert all(line.startswith("--") for line in header.splitlines() if line.strip())
    assert "\\nSELECT 42 AS injected" in header.splitlines()[0]


# -- 8: a part file copied beside itself ----------------------------------------------------------


def test_show_prints_the_rows_of_a_part_file_copied_beside_itself_once(output: Path, capsys):
    part = _part(output)
    shutil.copy(part, part.with_name("part-copy.parquet"))
    assert main(["show", str(output), "--limit", "0"]) == 0
    out = capsys.readouterr().out
    assert "transcripts: 6 of 6 rows" in out
    assert out.count("0.wav  ok") == 1
    assert main(["show", str(output), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 6


def test_vacuum_stops_before_removing_anything_at_a_damaged_file_it_reads(output: Path, capsys):
    # Its own readers (the run table, the index, rows of recordings whose audio was kept)
    # met a damaged file with a traceback.
    damaged = output / "run_table" / PARTITION / "part-night-1.parquet"
    damaged.parent.mkdir(parents=True)
    damaged.write_bytes(b"PAR1")
    assert main(["vacuum", str(output), "--older-than", "1d"]) == 4
    err = capsys.readouterr().err
    assert damaged.name in err and "Traceback" not in err
    assert _part(output).exists()  # nothing removed
