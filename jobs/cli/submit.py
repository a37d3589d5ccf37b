"""``overnight submit``, ``status`` and ``logs``: a job file on a Ray cluster (Ray Jobs API)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from overnight.jobs.cli.output import add_json_flag, print_json
from overnight.jobs.errors import EXIT_STILL_RUNNING


def _print_status(st: dict[str, Any], out=None) -> None:
    out = out or sys.stdout
    print(f"job {st['submission_id']}: {st['status']}", file=out)
    for key in ("run_id", "message", "start_time", "end_time", "driver_exit_code", "entrypoint"):
        if st.get(key) not in (None, ""):
            print(f"  {key:<16} {st[key]}", file=out)


def _cmd_submit(args: argparse.Namespace) -> int:
    from overnight.jobs.errors import ClusterJobFailed
    from overnight.jobs.ops.remote import TERMINAL, api_address, logs, submit, wait

    result = submit(
        args.job_file,
        args.address,
        submission_id=args.submission_id,
        run_id=args.run_id,
        date=args.date,
        retry_failed=args.retry_failed,
    )
    address = api_address(args.address)
    if result.created:
        print(f"submitted {result.submission_id} (run {result.run_id}) to {address}")
        host = address.split("://")[-1].split(":")[0].split("/")[0]
        if result.local_paths and host not in ("127.0.0.1", "localhost"):
            print(
                f"  note: {', '.join(result.local_paths)} must exist at the same path on every node "
                "(a shared filesystem); otherwise use s3:// or gs://",
                file=sys.stderr,
            )
    else:
        print(
            f"{result.submission_id} already exists on {address}: {result.status} (run "
            f"{result.run_id}); not submitted again"
        )
        if result.status in ("FAILED", "STOPPED"):
            print("  resubmit with --retry-failed to resume it (finished items are kept)")
    print(f"  follow it:  overnight logs {result.submission_id} --address {address} --follow")
    if not args.wait:
        return (
            0
            if result.created or result.status not in ("FAILED", "STOPPED")
            else ClusterJobFailed.exit_code
        )
    final = wait(args.address, result.submission_id, timeout_s=args.timeout)
    print(f"{result.submission_id}: {final}")
    if final == "SUCCEEDED":
        return 0
    if final in TERMINAL:
        tail = logs(args.address, result.submission_id).splitlines()[-30:]
        print("\n".join(tail), file=sys.stderr)
        return ClusterJobFailed.exit_code
    print(f"still {final} after {args.timeout} s", file=sys.stderr)
    return EXIT_STILL_RUNNING


def _cmd_status(args: argparse.Namespace) -> int:
    from overnight.jobs.errors import ClusterJobFailed
    from overnight.jobs.ops.remote import status

    st = status(args.address, args.submission_id)
    if args.json:
        print_json(st)
    else:
        _print_status(st)
    # A cron wrapper branches on the exit status alone: a job that ended badly is 9, as with
    # `submit --wait`; an unknown id is 4 (InputNotFound), raised by status().
    return ClusterJobFailed.exit_code if st["status"] in ("FAILED", "STOPPED") else 0


def _cmd_logs(args: argparse.Namespace) -> int:
    from overnight.jobs.ops.remote import follow_logs, logs

    if args.follow:
        follow_logs(args.address, args.submission_id)
    else:
        sys.stdout.write(logs(args.address, args.submission_id))
    return 0


def add_parser(subparsers) -> None:
    address_help = (
        "Ray Jobs API of the cluster: http://HEAD:8265 (default: $RAY_API_SERVER_ADDRESS)"
    )
    s = subparsers.add_parser(
        "submit", help="run a job file on a Ray cluster (Ray Jobs API), once per night"
    )
    s.add_argument("job_file", help="job spec file (TOML or YAML), validated before it is sent")
    s.add_argument("--address", help=address_help)
    s.add_argument(
        "--submission-id",
        help="default: overnight-<job file name>-<run id or run date>-<digest of kind, input "
        "and output>",
    )
    s.add_argument("--run-id", help="run id inside the job; also names the submission")
    s.add_argument(
        "--date",
        help="run date YYYY-MM-DD (UTC): the job's run_date (its rows' partition) and the night "
        "in the submission's name; default the job file's run_date, else today",
    )
    s.add_argument(
        "--retry-failed",
        action="store_true",
        help="if the submission failed, submit <id>-retryN, which resumes the same run",
    )
    s.add_argument(
        "--wait",
        action="store_true",
        help="wait for the job to end; exit status 0 only if it succeeded",
    )
    s.add_argument(
        "--timeout", type=float, help="with --wait: stop waiting after this many seconds"
    )
    s.set_defaults(handler=_cmd_submit)

    st = subparsers.add_parser(
        "status",
        help="status of a submitted job; exit 0 pending, running or succeeded, 9 failed or "
        "stopped, 4 no such submission",
    )
    st.add_argument("submission_id", help="the id `overnight submit` printed")
    st.add_argument("--address", help=address_help)
    add_json_flag(st, "the job's status")
    st.set_defaults(handler=_cmd_status)

    lg = subparsers.add_parser("logs", help="driver logs of a submitted job")
    lg.add_argument("submission_id", help="the id `overnight submit` printed")
    lg.add_argument("--address", help=address_help)
    lg.add_argument("--follow", "-f", action="store_true", help="stream until the job ends")
    lg.set_defaults(handler=_cmd_logs)
