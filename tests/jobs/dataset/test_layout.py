"""The partitioned, compacted output: what stock readers see, a publish killed half way,
and recordings submitted again on a later night."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, date, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from overnight.jobs.dataset import commits, storage
from overnight.jobs.errors import InputNotFound
from overnight.jobs.spec import build_spec
from overnight.jobs.transcribe import run_transcribe
from overnight.schemas import TRANSCRIPTS
from tests.conftest import REPO

pytestmark = pytest.mark.usefixtures("ray_local")


def transcribe(input_: str, output: str, run_date: str, **options):
    spec = build_spec(
        overrides={
            "job": {"input": input_, "output": output, "progress": False, "run_date": run_date},
            "transcribe": options,
        }
    )
    return run_transcribe(spec)


def visible(output: Path, name: str = "transcripts") -> list[str]:
    """Item ids as a stock reader sees them (pyarrow, hive partitioning)."""
    if not (output / name).exists():
        return []
    ds = pads.dataset(str(output / name), format="parquet", partitioning="hive")
    return ds.to_table(columns=["item_id"]).column("item_id").to_pylist()


@pytest.fixture(scope="module")
def two_nights(synth_calls, tmp_path_factory, ray_local):
    """Night one transcribes all but one call; night two gets every call again (the same
    recordings, submitted again) plus the one left out."""
    folder, refs = synth_calls
    root = tmp_path_factory.mktemp("nights")
    first = root / "first"
    first.mkdir()
    names = sorted(refs)
    for name in names[:-1]:
        os.link(folder / name, first / name)
    os.link(folder / names[-1], root / names[-1])
    out = root / "out"
    one = transcribe(str(first), str(out), "2026-11-01")
    os.link(root / names[-1], first / names[-1])
    two = transcribe(str(first), str(out), "2026-11-02")
    return out, refs, one, two


def test_the_same_recordings_on_a_later_night_are_recognised_as_done(two_nights):
    out, refs, one, two = two_nights
    assert one["items"] == len(refs) - 1
    assert two["items"] == 1 and two["items_already_done"] == len(refs) - 1
    ids = visible(out)
    assert len(ids) == len(set(ids)) == len(refs)
    days = pads.dataset(str(out / "transcripts"), partitioning="hive").to_table()
    per_day = days.group_by("run_date").aggregate([("item_id", "count")]).to_pylist()
    assert sorted((str(r["run_date"]), r["item_id_count"]) for r in per_day) == [
        ("2026-11-01", len(refs) - 1),
        ("2026-11-02", 1),
    ]
    # One compacted file per night, and nothing left staged.
    assert len(list((out / "transcripts").glob("run_date=*/*.parquet"))) == 2
    assert not list((out / "_staging").glob("**/*.parquet"))


def test_stock_readers_read_the_partitions_and_filter_on_run_date(two_nights):
    import duckdb
    import pandas as pd
    import polars as pl

    out, refs, _, _ = two_nights
    path = out / "transcripts"
    day = "2026-11-01"
    n = len(refs) - 1

    table = pads.dataset(str(path), partitioning="hive").to_table(
        filter=pads.field("run_date") == day
    )
    assert table.num_rows == n
    assert (
        table.drop_columns(["run_date"])
        .schema.remove_metadata()
        .equals(TRANSCRIPTS.remove_metadata())
    )
    assert len(pd.read_parquet(path, filters=[("run_date", "=", day)])) == n
    got = (
        pl.scan_parquet(str(path), hive_partitioning=True)
        .filter(pl.col("run_date") == date(2026, 11, 1))
        .select(pl.len())
        .collect()
        .item()
    )
    assert got == n
    con = duckdb.connect()
    count, minutes = con.execute(
        f"select count(*), sum(duration_s) / 60 from read_parquet('{path}/*/*.parquet', "
        f"hive_partitioning = true) where run_date = DATE '{day}'"
    ).fetchone()
    assert count == n and minutes > 0
    cost = con.execute(
        f"select sum(cost_usd) / (sum(audio_s) filter (where stage = 'transcribe') / 60) "
        f"from read_parquet('{out}/costs/*/*.parquet', hive_partitioning = true) "
        f"where run_date = DATE '{day}'"
    ).fetchone()[0]
    assert cost > 0


def test_a_file_replaced_in_place_is_never_read_twice_by_a_stock_reader(tmp_path, monkeypatch):
    """A publish that a killed run left half done is redone under the same file names. At the
    moment a rewritten file is complete but not yet renamed into place, a reader listing the
    partition (pyarrow, DuckDB or Polars) must see each row once: a suite run caught a
    reader seeing every item twice there."""
    out = tmp_path / "out"
    loc = storage.resolve(str(out / "transcripts" / "run_date=2026-12-04" / "part-a.parquet"))
    buf = io.BytesIO()
    pq.write_table(pa.table({"item_id": ["x", "y"]}), buf)
    storage.write_bytes_atomic(loc, buf.getvalue())
    seen: list[list[str]] = []
    rename = os.replace

    def replace(src: str, dst: str) -> None:
        seen.append(visible(out))  # the temporary file written, the rename not yet done
        rename(src, dst)

    monkeypatch.setattr(storage.os, "replace", replace)
    storage.write_bytes_atomic(loc, buf.getvalue())
    assert seen == [["x", "y"]]
    assert visible(out) == ["x", "y"]


@pytest.mark.skipif(not shutil.which("espeak-ng"), reason="espeak-ng not installed")
def test_a_run_killed_while_publishing_is_finished_by_the_next_without_a_row_twice(
    synth_calls, tmp_path
):
    folder, refs = synth_calls
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "overnight.jobs.cli", "transcribe", str(folder), str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO), commits._FAULT_ENV: "1"}
    proc = subprocess.Popen(
        [*cmd, "--quiet"],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        with_group_gone(proc.pid)
    assert proc.returncode == 70, err[-2000:]
    # Killed after writing the compacted file, before deleting what it compacted: both are
    # there, and a reader sees each item once.
    staged = list((out / "_staging" / "transcripts").glob("*/*/part-*.parquet"))
    assert staged and list((out / "_staging" / "transcripts").glob("*/*.publish.json"))
    seen = visible(out)
    assert len(seen) == len(set(seen)) == len(refs)

    # The next run finishes the publish first; a reader polling meanwhile never sees an item
    # twice nor loses one it saw.
    polls: list[list[str]] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            try:
                polls.append(visible(out))
            except (FileNotFoundError, OSError, pa.ArrowInvalid):
                continue  # a file replaced between listing and reading: read again
            time.sleep(0.01)

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        spec = build_spec(
            overrides={"job": {"input": str(folder), "output": str(out), "progress": False}}
        )
        summary = run_transcribe(spec)
    finally:
        stop.set()
        reader.join()
    assert summary["items"] == 0 and summary["items_already_done"] == len(refs)
    assert polls
    for ids in polls:
        assert len(ids) == len(set(ids)) == len(refs)
    final = visible(out)
    assert len(final) == len(set(final)) == len(refs)
    assert not list((out / "_staging").glob("**/*.parquet"))
    costs = pads.dataset(str(out / "costs"), partitioning="hive").to_table().to_pylist()
    stages: dict[str, list[str]] = {}
    for r in costs:
        stages.setdefault(r["item_id"], []).append(r["stage"])
    assert set(stages) == set(final)
    assert all(sorted(s) == ["decode", "fetch", "transcribe"] for s in stages.values())


def with_group_gone(pgid: int) -> None:
    """The killed driver's local Ray (same process group) goes with it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def test_publish_compacts_many_small_commits_into_files_of_the_configured_size(tmp_path):
    dataset = storage.resolve(str(tmp_path / "out" / "transcripts"))
    schema = pa.schema([("item_id", pa.string()), ("run_id", pa.string()), ("tenant", pa.string())])
    staged = commits.CommittedDataset(dataset).staging_dir(date(2026, 11, 3), "run-1")
    for k in range(25):  # 25 actor calls of 8 items
        ids = [f"item-{k:02d}-{i}" for i in range(8)]
        commits.CommittedDataset(staged).write_table(
            pa.table({"item_id": ids, "run_id": ["run-1"] * 8, "tenant": ["t"] * 8}),
        )
    published = commits.CommittedDataset(dataset).publish(schema, "run-1", rows_per_file=64)
    assert published.rows == 200
    files = sorted((tmp_path / "out" / "transcripts" / "run_date=2026-11-03").glob("*.parquet"))
    assert [pq.read_metadata(f).num_rows for f in files] == [64, 64, 64, 8]
    assert commits.CommittedDataset(dataset).committed_ids(among=["item-03-1", "nope"]) == {
        "item-03-1"
    }
    assert not list((tmp_path / "out" / "_staging").glob("**/*.parquet"))


