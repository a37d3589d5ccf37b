"""``overnight report``: cost per audio minute, document and million tokens, by group."""

from __future__ import annotations

import argparse

from overnight.jobs.choices import REPORT_FORMATS, REPORT_GROUPS
from overnight.jobs.cli.output import add_json_flag, print_json
from overnight.jobs.errors import ConfigError


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "report",
        help="cost per audio minute / document / million tokens, utilization, failures, by group",
        description="Report over the cost ledgers and run summaries of one or many outputs.",
    )
    p.add_argument(
        "outputs", nargs="+", metavar="OUTPUT", help="output folder or prefix (local, s3://, gs://)"
    )
    p.add_argument(
        "--by", choices=REPORT_GROUPS, default="day", help="what the rows group by (default day)"
    )
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
    p.add_argument(
        "--tenant",
        help="only this tenant's items; '(none)' selects the items without a tenant, as "
        "--by tenant labels them",
    )
    p.add_argument(
        "--format",
        choices=REPORT_FORMATS,
        help="table on the terminal (default), html (one self-contained file), csv or parquet "
        "(one file per table) for BI tools",
    )
    p.add_argument(
        "--out",
        help="html: the file (a name ending in .html needs no --format); csv/parquet: the "
        "folder for one file per table",
    )
    add_json_flag(p, "the grouping, the totals, the main table's rows and the report's notes")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    import sys

    from overnight.jobs.ops.report import (
        build_report,
        load,
        parse_since,
        parse_until,
        render_table,
        write,
    )

    fmt = _format(args)
    since, until = parse_since(args.since), parse_until(args.until)
    report = build_report(
        load(args.outputs, since, until), by=args.by, since=since, until=until, tenant=args.tenant
    )
    if args.json:
        print_json(
            {
                "by": args.by,
                "totals": report.totals,
                "rows": report.main.to_pylist(),
                "notes": report.notes,
            }
        )
        return 0
    if fmt == "table":
        print(render_table(report))
        return 0
    for url in write(report, fmt, args.out):
        print(f"[overnight] wrote {url}", file=sys.stderr)
    return 0


def _format(args: argparse.Namespace) -> str:
    """What to write, from --format, --out and --json, refused where they disagree: each of
    them was silently dropped (``--json --format html --out x`` wrote nothing, exit 0)."""
    if args.json:
        if args.format not in (None, "table") or args.out:
            raise ConfigError(
                "--json prints the report on stdout and writes no file: drop --format/--out, "
                "or drop --json to write one"
            )
        return "table"
    if args.format is None:
        if not args.out:
            return "table"
        if args.out.lower().endswith((".html", ".htm")):
            return "html"
        raise ConfigError(
            f"--out {args.out!r}: say what to write there with --format html (a file), csv or "
            "parquet (a folder of one file per table)"
        )
    if args.format == "table" and args.out:
        raise ConfigError(
            "--format table prints on the terminal: --out is for html, csv or parquet"
        )
    return str(args.format)
