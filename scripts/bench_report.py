#!/usr/bin/env python
"""The report's aggregation, DuckDB (jobs/ops/report/aggregate.py) against the former Python
loops over every ledger row, on the history bench_history.py builds. The former loops are read
from git history (``legacy_report``: jobs/ops/report/aggregate.py at LEGACY_COMMIT, the last
version before the DuckDB rewrite), so a checkout without that commit (a shallow clone, no git)
cannot run this benchmark and says so.

1. History: ``--nights`` nights of ``--items`` transcripts each, committed and priced by the
   job's own code (``bench_history.write_history``): 3 ledger rows an item (fetch, decode,
   transcribe), written without ``model_stage``/``work``, so the legacy role fallback runs too.
2. Each variant in a child process of its own (``load`` + ``build_report``), variants taking
   turns ``--repeats`` times: wall seconds and peak memory (``ru_maxrss`` of the child, which
   includes the interpreter and its imports: ``baseline`` is a child that only imports).
   Two scopes: the whole history (``--by day``), and one night (``--since``/``--until`` the
   last night: partition pruning reads 1 of ``--nights`` partitions).
3. The tables of both variants are compared: they must be equal, float for float.

    python scripts/bench_report.py --nights 3 --items 20000       # a minute
    python scripts/bench_report.py                                 # 30 x 100,000: long, ~15 GB
    python scripts/bench_report.py --history DIR --keep            # build once, rerun later
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

# The report's aggregation before #38 (Python loops over every ledger row): the last commit
# before the DuckDB rewrite (e5d1ee0) that changed jobs/ops/report/aggregate.py.
LEGACY_COMMIT = "34280202a297d4614d68d72c56146f5716e4bafd"
LEGACY_PATH = "jobs/ops/report/aggregate.py"
# Its imports as today's package spells them: fc276bf made the committed-dataset functions
# methods of CommittedDataset.
LEGACY_IMPORTS = {
    "from overnight.jobs.dataset.commits import PARTITION, read_results\n": (
        "from overnight.jobs.dataset.commits import PARTITION, CommittedDataset\n\n\n"
        "def read_results(location, columns, dates=None):\n"
        "    return CommittedDataset(location).read_results(columns, dates=dates)\n"
    ),
}


class LegacyUnavailable(RuntimeError):
    """The former implementation cannot be read from this checkout's history."""


def legacy_source(repo: Path = REPO) -> str:
    """The former aggregate.py at LEGACY_COMMIT, its imports adapted to today's package."""
    where = f"{LEGACY_COMMIT[:7]}:{LEGACY_PATH}"
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), "show", f"{LEGACY_COMMIT}:{LEGACY_PATH}"],
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError:
        raise LegacyUnavailable(f"no git to read the former report ({where})") from None
    if done.returncode != 0:
        raise LegacyUnavailable(
            f"the former report ({where}) is not in this checkout's history "
            f"({done.stderr.strip().splitlines()[-1] if done.stderr.strip() else 'git failed'});"
            " a full clone has it (git fetch --unshallow)"
        )
    text = done.stdout
    for old, new in LEGACY_IMPORTS.items():
        if old not in text:
            raise LegacyUnavailable(f"{where} no longer imports {old.strip()!r}")
        text = text.replace(old, new)
    return text


def legacy_report(repo: Path = REPO) -> types.ModuleType:
    """The former aggregation as a module (``load``, ``build_report``), loaded from git."""
    text = legacy_source(repo)
    module = types.ModuleType("report_legacy", "the report's aggregation before #38")
    module.__file__ = f"{LEGACY_COMMIT[:7]}:{LEGACY_PATH}"
    sys.modules["report_legacy"] = module  # dataclasses look their module up
    exec(compile(text, module.__file__, "exec"), module.__dict__)
    return module


