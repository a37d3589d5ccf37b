#!/usr/bin/env python
"""Does a year of nights slow the next night down? A synthetic history, then a new night.

1. History: ``--nights`` nights of ``--items`` schema-valid transcript rows each (no model:
   rows generated with pyarrow), committed the way the job commits them (files in the run's
   staging folder, ``--rows-per-commit`` rows each; the job's actors write about 8) and then
   published by ``jobs.dataset.commits.publish``, the job's own code path: compacted into
   ``transcripts/run_date=<night>/``, priced into ``costs/`` and added to the done-index.
2. A new night of ``--new`` recordings (tiny files, never decoded), on an empty OUTPUT and on
   the OUTPUT with the history, taking turns ``--repeats`` times, on local disk and on a moto
   S3 server on loopback (the history is copied there object by object). What is timed is
   the job from its start up to what Ray gets: ``TranscribeJob.prepare`` (input listing),
   ``runner.claim_and_subtract`` (claim, publish of leftovers, the done-index lookup of this
   input's ids) and the manifest write. Ray's start and the model load come after and do not
   depend on the history.
3. The file count per night, and DuckDB's time for one day's cost per audio minute, with
   partition pruning (``where run_date = ...``) and without (the same day by ``recorded_at``,
   a file column: every file is opened).

    python scripts/bench_history.py                          # 30 x 100,000, a few minutes
    python scripts/bench_history.py --nights 3 --items 2000 --new 50 --repeats 1 --no-s3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from overnight.jobs.dataset import commits, storage  # noqa: E402
from overnight.jobs.dataset.manifest import write_manifest  # noqa: E402
from overnight.jobs.run import runner  # noqa: E402
from overnight.schemas import COSTS, TRANSCRIPTS  # noqa: E402

PRICES = {"cpu": 0.05, "gpu": 2.5}
TENANTS = ["acme", "globex", "initech", None]
FIRST_NIGHT = date(2026, 1, 1)


def night_rows(night: date, n: int, seed: int) -> pa.Table:
    """``n`` transcript rows of one night: every column of the schema, the ones the ledger
    and reports read filled in, the rest null."""
    rng = np.random.default_rng(seed)
    hexes = rng.bytes(16 * n).hex()
    ids = [hexes[32 * i : 32 * i + 32] for i in range(n)]
    duration = rng.uniform(30, 600, n)
    cols = {f.name: pa.nulls(n, f.type) for f in TRANSCRIPTS}
    stamp = datetime(night.year, night.month, night.day, 3, tzinfo=UTC)
    cols.update(
        item_id=pa.array(ids, pa.string()),
        source_uri=pa.array([f"s3://calls/{night}/{i}.wav" for i in ids], pa.string()),
        status=pa.array(["ok"] * n, pa.string()),
        run_id=pa.array([f"night-{night}"] * n, pa.string()),
        tenant=pa.array([TENANTS[k] for k in rng.integers(0, len(TENANTS), n)], pa.string()),
        duration_s=pa.array(duration),
        text=pa.array(["thanks for calling, how can I help"] * n, pa.string()),
        fetch_s=pa.array(duration * 0.001),
        decode_s=pa.array(duration * 0.004),
        asr_s=pa.array(duration * 0.01),
        decode_resource=pa.array(["cpu"] * n, pa.string()),
        asr_resource=pa.array(["gpu"] * n, pa.string()),
        asr_units=pa.array([1.0] * n),
        processed_at=pa.array([stamp] * n, pa.timestamp("us", tz="UTC")),
    )
    return pa.table({f.name: cols[f.name] for f in TRANSCRIPTS}, schema=TRANSCRIPTS)


def price(output: storage.Location, night: date):
    """The ledger rows ``ledger.build_ledger`` would write for these rows (fetch, decode,
    transcribe), built with pyarrow: per-row Python would dominate the history's writing."""

    def derive(rows: pa.Table) -> tuple[storage.Location, pa.Table]:
        n = rows.num_rows
        at = datetime(night.year, night.month, night.day, 4, tzinfo=UTC)  # the night's end
        parts = []
        for stage, seconds, resource in (
            ("fetch", "fetch_s", "decode_resource"),
            ("decode", "decode_s", "decode_resource"),
            ("transcribe", "asr_s", "asr_resource"),
        ):
            hourly = PRICES[rows[resource][0].as_py()]
            cols = {f.name: pa.nulls(n, f.type) for f in COSTS}
            cols.update(
                item_id=rows["item_id"],
                run_id=rows["run_id"],
                tenant=rows["tenant"],
                stage=pa.array([stage] * n, pa.string()),
                resource=rows[resource],
                units=pa.array([1.0] * n),
                seconds=rows[seconds],
                price_per_hour_usd=pa.array([hourly] * n),
                cost_usd=pc.multiply(rows[seconds], hourly / 3600.0),
                audio_s=rows["duration_s"],
                recorded_at=pa.array([at] * n, COSTS.field("recorded_at").type),
            )
            parts.append(pa.table({f.name: cols[f.name] for f in COSTS}, schema=COSTS))
        return output.join("costs"), pa.concat_tables(parts)

    return derive


