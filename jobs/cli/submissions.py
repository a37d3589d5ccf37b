"""``overnight submissions add|process|list``: contact-center bulk submissions."""

from __future__ import annotations

import argparse
import contextlib
import json

from overnight.jobs.cli.output import add_json_flag, print_json
from overnight.jobs.errors import EXIT_SUBMISSION_FAILED

_COLUMNS = (
    "tenant",
    "submission_id",
    "status",
    "recordings",
    "audio_minutes",
    "failures",
    "cost_usd",
    "attempts",
)


def _table(records: list[dict]) -> str:
    from overnight.jobs.ops.submissions import shown

    rows = [[*_COLUMNS, "reason"]]
    for r in records:
        rows.append(
            [
                *("" if r.get(c) is None else str(r[c]) for c in _COLUMNS),
                shown(r.get("reason") or "", 200),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1]
        for row in rows
    )


def _cmd_add(args: argparse.Namespace) -> int:
    from overnight.jobs.ops.submissions import add, load_config

    result = add(load_config(args.config), args.tenant, args.manifest)
    print_json(result)
    return 0


def _cmd_process(args: argparse.Namespace) -> int:
    from overnight.jobs.ops.submissions import FAILED, load_config, process
    from overnight.jobs.run import console
    from overnight.jobs.run.console import quiet_native_stderr

    config = load_config(args.config)
    # The same terminal as `overnight transcribe`: Ray's C++ notices filtered unless verbose.
    with contextlib.nullcontext() if args.verbose else quiet_native_stderr():
        records = process(
            config,
            tenants=args.tenant,
            ray_address=args.address,
            progress=not args.quiet,
            verbose=args.verbose,
            echo=lambda line: console.say("submission", line),
        )
    # JSON Lines, one submission a line as each is handled: not print_json's one document.
    for r in records:
        print(json.dumps({k: r.get(k) for k in (*_COLUMNS, "reason", "output")}, sort_keys=True))
    failed = [r for r in records if r["status"] == FAILED]
    console.say(
        "submissions_done",
        f"[submissions] {len(records)} submission(s) handled, {len(failed)} failed",
        handled=len(records),
        failed=len(failed),
    )
    return EXIT_SUBMISSION_FAILED if failed else 0


def _cmd_list(args: argparse.Namespace) -> int:
    from overnight.jobs.ops.submissions import SubmissionStore, load_config

    config = load_config(args.config)
    records = SubmissionStore(config.submissions.state).all(args.tenant)
    if args.json:
        print_json(records)
    else:
        print(_table(records))
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "submissions", help="contact-center bulk submissions: add, process, list"
    )
    sub = p.add_subparsers(dest="submissions_command", required=True)
    config_help = "central tenants config (TOML): [submissions], [transcribe], [tenants.NAME]"

    a = sub.add_parser("add", help="check a manifest and copy it into a tenant's inbox")
    a.add_argument("tenant", help="the tenant the manifest is for, as the config names it")
    a.add_argument("manifest", help="CSV, JSONL or Parquet of recording URIs (a path or URL)")
    a.add_argument("--config", required=True, help=config_help)
    a.set_defaults(handler=_cmd_add)

    r = sub.add_parser("process", help="run every new submission of every tenant once")
    r.add_argument("--config", required=True, help=config_help)
    r.add_argument("--tenant", action="append", help="only this tenant (repeatable)")
    r.add_argument(
        "--address", help="Ray cluster address (default: [submissions] ray_address, else local)"
    )
    r.add_argument("--quiet", action="store_true", help="no progress lines")
    r.add_argument("--verbose", action="store_true", help="also show Ray's own log lines")
    r.set_defaults(handler=_cmd_process)

    ls = sub.add_parser("list", help="status and totals of every submission")
    ls.add_argument("--config", required=True, help=config_help)
    ls.add_argument("--tenant", help="only this tenant's submissions")
    add_json_flag(ls, "a list of the records")
    ls.set_defaults(handler=_cmd_list)
