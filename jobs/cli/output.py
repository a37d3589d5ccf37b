"""``--json``: the flag and the one format of a command's JSON document on stdout.

Every command that prints one JSON document (``transcribe``/``process``/``probe``/``run`` and
their ``--dry-run``, ``plan``, ``report``, ``show``, ``status``, ``submissions add`` and
``submissions list``) prints it with ``print_json``: indented by two, keys in the order the
command built them, non-ASCII text as it is (UTF-8, as the command's other output), values
JSON does not know (dates, paths) as their ``str``. A script parses the whole of stdout.

JSON Lines (one record a line: ``submissions process`` on stdout, ``--log-format json`` on
stderr, manifests written to files) is another contract and does not go through here.
Imported to print help: the standard library only.
"""

from __future__ import annotations

import argparse
import json


def add_json_flag(p: argparse.ArgumentParser, what: str) -> None:
    """``--json`` on ``p``: print only ``what`` (the command's own words) as one document."""
    p.add_argument(
        "--json",
        action="store_true",
        help=f"print only {what}, as one JSON document on stdout (anything else goes to stderr)",
    )


def print_json(document: object) -> None:
    """Print a command's one JSON document on stdout, in the format every command shares."""
    print(json.dumps(document, indent=2, ensure_ascii=False, default=str))
