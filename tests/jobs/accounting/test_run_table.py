"""Specifications for the run table: one row per run under OUTPUT/run_table/run_date=.../,
read and pruned by date with the stock readers of DuckDB, Polars, pandas and pyarrow."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from pathlib import Path

import duckdb
import pandas as pd
import polars as pl
import pyarrow.dataset as pads
import pytest

from overnight.jobs.accounting.ledger import write_summary
from overnight.jobs.dataset import storage

DAYS = [date(2026, 11, 30), date(2026, 12, 1), date(2026, 12, 2)]


def _summary(run_id: str, cost: float) -> dict:
    return {
        "run_id": run_id,
        "kind": "transcribe",
        "finished_at": datetime.now(UTC).isoformat(),
        "output": "s3://acme-out/nightly",
        "items_listed": 10,
        "items_already_done": 0,
        "items": 10,
        "succeeded": 9,
        "failed": 1,
        "audio_seconds": 600.0,
        "wall_seconds": 42.0,
        "accelerator": "cpu",
        "device": "cpu",
        "cost_usd": cost,
        "reserved_cost_usd": cost * 2,
        "errors_by_code": {"decode_failed": 1},
    }


@pytest.fixture
def output(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    loc = storage.resolve(str(out))
    for n, day in enumerate(DAYS):
        for k in range(2):
            write_summary(loc, _summary(f"run-{n}-{k}", cost=1.0 + n), run_date=day)
    return out


def test_each_run_is_one_row_under_its_date_and_its_json_beside(output: Path):
    parts = sorted(p.name for p in (output / "run_table").iterdir())
    assert parts == [f"run_date={d.isoformat()}" for d in DAYS]
    assert len(list((output / "runs").glob("*.json"))) == 6


def test_a_rerun_of_the_same_run_id_replaces_its_row(output: Path):
    write_summary(storage.resolve(str(output)), _summary("run-2-0", cost=9.0), run_date=DAYS[2])
    t = pads.dataset(str(output / "run_table"), format="parquet", partitioning="hive").to_table()
    assert t.num_rows == 6
    [row] = [r for r in t.to_pylist() if r["run_id"] == "run-2-0"]
    assert row["cost_usd"] == 9.0 and json.loads(row["summary_json"])["cost_usd"] == 9.0


def test_stock_readers_filter_on_the_partition_column(output: Path):
    glob = str(output / "run_table" / "*" / "*.parquet")
    day = "2026-12-01"
    con = duckdb.connect()
    rows = con.execute(
        f"select run_id, cost_usd from read_parquet('{glob}', hive_partitioning=true) "
        f"where run_date = '{day}' order by run_id"
    ).fetchall()
    assert rows == [("run-1-0", 2.0), ("run-1-1", 2.0)]
    plan = con.execute(
        f"explain analyze select count(*) from read_parquet('{glob}', hive_partitioning=true) "
        f"where run_date = '{day}'"
    ).fetchall()[0][1]
    assert "Scanning Files: 2/6" in plan  # pruned by the path: one day's two files of six

    frame = (
        pl.scan_parquet(glob, hive_partitioning=True)
        .filter(pl.col("run_date").cast(pl.Utf8) == day)
        .collect()
    )
    assert sorted(frame["run_id"].to_list()) == ["run-1-0", "run-1-1"]

    pdf = pd.read_parquet(output / "run_table", filters=[("run_date", "=", day)])
    assert sorted(pdf["run_id"]) == ["run-1-0", "run-1-1"]

    ds = pads.dataset(str(output / "run_table"), format="parquet", partitioning="hive")
    picked = ds.to_table(filter=pads.field("run_date") == day)
    assert sorted(picked.column("run_id").to_pylist()) == ["run-1-0", "run-1-1"]
    assert picked.column("cost_usd").to_pylist() == [2.0, 2.0]
