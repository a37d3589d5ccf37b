#!/usr/bin/env python
"""Plain Parquet plus overnight's done-index against a Delta Lake table, on one synthetic
history (``bench_history.night_rows``), on local disk. For the README's table-format choice.

For each layout: writing the nights (commits of ``--rows-per-commit`` rows, then overnight's
publish or Delta's ``optimize.compact``), the resume check of a new night (which of
``--new`` new ids plus as many old ones are done), DuckDB's "one day's cost per audio
minute" (Delta: through ``DeltaTable.to_pyarrow_dataset``, DuckDB's delta extension needs a
download), and the files a night leaves. Needs ``pip install deltalake`` (not a dependency).

    python scripts/bench_delta.py --nights 30 --items 100000
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import bench_history as bh  # noqa: E402

from overnight.jobs.dataset import commits, storage  # noqa: E402


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return round(statistics.median(times), 4)


def ours(root: Path, args, probe: list[str]) -> dict:
    output = storage.resolve(str(root))
    write_s = bh.write_history(output, args.nights, args.items, args.rows_per_commit)
    dataset = output.join("transcripts")
    found = commits.CommittedDataset(dataset).committed_ids(among=probe)
    resume_s = median_time(
        lambda: commits.CommittedDataset(dataset).committed_ids(among=probe), args.repeats
    )
    day = bh.FIRST_NIGHT
    query_s = bh.duckdb_day_query(root, day, args.repeats)["pruned_s"]
    files = sum(1 for p in root.rglob("*.parquet"))
    return {
        "write_s": round(write_s, 1),
        "resume_check_s": resume_s,
        "found": len(found),
        "duckdb_day_s": query_s,
        "files_total": files,
        "files_per_night": bh.files_per_night(root),
    }


def delta(root: Path, args, probe: list[str]) -> dict:
    import duckdb
    from deltalake import DeltaTable, write_deltalake

    path = str(root / "transcripts")
    costs_path = str(root / "costs")
    started = time.perf_counter()
    for k in range(args.nights):
        night = bh.FIRST_NIGHT + timedelta(days=k)
        rows = bh.night_rows(night, args.items, seed=k)
        rows = rows.append_column("run_date", pa.array([night] * rows.num_rows, pa.date32()))
        for i in range(0, rows.num_rows, args.rows_per_commit):
            write_deltalake(
                path, rows.slice(i, args.rows_per_commit), mode="append", partition_by=["run_date"]
            )
        _, costs = bh.price(storage.resolve(str(root)), night)(rows.drop_columns(["run_date"]))
        costs = costs.append_column("run_date", pa.array([night] * costs.num_rows, pa.date32()))
        write_deltalake(costs_path, costs, mode="append", partition_by=["run_date"])
        DeltaTable(path).optimize.compact(partition_filters=[("run_date", "=", str(night))])
        print(f"  delta night {k + 1}/{args.nights}", file=sys.stderr, flush=True)
    DeltaTable(path).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    write_s = time.perf_counter() - started

    def resume() -> set[str]:
        ds = DeltaTable(path).to_pyarrow_dataset()
        got = ds.to_table(columns=["item_id"], filter=pads.field("item_id").isin(probe))
        return set(got["item_id"].to_pylist())

    found = resume()
    resume_s = median_time(resume, args.repeats)
    con = duckdb.connect()
    day = bh.FIRST_NIGHT
    con.register("costs_ds", DeltaTable(costs_path).to_pyarrow_dataset())
    sql = (
        "select sum(cost_usd) / (sum(audio_s) filter (where stage = 'transcribe') / 60) "
        f"from costs_ds where run_date = DATE '{day}'"
    )
    query_s = median_time(lambda: con.execute(sql).fetchone(), args.repeats)
    live = DeltaTable(path).file_uris()
    return {
        "write_s": round(write_s, 1),
        "resume_check_s": resume_s,
        "found": len(found),
        "duckdb_day_s": query_s,
        "files_total": sum(1 for _ in root.rglob("*.parquet"))
        + sum(1 for _ in root.rglob("*.json")),
        "live_files_per_night": len(live) / args.nights,
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--nights", type=int, default=30)
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--rows-per-commit", type=int, default=10_000)
    ap.add_argument("--new", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-delta-"))
    try:
        old = bh.night_rows(bh.FIRST_NIGHT, args.items, seed=0)["item_id"].to_pylist()
        probe = random.Random(0).sample(old, args.new) + [f"new-{i}" for i in range(args.new)]
        figures = {
            "nights": args.nights,
            "items_per_night": args.items,
            "rows_per_commit": args.rows_per_commit,
            "parquet_and_index": ours(work / "ours", args, probe),
            "delta": delta(work / "delta", args, probe),
        }
        print(json.dumps(figures, indent=2))
        return figures
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
