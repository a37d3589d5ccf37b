"""``overnight report``: cost per audio minute, document and million tokens, by group."""

from __future__ import annotations

import argparse

from overnight.jobs.choices import REPORT_FORMATS, REPORT_GROUPS


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "report",
        help="cost per audio minute / document / million tokens, utilization, failures, by group",
        description="Report over the cost ledgers and run summaries of one or many outputs.",
    )
    p.add_argument(
        "outputs", nargs="+", metavar="OUTPUT", help="output folder or prefix (local, s3://, gs://)"
    )
    p.add_argument("--by", choices=REPORT_GROUPS, default="day")
    p.add_argument(
        "--since",
        help="only what was recorded since: a date (2026-12-01), a date-time, or a span (7d); "
        "partitions of earlier run dates are not read",
    )
    p.add_argument(
        "--until",
        help="only what was recorded before: a date counts whole (2026-12-01), a date-time, or "
        "a span back from now (1d); partitions of later run dates are not read",
    )
    p.add_argument("--tenant", help="only this tenant's items")
    p.add_argument("--format", choices=REPORT_FORMATS, default="table")
    p.add_argument("--out", help="html: the file; csv/parquet: the folder for one file per table")
    p.add_argument(
        "--json", action="store_true", help="table format: print the totals as JSON as well"
    )
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    import json
    import sys

    from overnight.jobs.ops.report import (
        build_report,
        load,
        parse_since,
        parse_until,
        render_table,
        write,
    )

    since, until = parse_since(args.since), parse_until(args.until)
    report = build_report(
        load(args.outputs, since, until), by=args.by, since=since, until=until, tenant=args.tenant
    )
    if args.format == "table":
        print(render_table(report))
        if args.json:
            print(json.dumps(report.totals, indent=2, default=str))
        return 0
    for url in write(report, args.format, args.out):
        print(f"[overnight] wrote {url}", file=sys.stderr)
    return 0
