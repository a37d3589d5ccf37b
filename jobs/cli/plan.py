"""``overnight plan``: size a backlog for a deadline from measured profiles."""

from __future__ import annotations

import argparse

from overnight.jobs.choices import DEFAULT_HEADROOM, DEFAULT_UTILIZATION
from overnight.jobs.cli.output import add_json_flag, print_json
from overnight.jobs.errors import EXIT_NO_OPTION_MEETS_SLA


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "plan",
        help="how many GPUs/CPU workers finish a backlog by a deadline, at what cost",
        description="Size a backlog from measured throughput profiles; shows the arithmetic.",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--audio-hours", type=float, help="hours of audio in the backlog")
    what.add_argument("--documents", type=float, help="documents in the backlog")
    p.add_argument("--deadline", required=True, help="e.g. 6h, 90m, 1h30m")
    p.add_argument(
        "--profile",
        action="append",
        default=[],
        help="profile.json from `overnight tune`, or an OUTPUT folder whose runs/ to learn from (repeatable)",
    )
    p.add_argument(
        "--gpu", help="plan GPU workers of this kind (a price-table key: h100, a100, l4, ...)"
    )
    p.add_argument(
        "--price",
        type=float,
        help="USD per hour per GPU of --gpu (or per unit of every non-CPU option)",
    )
    p.add_argument("--cpu-price", type=float, help="USD per CPU core-hour")
    p.add_argument(
        "--throughput",
        type=float,
        help="state --gpu's per-worker throughput (x real time, or documents/s) when no profile measured it",
    )
    p.add_argument(
        "--headroom",
        type=float,
        default=DEFAULT_HEADROOM,
        help="share of the deadline kept free (default 0.2)",
    )
    p.add_argument(
        "--utilization",
        type=float,
        help=f"expected busy share of reserved time (default: measured, else {DEFAULT_UTILIZATION})",
    )
    p.add_argument(
        "--startup",
        help="start-up time of a worker (node, image, model load), e.g. 5m (default: none "
        "counted, and the plan says so)",
    )
    p.add_argument("--max-workers", type=int, help="at most this many workers are available")
    add_json_flag(p, "the plan")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from overnight.jobs.errors import ConfigError
    from overnight.jobs.ops.plan import (
        Sizing,
        adjust_profiles,
        check_number,
        load_profiles,
        make_plan,
        parse_duration,
        render,
    )

    if not args.profile and args.throughput is None:
        raise ConfigError(
            "give --profile (a profile.json from `overnight tune`, or an OUTPUT folder of past "
            "runs), or state a GPU's throughput without measuring it: --gpu h100 --throughput N "
            "(N: x real time for --audio-hours, documents per second for --documents)"
        )
    # Every flag is checked before a profile is read: NaN, infinity, zero or a negative
    # number is never a backlog, a throughput, a price or a share of time.
    unit = "audio_s" if args.audio_hours is not None else "documents"
    if unit == "audio_s":
        hours = check_number(args.audio_hours, "--audio-hours", low_open=True)
        backlog = check_number(hours * 3600.0, "--audio-hours in seconds", low_open=True)
    else:
        backlog = check_number(args.documents, "--documents", low_open=True)
    sizing = Sizing(
        parse_duration(args.deadline, "--deadline"),
        headroom=args.headroom,
        utilization=args.utilization,
        startup_s=0.0
        if args.startup in (None, "0", "0s")
        else parse_duration(args.startup, "--startup"),
        max_workers=args.max_workers,
    ).check(lambda field: "--" + field.replace("_", "-"))
    for flag, value, bounds in (
        ("--price", args.price, {}),
        ("--cpu-price", args.cpu_price, {}),
        ("--throughput", args.throughput, {"low_open": True}),
    ):
        if value is not None:
            check_number(value, flag, **bounds)
    profiles, notes = adjust_profiles(
        load_profiles(args.profile),
        unit,
        gpu=args.gpu,
        price=args.price,
        cpu_price=args.cpu_price,
        throughput=args.throughput,
    )
    if args.startup is None:
        # A stated throughput has no start-up in it; a measured profile's utilization holds
        # its short run's start-up, not a night's fresh nodes. Zero was assumed without a word.
        notes.append(
            "note: no worker start-up counted; a GPU node's start, image pull and model load "
            "usually take minutes: state them with --startup (e.g. 5m)"
        )
    plan = make_plan(profiles, backlog, unit, sizing, notes)
    if args.json:
        print_json(plan.to_dict())
    else:
        print(render(plan, unit))
    return 0 if plan.cheapest is not None else EXIT_NO_OPTION_MEETS_SLA
