"""``overnight vacuum OUTPUT --older-than 90d [--dry-run]``: retention by run date."""

from __future__ import annotations

import argparse


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "vacuum",
        help="remove run dates older than a span: partitions, index entries, runs, manifests",
        description="Remove every run date older than --older-than from OUTPUT: its "
        "partitions of transcripts/, results/, probes/, costs/ and run_table/, its done-index "
        "entries, its runs' summaries and manifests, staged leftovers, and its recordings' "
        "rows in transcripts_unredacted/ and FLACs in redacted_audio/. A vacuum that was "
        "killed is finished by the next one. Not while a job writes to OUTPUT.",
    )
    p.add_argument("output", metavar="OUTPUT", help="output folder or prefix")
    p.add_argument(
        "--older-than",
        required=True,
        help="whole days or weeks back from today (UTC): 90d, 13w",
    )
    p.add_argument("--dry-run", action="store_true", help="list what would go, remove nothing")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    import sys

    from overnight.jobs.ops.vacuum import cutoff, vacuum

    before = cutoff(args.older_than, "--older-than")
    done = vacuum(args.output, before, dry_run=args.dry_run)
    for line in done.listing():
        print(line)
    print(f"[overnight] {done.describe(args.dry_run)}", file=sys.stderr)
    return 0
