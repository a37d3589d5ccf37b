"""``overnight show``: print what a run wrote, as dialogue or results."""

from __future__ import annotations

import argparse

from overnight.jobs.choices import DEFAULT_SHOW_LIMIT


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
    p.add_argument("--json", action="store_true", help="one JSON list of the rows, for machines")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    import json
    import os
    import sys

    from overnight.jobs.ops.show import Selection, as_json, read, render, width

    selection = Selection(args.source, args.item, args.status, args.task)
    found = read(args.output, selection)
    limit = max(0, args.limit)
    if args.json:
        text = json.dumps(
            [
                as_json(name, row)
                for name, (rows, _) in found.items()
                for row in (rows[:limit] if limit else rows)
            ],
            indent=2,
            ensure_ascii=False,
            default=str,
        )
    else:
        text = render(found, limit, width())
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:  # `overnight show OUT | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
