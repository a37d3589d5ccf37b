"""``overnight export``: transcripts as SRT, WebVTT, text or JSON files, one a recording."""

from __future__ import annotations

import argparse

from overnight.jobs.choices import EXPORT_FORMATS


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "export",
        help="write transcripts as SRT, WebVTT, text or JSON files, one a recording",
        description="Read OUTPUT/transcripts (the newest ok row of each recording) and write "
        "DEST/<recording>.<format> with speaker labels, to a local folder or object storage. "
        "A rerun overwrites the same files and removes none (see docs/how-to/export.md). "
        "Large outputs are written by Ray tasks.",
    )
    p.add_argument(
        "output", metavar="OUTPUT", help="a transcription run's output (local, s3://, gs://)"
    )
    p.add_argument("dest", metavar="DEST", help="folder or prefix for the files")
    p.add_argument("--format", choices=EXPORT_FORMATS, default="srt", help="default: srt")
    p.add_argument(
        "--redacted-only",
        action="store_true",
        help="refuse (exit status 2, nothing written) unless every transcript was redacted "
        "by its job (`redact`)",
    )
    p.set_defaults(handler=handle)


# Recordings with only error rows named in the summary line; the rest are counted.
NAMED = 3


def handle(args: argparse.Namespace) -> int:
    from overnight.jobs.ops.export import export
    from overnight.jobs.run.console import printable

    done = export(args.output, args.dest, args.format, redacted_only=args.redacted_only)
    line = f"wrote {done['files']} {done['format']} file(s) to {done['destination']}"
    without = done["recordings_without_transcript"]
    if without:
        named = ", ".join(without[:NAMED])
        more = f" and {len(without) - NAMED} more" if len(without) > NAMED else ""
        line += (
            f"; {len(without)} recording(s) have only error rows: {named}{more} "
            "(see `overnight show OUTPUT --status error`)"
        )
    # One line, whatever the names hold (a newline in a recording's name).
    print(printable(line))
    return 0