def child(variant: str, history: str, since: str | None, until: str | None, dump: str) -> None:
    """One report in this process; prints seconds and peak RSS as JSON."""
    from overnight.jobs.ops.report import parse_since, parse_until

    impl: types.ModuleType
    if variant == "new":
        from overnight.jobs.ops.report import aggregate as impl
    elif variant == "old":
        impl = legacy_report()
    else:  # baseline: the imports only
        legacy_report()
        from overnight.jobs.ops.report import aggregate as impl

        print(json.dumps({"seconds": 0.0, "max_rss_mb": _rss_mb()}))
        return
    start, end = parse_since(since), parse_until(until)
    started = time.perf_counter()
    report = impl.build_report(impl.load([history], start, end), "day", start, end)
    seconds = time.perf_counter() - started
    if dump:
        # ``sources`` is newer than the loops (tests/jobs/ops/test_report.py checks it).
        tables = {
            name: (t.drop_columns(["sources"]) if "sources" in t.column_names else t).to_pylist()
            for name, t in report.tables.items()
        }
        Path(dump).write_text(json.dumps(tables, default=str, sort_keys=True))
    print(json.dumps({"seconds": seconds, "max_rss_mb": _rss_mb()}))


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def run_child(
    variant: str, history: Path, scope: dict, dump: Path | None, limit_gb: float | None = None
) -> dict:
    cmd = [sys.executable, __file__, "--child", variant, "--history", str(history)]
    for flag in ("since", "until"):
        if scope.get(flag):
            cmd += [f"--{flag}", scope[flag]]
    if dump is not None:
        cmd += ["--dump", str(dump)]

    def cap() -> None:  # a child over the limit fails alone instead of the machine swapping
        if limit_gb:
            size = int(limit_gb * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (size, size))

    done = subprocess.run(cmd, capture_output=True, text=True, check=False, preexec_fn=cap)
    if done.returncode != 0:
        raise SystemExit(f"{variant} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--nights", type=int, default=30)
    ap.add_argument("--items", type=int, default=100_000, help="items per night")
    ap.add_argument("--rows-per-commit", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=3, help="turns of old and new")
    ap.add_argument("--history", help="build the history here (or reuse it if it exists)")
    ap.add_argument("--keep", action="store_true", help="keep the history folder")
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--limit-gb", type=float, help="address-space limit of each child")
    ap.add_argument("--child", choices=["old", "new", "baseline"], help=argparse.SUPPRESS)
    ap.add_argument("--since", help=argparse.SUPPRESS)
    ap.add_argument("--until", help=argparse.SUPPRESS)
    ap.add_argument("--dump", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.history, args.since, args.until, args.dump)
        return {}

    try:
        legacy_source()
    except LegacyUnavailable as exc:
        raise SystemExit(f"bench_report: nothing to compare against: {exc}") from None

    import bench_history  # type: ignore[import-not-found]

    from overnight.jobs.dataset import storage

    work = Path(tempfile.mkdtemp(prefix="bench-report-"))
    history = Path(args.history) if args.history else work / "history"
    figures: dict = {"nights": args.nights, "items_per_night": args.items}
    try:
        if not (history / "costs").is_dir():
            started = time.perf_counter()
            bench_history.write_history(
                storage.resolve(str(history)), args.nights, args.items, args.rows_per_commit
            )
            figures["write_history_s"] = round(time.perf_counter() - started, 1)
        last = bench_history.FIRST_NIGHT + timedelta(days=args.nights - 1)
        scopes = {"all": {}, "one_night": {"since": str(last), "until": str(last)}}
        figures["baseline_rss_mb"] = round(
            run_child("baseline", history, {}, None)["max_rss_mb"], 1
        )
        for name, scope in scopes.items():
            runs: dict[str, list[dict]] = {"old": [], "new": []}
            for turn in range(args.repeats):
                for variant in ("old", "new") if turn % 2 == 0 else ("new", "old"):
                    dump = work / f"{name}-{variant}.json" if turn == 0 else None
                    got = run_child(variant, history, scope, dump, args.limit_gb)
                    runs[variant].append(got)
                    print(f"  {name} {variant}: {got}", file=sys.stderr, flush=True)
            old_tables = (work / f"{name}-old.json").read_text()
            same = old_tables == (work / f"{name}-new.json").read_text()
            row: dict = {"tables_equal": same}
            for variant, got in runs.items():
                seconds = [g["seconds"] for g in got]
                rss = [g["max_rss_mb"] for g in got]
                row[variant] = {
                    "seconds_median": round(statistics.median(seconds), 2),
                    "seconds_range": [round(min(seconds), 2), round(max(seconds), 2)],
                    "max_rss_mb_median": round(statistics.median(rss), 1),
                    "max_rss_mb_range": [round(min(rss), 1), round(max(rss), 1)],
                }
            row["time_ratio_old_over_new"] = round(
                row["old"]["seconds_median"] / row["new"]["seconds_median"], 1
            )
            row["memory_ratio_old_over_new"] = round(
                row["old"]["max_rss_mb_median"] / row["new"]["max_rss_mb_median"], 1
            )
            figures[name] = row
            if not same:
                print(f"{name}: the tables differ", file=sys.stderr)
        print(json.dumps(figures, indent=2))
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=2))
        return figures
    finally:
        if args.keep:
            print(f"history kept in {history}", file=sys.stderr)
        elif args.history is None:
            shutil.rmtree(work, ignore_errors=True)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
