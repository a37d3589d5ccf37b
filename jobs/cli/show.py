"""``overnight show``: print what a run wrote, as dialogue or results."""

from __future__ import annotations

import argparse

from overnight.jobs.choices import DEFAULT_SHOW_LIMIT
from overnight.jobs.cli.output import add_json_flag, print_json


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "show",
        help="print transcripts (as dialogue) or document results of an output",
        description="Print what a run wrote: transcripts as dialogue with speaker labels, "
        "document results with their label, text or JSON, errors with their code and message. "
        "Exit status 4 when OUTPUT holds no results or nothing matches.",
    )
    p.add_argument("output", metavar="OUTPUT", help="output folder or prefix (local, s3://, gs://)")
    p.add_argument(
        "--source",
        metavar="NAME",
        help="the recording or document: its file name, with or without extension, its URI, "
        "its external_id, or a glob ('call_*')",
    )
    p.add_argument("--item", metavar="ID", help="an item id (or its first characters)")
    p.add_argument(
        "--status", choices=["ok", "error"], help="only the rows of this status (default: all)"
    )
    p.add_argument("--task", help="document results of this task only")
    p.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_SHOW_LIMIT,
        metavar="N",
        help=f"at most N rows per dataset (default {DEFAULT_SHOW_LIMIT}; 0: all)",
    )
    add_json_flag(p, "a list of the rows")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    import os
    import sys

    from overnight.jobs.ops.show import Selection, as_json, read, render, width

    selection = Selection(args.source, args.item, args.status, args.task)
    found = read(args.output, selection)
    limit = max(0, args.limit)
    try:
        if args.json:
            print_json(
                [
                    as_json(name, row)
                    for name, (rows, _) in found.items()
                    for row in (rows[:limit] if limit else rows)
                ]
            )
        else:
            print(render(found, limit, width()))
        sys.stdout.flush()
    except BrokenPipeError:  # `overnight show OUT | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