def _copy(two_nights, tmp_path: Path) -> tuple[Path, dict, dict, dict]:
    out, refs, one, two = two_nights
    shutil.copytree(out, tmp_path / "out")
    return tmp_path / "out", refs, one, two


def test_report_since_a_date_does_not_open_the_files_of_earlier_run_dates(two_nights, tmp_path):
    from overnight.jobs.ops.report import build_report, load

    out, _, _, two = _copy(two_nights, tmp_path)
    since = datetime(2026, 11, 2, tzinfo=UTC)
    for name in ("transcripts", "costs"):  # unreadable: opening one would fail the report
        (out / name / "run_date=2026-11-01" / "part-unreadable.parquet").write_bytes(b"not parquet")
    report = build_report(load([str(out)], since), by="run", since=since)
    assert [r["run"] for r in report.main.to_pylist()] == [two["run_id"]]
    assert report.totals["items"] == 1
    with pytest.raises(InputNotFound, match=r"part-unreadable\.parquet"):
        load([str(out)])  # without --since every partition is read (and named when damaged)


def test_vacuum_removes_old_nights_and_the_report_of_the_others_stays_exact(two_nights, tmp_path):
    from overnight.jobs.ops.report import build_report, load
    from overnight.jobs.ops.vacuum import vacuum

    out, refs, one, two = _copy(two_nights, tmp_path)
    kept = datetime(2026, 11, 2, tzinfo=UTC)
    expected = {
        by: build_report(load([str(out)], kept), by=by, since=kept)
        for by in ("day", "run", "tenant")
    }
    first_ids = set(visible(out)) - {r["item_id"] for r in _rows(out, "2026-11-02")}

    dry = vacuum(str(out), date(2026, 11, 2), dry_run=True)
    assert (out / "transcripts" / "run_date=2026-11-01").is_dir()  # a dry run removes nothing
    done = vacuum(str(out), date(2026, 11, 2))
    assert done.partitions == dry.partitions and len(done.partitions) == 3
    assert done.runs == [one["run_id"]] and done.index_entries == len(refs) - 1
    assert not (out / "runs" / f"{one['run_id']}.json").exists()
    assert not (out / "_manifests" / f"{one['run_id']}.parquet").exists()
    assert (out / "runs" / f"{two['run_id']}.json").exists()
    for by, before in expected.items():
        after = build_report(load([str(out)]), by=by)
        assert after.main.to_pylist() == before.main.to_pylist(), by
        assert after.totals == before.totals, by
    # The vacuumed night's recordings are forgotten: submitted again, they are new work.
    dataset = storage.resolve(str(out / "transcripts"))
    assert commits.CommittedDataset(dataset).committed_ids(among=first_ids) == set()
    assert len(visible(out)) == 1


