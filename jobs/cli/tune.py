"""``overnight tune``: measure a grid on a sample, pick the cheapest configuration for an SLA."""

from __future__ import annotations

import argparse

from overnight.jobs.choices import DEFAULT_TUNE_BUDGET, TUNE_KINDS
from overnight.jobs.errors import EXIT_NO_OPTION_MEETS_SLA


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "tune",
        help="measure a grid of configurations on a sample; pick the cheapest that meets an SLA",
        description="Run a grid of configurations on a sample of the real workload, measure throughput, "
        "accuracy and cost, and write the cheapest one meeting the SLA as a job spec plus a profile for plan.",
    )
    p.add_argument(
        "sample",
        help="folder, prefix or manifest of sample recordings (references alongside, optional)",
    )
    p.add_argument(
        "--kind",
        choices=TUNE_KINDS,
        default="transcribe",
        help="the job kind tuned (default: transcribe)",
    )
    # The flag's name until 2026-12: --task also names Whisper's and the LLM's tasks.
    p.add_argument("--task", dest="kind", choices=TUNE_KINDS, help=argparse.SUPPRESS)
    p.add_argument(
        "--sla",
        required=True,
        help='e.g. "deadline=6h,backlog_hours=2000,max_wer_increase=0.01[,max_workers=8,headroom=0.2]"',
    )
    p.add_argument("--grid", help="grid file (TOML/YAML/JSON: base, grid, configs)")
    p.add_argument(
        "--budget",
        default=DEFAULT_TUNE_BUDGET,
        help=f"time budget of the tuning (default {DEFAULT_TUNE_BUDGET})",
    )
    p.add_argument(
        "--config", help="the job file to tune (its [transcribe] and [prices] are the base)"
    )
    p.add_argument("--references", help="reference transcripts (tsv: name TAB text, or jsonl)")
    p.add_argument("--max-items", type=int, help="use at most this many recordings of the sample")
    p.add_argument(
        "--out",
        help="folder for chosen.toml, profile.json, measurements.json and each run's output; "
        "rerunning into it resumes the same tuning (configurations measured before are reused)",
    )
    p.add_argument("--address", help="Ray cluster address (default: start Ray locally)")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    import sys
    from datetime import UTC, datetime

    from overnight.jobs.ops.plan import parse_duration
    from overnight.jobs.ops.tune import parse_sla, read_grid, render, tune
    from overnight.jobs.ops.tune.orchestrate import check_max_items
    from overnight.jobs.run.console import quiet_native_stderr
    from overnight.jobs.spec import read_job_file

    # Every flag and file is read and checked before Ray starts or anything is measured.
    sla = parse_sla(args.sla, args.kind)
    check_max_items(args.max_items)
    grid = read_grid(args.grid) if args.grid else None
    budget_s = parse_duration(args.budget, "--budget")
    base = read_job_file(args.config) if args.config else None
    out = args.out or f"tune-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
    # Each measurement is a job: the same terminal as `overnight transcribe` (Ray's C++
    # notices stay in its session logs).
    with quiet_native_stderr():
        result = tune(
            args.sample,
            sla,
            kind=args.kind,
            grid=grid,
            budget_s=budget_s,
            out=out,
            base=base,
            references=args.references,
            max_items=args.max_items,
            address=args.address,
            echo=lambda line: print(line, file=sys.stderr, flush=True),
        )
    print(render(result))
    return 0 if result.decision.chosen is not None else EXIT_NO_OPTION_MEETS_SLA
