"""What reaches the terminal: names made printable, and Ray's native output during a run.

``printable`` escapes the characters of a name (a file, a tenant, an id) that would move the
terminal's cursor or start a line of their own: every place that prints such names to a
person (``show``, ``report``, the run's summary and progress, error messages) passes them
through it. JSON output needs no such help (``json.dumps`` escapes them).

Ray's C++ core writes its error-level log lines straight to the driver's file descriptor 2,
out of reach of Python's logging. Most of them matter (a lost connection to the cluster) and
pass through unchanged; the few in ``NOISE`` are notices about Ray's own internals that every
run printed and a user read as failures. Each line is also in the session's log file
(/tmp/ray/session_latest/logs/python-core-driver-*.log), and ``--verbose`` leaves the
terminal alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import select
import struct
import sys
import termios
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime

# Controls (C0, DEL, C1), line and paragraph separators, and the bidirectional overrides
# that make a name read differently from its bytes ("Trojan Source", CVE-2021-42574).
_UNPRINTABLE = re.compile(
    r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)


def printable(text: str) -> str:
    """``text`` with each control character written as its escape (``\\n``, ``\\x1b``): a
    newline in a file name cannot print a line of its own (a forged ``[overnight]`` line)."""
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


NOISE: tuple[re.Pattern[bytes], ...] = (
    # Ray Data hands every actor of a pool its DataContext and map function as object refs,
    # and Ray core warns about any restartable actor with refs among its constructor
    # arguments (ray-project/ray#57733), whatever the map function's own arguments: ours are
    # about 3 KB (CommittingActor's worker factory, dataset location, schema and token),
    # far below the 100 KB at which Ray would put them in the object store itself.
    re.compile(rb"core_worker\.cc:\d+: Actor with class name: .* has constructor arguments"),
)


@contextlib.contextmanager
def quiet_native_stderr(noise: Sequence[re.Pattern[bytes]] = NOISE) -> Iterator[None]:
    """Drop the lines matching ``noise`` that native code writes to stderr in this block.

    File descriptor 2 becomes a pipe read by a thread that forwards every other line to the
    real stderr. Python's own writes (``sys.stderr``: progress, messages, tracebacks) go to
    the real stderr directly, so they keep their order and a terminal stays a terminal.
    """
    try:
        sys.stderr.flush()
        real = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no usable fd 2: nothing to filter
        yield
        return
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    python_stderr = sys.stderr
    if _fileno(python_stderr) == 2:  # not when a test captures sys.stderr in Python
        # Not closed afterwards: a logging handler created inside the block may hold it.
        sys.stderr = open(  # noqa: SIM115
            os.dup(real),
            "w",
            buffering=1,
            encoding=getattr(python_stderr, "encoding", None) or "utf-8",
            errors="backslashreplace",
        )
    threading.Thread(
        target=_forward, args=(read_end, real, tuple(noise)), name="overnight-stderr", daemon=True
    ).start()
    try:
        yield
    finally:
        sys.stderr.flush()
        sys.stderr = python_stderr
        # Native writers see the real stderr again. A child process may still hold the
        # pipe; the thread forwards what it writes until the pipe closes.
        os.dup2(real, 2)
        _drain(read_end)


def _fileno(stream: object) -> int | None:
    try:
        return stream.fileno()  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return None


def _forward(read_end: int, real: int, noise: tuple[re.Pattern[bytes], ...]) -> None:
    pending = b""
    while True:
        # A partial line is forwarded after a short wait (a prompt, a progress bar); a
        # native log line arrives whole, in one write.
        ready, _, _ = select.select([read_end], [], [], 0.1 if pending else None)
        if not ready:
            _write(real, pending)
            pending = b""
            continue
        chunk = os.read(read_end, 65536)
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        kept = [line + b"\n" for line in lines if not any(p.search(line) for p in noise)]
        _write(real, b"".join(kept))
    _write(real, pending)
    os.close(read_end)


def _drain(read_end: int, timeout_s: float = 0.5) -> None:
    """Wait until the thread has taken what is in the pipe (the block's last lines)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            waiting = struct.unpack("i", fcntl.ioctl(read_end, termios.FIONREAD, b"\0" * 4))[0]
        except OSError:  # closed: the thread is done
            return
        if not waiting:
            time.sleep(0.15)  # and the partial-line wait
            return
        time.sleep(0.01)


def _write(fd: int, data: bytes) -> None:
    with contextlib.suppress(OSError):  # the terminal went away: nothing to tell it
        while data:
            data = data[os.write(fd, data) :]


# -- operator events: text lines, or JSON lines for log collectors ---------------------------
#
# What a run tells its operator on stderr (start, progress, a worker that died, an error) is an
# event: ``[overnight] message`` on a terminal, or with ``--log-format json`` (or
# ``OVERNIGHT_LOG_FORMAT=json``) one JSON object per line for Loki, CloudWatch or Datadog:
# ``{"ts", "level", "logger": "overnight", "event", "message", ...fields}``. Through the
# stdlib's ``logging`` (logger ``overnight.events``), so an embedding application can route
# them too. Events carry counts, names and times, never the text of a transcript or document.

LOG_FORMATS = ("text", "json")
_events: logging.Logger | None = None


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        body = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": "overnight",
            "event": getattr(record, "event", "message"),
            "message": record.getMessage(),
            **getattr(record, "fields", {}),
        }
        return json.dumps(body, default=str)


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"[overnight] {record.getMessage()}"


class _Stderr(logging.StreamHandler):
    """Writes to the current ``sys.stderr`` (which ``quiet_native_stderr`` and tests swap),
    not to the one there was when it was made."""

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def log_format() -> str:
    fmt = os.environ.get("OVERNIGHT_LOG_FORMAT", "text").strip().lower()
    return fmt if fmt in LOG_FORMATS else "text"


def set_log_format(fmt: str) -> None:
    """``--log-format``: for this process and the processes it starts."""
    global _events
    os.environ["OVERNIGHT_LOG_FORMAT"] = fmt
    _events = None


def events_logger() -> logging.Logger:
    """``overnight.events``, set up for the log format on first use: ``event`` writes to it,
    and so do layers below this one by the logger's name (``jobs.dataset``'s warnings)."""
    global _events
    if _events is None:
        _events = logging.getLogger("overnight.events")
        _events.propagate = False
        _events.setLevel(logging.INFO)
        handler = _Stderr()
        handler.setFormatter(_JsonFormatter() if log_format() == "json" else _TextFormatter())
        _events.handlers = [handler]
    return _events


def say(name: str, line: str, *, level: str = "info", **fields: object) -> None:
    """A line for the operator written as it is in text (``line`` carries its own prefix:
    ``overnight: interrupted ...``, ``[submissions] ...``), and as the event ``name`` in JSON:
    under ``--log-format json`` such lines, printed directly, came between the JSON objects a
    log collector parses."""
    if log_format() == "json":
        text = re.sub(r"^(\[[a-z]+\] |overnight: )", "", line)
        event(name, text, level=level, **fields)
    else:
        print(printable(line), file=sys.stderr, flush=True)


def event(name: str, message: str, *, level: str = "info", **fields: object) -> None:
    """Tell the operator: ``name`` is the event's kind (start, progress, worker_died, ...),
    ``message`` the sentence a person reads, ``fields`` the figures a machine reads."""
    events_logger().log(
        getattr(logging, level.upper()),
        printable(message),
        extra={"event": name, "fields": fields},
    )
