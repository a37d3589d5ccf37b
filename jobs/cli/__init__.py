"""The ``overnight`` command: parse flags, call the command's handler, turn errors into exit codes.

All argparse and printing live in this package, one module per command or group; the
libraries (``jobs.ops.plan``, ``jobs.ops.tune``, ...) take plain arguments. No business logic here.
Systemic failures arrive as ``OvernightError`` and are turned into one clear message and an
exit status; per-item failures are in the output, exit status 0.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import os
import signal
import sys
import threading
import time

from overnight.jobs.errors import OvernightError


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("overnight")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


class _Version(argparse.Action):
    """``--version``: looked up only when asked, so that parsing stays as fast as help."""

    def __init__(
        self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None
    ):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"overnight {_version()}")
        parser.exit()


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="overnight", description="Batch transcription and document processing on Ray."
    )
    ap.add_argument("--version", action=_Version, help="print the installed version and exit")
    sub = ap.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    return ap


# One module per command or group of commands: each has add_parser(subparsers), which sets
# `handler=` on its parsers; a handler takes the parsed args and returns an exit status. They
# import argparse only: the libraries a command needs are imported when its handler runs.
COMMAND_MODULES: tuple[str, ...] = (
    "overnight.jobs.cli.job",
    "overnight.jobs.cli.submit",
    "overnight.jobs.cli.submissions",
    "overnight.jobs.cli.report",
    "overnight.jobs.cli.plan",
    "overnight.jobs.cli.tune",
    "overnight.jobs.cli.show",
    "overnight.jobs.cli.export",
    "overnight.jobs.cli.vacuum",
    "overnight.jobs.cli.views",
)


def _innermost_parser(
    ap: argparse.ArgumentParser, args: argparse.Namespace
) -> argparse.ArgumentParser:
    """The (sub)command parser the arguments reached: ``overnight submissions add`` → add's."""
    current = ap
    while True:
        subs = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(args, subs[0].dest, None) if subs else None
        if name is None or name not in subs[0].choices:
            return current
        current = subs[0].choices[name]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse like ``parse_args``, but an unknown option is the subcommand's own error: its
    usage, not the top-level one, and the option it most likely meant."""
    ap = parser()
    args, extra = ap.parse_known_args(argv)
    if extra:
        command = _innermost_parser(ap, args)
        options = [o for a in command._actions for o in a.option_strings]
        message = f"unrecognized arguments: {' '.join(extra)}"
        for token in extra:
            if token.startswith("-"):
                close = difflib.get_close_matches(token.split("=", 1)[0], options, n=1)
                message += "".join(f"; did you mean {c}?" for c in close)
        command.error(message)
    return args


# After Ctrl-C, the longest the command waits for Ray to wind down before it exits anyway.
INTERRUPT_GRACE_S = 30.0


def _interrupt_within_grace() -> None:
    """Ctrl-C raises KeyboardInterrupt as usual, and also arms an exit INTERRUPT_GRACE_S
    later: under CI load an interrupted run stayed alive for minutes. Python runs its own
    signal handler only when the main thread is back in the interpreter, and a driver waiting
    inside Ray's C++ core may not come back; the wakeup fd is written by the C-level handler
    at once, so a watcher thread sees the interrupt whatever the main thread does. Every
    finished batch is committed atomically: exiting loses nothing a rerun does not resume."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return  # someone else (an embedding program) owns Ctrl-C
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except ValueError:
        os.close(read_fd)
        os.close(write_fd)
        return

    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        # A scheduler's stop (Airflow, Kubernetes, systemd send SIGTERM) ends the command as
        # Ctrl-C does: one line, finished items committed. It printed Ray's C++ stack dump.
        signal.signal(signal.SIGTERM, _terminated)

    def watch() -> None:
        while data := os.read(read_fd, 64):
            if signal.SIGINT in data or signal.SIGTERM in data:
                time.sleep(INTERRUPT_GRACE_S)
                from overnight.jobs.run import console

                console.say(
                    "interrupted",
                    f"overnight: still winding down {INTERRUPT_GRACE_S:.0f} s after the "
                    "interrupt; exiting now (finished items are committed, rerun to resume)",
                    level="warning",
                    exit_code=130,
                )
                os._exit(130)

    threading.Thread(target=watch, name="overnight-interrupt", daemon=True).start()


def _terminated(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """The ``overnight`` command. A reader that stops early (``overnight config | head``)
    ends it quietly, with the shell's status for a closed pipe (141), and no traceback."""
    if argv is None:  # the command line itself, not a caller (tests, an embedding program)
        _interrupt_within_grace()
    try:
        try:
            return _main(argv)
        finally:  # also after argparse's exit (--help): the buffered lines may meet a closed pipe
            sys.stdout.flush()
            if argv is None:  # a caller's process may run more commands on the same Ray
                _stop_local_ray()
    except BrokenPipeError:
        # Python would flush stdout again at exit and print the same error: point it at
        # /dev/null first.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _stop_local_ray() -> None:
    """The command's local Ray, stopped faster than Ray's exit hook does it (see
    ``jobs.run.on_ray.stop_local_ray``). Only a command that ran a job has it imported."""
    pipeline = sys.modules.get("overnight.jobs.run.on_ray")
    if pipeline is not None:
        # The result stands whatever happens here; Ray's own exit hook still stops it. A
        # Ctrl-C while Ray winds down after the summary was a KeyboardInterrupt traceback and
        # exit 1 for a run whose rows were published.
        with contextlib.suppress(Exception, KeyboardInterrupt):
            pipeline.stop_local_ray()


def _main(argv: list[str] | None) -> int:
    args = parse_args(argv)
    # Operator events take their form (text or JSON lines on stderr) before the command runs:
    # jobs.dataset logs its warnings (a foreign file skipped) to that logger by name, as it may
    # not import the console, a layer above it.
    from overnight.jobs.run import console

    console.events_logger()
    try:
        return int(args.handler(args))
    except OvernightError as exc:
        from overnight.jobs.dataset.storage import scrub_secrets
        from overnight.jobs.run.console import printable

        # Raised in a Ray task, it arrives as Ray's copy of it, whose text is the remote
        # traceback: ours is its cause.
        cause = getattr(exc, "cause", None)
        exc = cause if isinstance(cause, OvernightError) else exc
        message = scrub_secrets(str(exc))
        if os.environ.get("OVERNIGHT_LOG_FORMAT") == "json":
            from overnight.jobs.run.console import event

            event(
                "error", message, level="error", error=type(exc).__name__, exit_code=exc.exit_code
            )
            return exc.exit_code
        # One line, whatever names the message quotes (a file name may hold a newline).
        print(f"overnight: error: {printable(message)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        console.say(
            "interrupted",
            "overnight: interrupted; finished items are committed, rerun to resume",
            level="warning",
            exit_code=130,
        )
        return 130