def _rows(out: Path, day: str) -> list[dict]:
    return pq.read_table(out / "transcripts" / f"run_date={day}").to_pylist()


def test_a_long_run_publishes_as_it_goes_and_still_writes_one_row_per_item(
    synth_calls, tmp_path, monkeypatch
):
    folder, refs = synth_calls
    monkeypatch.setattr(commits, "PUBLISH_EVERY_ROWS", 2)  # "long": every 2 rows
    out = tmp_path / "out"
    summary = transcribe(str(folder), str(out), "2026-11-05", items_per_call=1, batch_size=1)
    assert summary["items"] == len(refs)
    files = list((out / "transcripts" / "run_date=2026-11-05").glob("*.parquet"))
    assert len(files) > 1  # published in several steps
    ids = visible(out)
    assert len(ids) == len(set(ids)) == len(refs)
    costs = pads.dataset(str(out / "costs"), partitioning="hive").to_table()
    keys = list(zip(costs["item_id"].to_pylist(), costs["stage"].to_pylist(), strict=True))
    assert set(costs["item_id"].to_pylist()) == set(ids) and len(keys) == len(set(keys))
    assert summary["cost_usd"] > 0


def test_report_until_a_date_does_not_open_the_files_of_later_run_dates(two_nights, tmp_path):
    from overnight.jobs.ops.report import build_report, load, parse_until

    out, _, one, _ = _copy(two_nights, tmp_path)
    for name in ("transcripts", "costs"):  # unreadable: opening one would fail the report
        (out / name / "run_date=2026-11-02" / "part-unreadable.parquet").write_bytes(b"not parquet")
    until = parse_until("2026-11-01")  # the whole day
    assert until == datetime(2026, 11, 2, tzinfo=UTC)
    # Only the partitions up to that run date are read (the rows' recorded_at is today:
    # these nights are backfills, so the window on recorded time is left open here).
    report = build_report(load([str(out)], until=until), by="run")
    assert [r["run"] for r in report.main.to_pylist()] == [one["run_id"]]