def write_history(output: storage.Location, nights: int, items: int, per_commit: int) -> float:
    dataset = output.join("transcripts")
    started = time.perf_counter()
    for k in range(nights):
        night = FIRST_NIGHT + timedelta(days=k)
        run_id = f"night-{night}"
        rows = night_rows(night, items, seed=k)
        staged = commits.CommittedDataset(dataset).staging_dir(night, run_id)
        chunks = [rows.slice(i, per_commit) for i in range(0, items, per_commit)]
        storage.map_threads(commits.CommittedDataset(staged).write_table, chunks)
        commits.CommittedDataset(dataset).publish(TRANSCRIPTS, run_id, price(output, night))
        print(f"  night {k + 1}/{nights} written", file=sys.stderr, flush=True)
    return time.perf_counter() - started


def files_per_night(root: Path) -> dict[str, int]:
    counts = {}
    for name in ("transcripts", "costs"):
        per = [len(list(d.glob("*.parquet"))) for d in sorted((root / name).glob("run_date=*"))]
        counts[name] = sorted(set(per))
    counts["index_files"] = len(list((root / "_index").glob("**/*.parquet")))
    return counts


def make_input(folder: Path, n: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (folder / f"new_{i:05d}.wav").write_bytes(b"RIFF" + i.to_bytes(4, "little"))


def time_new_night(input_url: str, output_url: str, new_night: date) -> dict[str, float]:
    from overnight.jobs.spec import build_spec
    from overnight.jobs.transcribe import TranscribeJob

    spec = build_spec(
        overrides={
            "job": {
                "input": input_url,
                "output": output_url,
                "progress": False,
                "run_date": new_night.isoformat(),
            }
        }
    )
    t0 = time.perf_counter()
    job = TranscribeJob(spec)
    prepared = job.prepare(dry=False)
    t1 = time.perf_counter()
    claimed = runner.claim_and_subtract(job, prepared)
    t2 = time.perf_counter()
    table = pa.Table.from_pylist(claimed.pending, schema=job.manifest_schema)
    write_manifest(storage.resolve(output_url), job.run_id, table)
    t3 = time.perf_counter()
    if len(claimed.pending) != len(prepared.records):
        raise RuntimeError("the new night's recordings were taken as done")
    return {
        "list_s": t1 - t0,
        "claim_subtract_s": t2 - t1,
        "manifest_s": t3 - t2,
        "total_s": t3 - t0,
    }


def take_turns(input_url: str, outputs: dict[str, str], new_night: date, repeats: int) -> dict:
    times: dict[str, list[dict[str, float]]] = {name: [] for name in outputs}
    for _ in range(repeats):
        for name, url in outputs.items():
            times[name].append(time_new_night(input_url, url, new_night))
    out = {}
    for name, runs in times.items():
        totals = [r["total_s"] for r in runs]
        out[name] = {
            "median_s": round(statistics.median(totals), 3),
            "min_s": round(min(totals), 3),
            "max_s": round(max(totals), 3),
            "median_claim_subtract_s": round(
                statistics.median(r["claim_subtract_s"] for r in runs), 3
            ),
        }
    out["history_adds_s"] = round(out["history"]["median_s"] - out["empty"]["median_s"], 3)
    return out


def duckdb_day_query(root: Path, day: date, repeats: int) -> dict[str, float]:
    import duckdb

    con = duckdb.connect()
    src = f"read_parquet('{root}/costs/*/*.parquet', hive_partitioning = true)"
    per_minute = "sum(cost_usd) / (sum(audio_s) filter (where stage = 'transcribe') / 60)"
    queries = {
        "pruned": f"select {per_minute} from {src} where run_date = DATE '{day}'",
        "unpruned": f"select {per_minute} from {src} where cast(recorded_at as date) = DATE '{day}'",
    }
    out = {}
    for name, sql in queries.items():
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            con.execute(sql).fetchone()
            times.append(time.perf_counter() - t)
        out[f"{name}_s"] = round(statistics.median(times), 4)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def copy_to_s3(client, bucket: str, root: Path, prefix: str) -> int:
    files = [p for p in root.rglob("*") if p.is_file()]

    def put(path: Path) -> None:
        key = f"{prefix}/{path.relative_to(root).as_posix()}"
        client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())

    storage.map_threads(put, files)
    return len(files)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--nights", type=int, default=30)
    ap.add_argument("--items", type=int, default=100_000, help="items per night")
    ap.add_argument("--new", type=int, default=1000, help="recordings of the new night")
    ap.add_argument("--rows-per-commit", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3, help="turns of empty vs history")
    ap.add_argument("--no-s3", action="store_true", help="local disk only")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="bench-history-"))
    try:
        history = work / "history"
        new_night = FIRST_NIGHT + timedelta(days=args.nights)
        figures: dict = {"nights": args.nights, "items_per_night": args.items, "new": args.new}
        figures["write_history_s"] = round(
            write_history(
                storage.resolve(str(history)), args.nights, args.items, args.rows_per_commit
            ),
            1,
        )
        figures["files_per_night"] = files_per_night(history)
        figures["duckdb_one_day"] = duckdb_day_query(history, FIRST_NIGHT, max(args.repeats, 3))
        make_input(work / "in", args.new)
        # A copy for the S3 side, before the local runs add claims and manifests.
        pristine = work / "pristine"
        if not args.no_s3:
            shutil.copytree(history, pristine)
        figures["local"] = take_turns(
            str(work / "in"),
            {"empty": str(work / "empty"), "history": str(history)},
            new_night,
            args.repeats,
        )
        if not args.no_s3:
            figures["moto"] = bench_s3(work, pristine, new_night, args.repeats, args.new)
        print(json.dumps(figures, indent=2))
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=2))
        return figures
    finally:
        shutil.rmtree(work, ignore_errors=True)


def bench_s3(work: Path, history: Path, new_night: date, repeats: int, new: int) -> dict:
    import boto3
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    env = {
        "AWS_ACCESS_KEY_ID": "AKIABENCHHISTORY0000",
        "AWS_SECRET_ACCESS_KEY": "bench-history-secret",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1")
        for bucket in ("bench-in", "bench-out"):
            client.create_bucket(Bucket=bucket)
        storage.map_threads(
            lambda i: client.put_object(
                Bucket="bench-in", Key=f"night/new_{i:05d}.wav", Body=b"RIFF"
            ),
            range(new),
        )
        copied = copy_to_s3(client, "bench-out", history, "history")
        result = take_turns(
            "s3://bench-in/night/",
            {"empty": "s3://bench-out/empty", "history": "s3://bench-out/history"},
            new_night,
            repeats,
        )
        result["objects_copied"] = copied
        return result
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


if __name__ == "__main__":
    main()
