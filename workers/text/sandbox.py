"""The time-limited child process every document is parsed in (see :mod:`workers.text`).

The parent side owns one long-lived extractor child per process and restarts it after a
timeout or crash; the child side parses with :mod:`workers.text.formats` under a memory limit.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from multiprocessing.connection import Connection

from overnight.schemas.errors import ErrorCode
from overnight.workers.text.core import (
    ExtractorUnavailable,
    Failure,
    TextOptions,
    TextResult,
    describe,
)
from overnight.workers.text.formats import EXTRACTORS, detect_kind, guess_kind

logger = logging.getLogger(__name__)


_DEFAULT_OPTIONS = TextOptions()


def extract_text(data: bytes, name: str, options: TextOptions = _DEFAULT_OPTIONS) -> TextResult:
    """Return the readable text of ``data``, the bytes of the object called ``name``.

    Never raises for bad input. Raises :class:`ExtractorUnavailable` only when the extractor
    process cannot start at all, which no document can fix.
    """
    return _run(_Request(data=bytes(data), name=str(name or ""), options=options))


# --------------------------------------------------------------------------------------------
# Parent side: one long-lived extractor child per process.


@dataclass(frozen=True)
class _Request:
    data: bytes
    name: str
    options: TextOptions
    # Test hooks, never set by extract_text: make the child stall or die mid-document.
    stall_s: float = 0.0
    crash: bool = False


@dataclass(frozen=True)
class _Outcome:
    text: str | None
    kind: str
    pages: int | None = None
    error_code: str | None = None
    error_message: str | None = None


def _unseen(request: _Request, code: ErrorCode, message: str) -> _Outcome:
    """The outcome of a document the child did not answer for (empty, timed out, crashed)."""
    return _Outcome(
        text=None,
        kind=guess_kind(request.data, request.name),
        error_code=code.value,
        error_message=message,
    )


_STARTUP_TIMEOUT_S = 60.0
_READY = b"ready"


class _Sandbox:
    """Owns the extractor child of this process; one document at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._send: Connection | None = None
        self._recv: Connection | None = None
        self._owner_pid = os.getpid()
        self.starts = 0  # how many children this process has started; read by tests

    def run(self, request: _Request, timeout_s: float) -> _Outcome | None:
        """The child's outcome, or None when the document ran out of time."""
        with self._lock:
            send, recv = self._ensure_started()
            try:
                send.send_bytes(pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL))
                if not recv.poll(timeout_s):
                    self._stop()
                    return None
                outcome = pickle.loads(recv.recv_bytes())
            except (EOFError, OSError):
                code = self._stop()
                return _unseen(
                    request,
                    ErrorCode.CORRUPT_DOCUMENT,
                    f"the extractor process died (exit code {code}) while parsing this "
                    "document, most likely out of memory or a parser crash",
                )
            except BaseException:
                # Interrupted mid-document (KeyboardInterrupt, a test timeout): the child's
                # late reply would answer the next request, so it goes.
                self._stop()
                raise
            if not isinstance(outcome, _Outcome):
                self._stop()
                raise ExtractorUnavailable(
                    f"the extractor process answered with {type(outcome).__name__}; "
                    "this is a bug in workers/text.py"
                )
            return outcome

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _ensure_started(self) -> tuple[Connection, Connection]:
        if self._owner_pid != os.getpid():
            # A fork inherited our pipes; they belong to the parent's child. Drop, don't kill.
            self._proc, self._send, self._recv = None, None, None
            self._owner_pid = os.getpid()
        if self._proc is not None and self._proc.poll() is not None:
            self._stop()
        if self._proc is None or self._send is None or self._recv is None:
            return self._start()
        return self._send, self._recv

    def _start(self) -> tuple[Connection, Connection]:
        req_r, req_w = os.pipe()
        resp_r, resp_w = os.pipe()
        # The child imports this module by name with our sys.path, as multiprocessing's
        # "spawn" would, but without re-running the parent's __main__ (a Ray worker script).
        child_code = (
            "import sys; sys.path[:0] = sys.argv[3:]; "
            f"from {__name__} import _child_main; "
            "_child_main(int(sys.argv[1]), int(sys.argv[2]))"
        )
        paths = [p for p in sys.path if p]
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", child_code, str(req_r), str(resp_w), *paths],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                pass_fds=(req_r, resp_w),
                close_fds=True,
            )
        except OSError as exc:
            for fd in (req_r, req_w, resp_r, resp_w):
                os.close(fd)
            raise ExtractorUnavailable(
                f"cannot start the text extractor process with {sys.executable}: {exc}"
            ) from exc
        os.close(req_r)
        os.close(resp_w)
        self._proc = proc
        self._send = send = Connection(req_w, readable=False)
        self._recv = recv = Connection(resp_r, writable=False)
        self.starts += 1
        try:
            ready = recv.poll(_STARTUP_TIMEOUT_S) and recv.recv_bytes() == _READY
        except (EOFError, OSError):
            ready = False
        if ready:
            return send, recv
        code = self._stop()
        raise ExtractorUnavailable(
            f"the text extractor process did not start (exit code {code}); "
            "check that pypdfium2 and charset-normalizer import in this environment "
            "(its traceback, if any, is on stderr)"
        )

    def _stop(self) -> int | None:
        """Kill the child if running; return its exit code."""
        for conn in (self._send, self._recv):
            if conn is not None:
                conn.close()
        self._send = self._recv = None
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.kill()
        try:
            return proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            logger.warning("text extractor process %d did not exit after SIGKILL", proc.pid)
            return None


_SANDBOX = _Sandbox()
atexit.register(_SANDBOX.close)


def _run(request: _Request) -> TextResult:
    start = time.perf_counter()
    options = request.options
    if not request.data:
        outcome = _unseen(request, ErrorCode.EMPTY_FILE, "the object has zero bytes")
    else:
        maybe = _SANDBOX.run(request, options.timeout_s)
        if maybe is None:
            logger.warning(
                "text extraction of %r exceeded %.3g s; extractor restarted",
                request.name,
                options.timeout_s,
            )
            maybe = _unseen(
                request,
                ErrorCode.EXTRACT_TIMEOUT,
                f"text extraction took longer than timeout_s={options.timeout_s:g} s "
                "and was stopped",
            )
        outcome = maybe
    return TextResult(**dataclasses.asdict(outcome), seconds=time.perf_counter() - start)


# --------------------------------------------------------------------------------------------
# Child side.


def _child_main(req_fd: int, resp_fd: int) -> None:
    """Serve extraction requests until the parent closes the pipe or goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    # Broken files make parsers warn a lot; the outcome already says what went wrong.
    warnings.simplefilter("ignore")
    import charset_normalizer  # noqa: F401  (import now, not inside a document's time limit)
    import pypdfium2  # noqa: F401

    parent = os.getppid()

    def watch_parent() -> None:
        # A busy child never reads EOF; exit on its own when the parent has died.
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch_parent, daemon=True).start()
    requests = Connection(req_fd, writable=False)
    replies = Connection(resp_fd, readable=False)
    replies.send_bytes(_READY)
    while True:
        try:
            request = pickle.loads(requests.recv_bytes())
        except EOFError:
            return
        if request.crash:
            os._exit(3)
        if request.stall_s:
            time.sleep(request.stall_s)
        _limit_memory(request.options.max_memory_mb)
        replies.send_bytes(pickle.dumps(_extract_safely(request), protocol=pickle.HIGHEST_PROTOCOL))


def _limit_memory(max_memory_mb: int) -> None:
    """Cap this child's address space at its current size plus ``max_memory_mb``: beyond it
    an allocation raises MemoryError (this document's ``too_large``) instead of the node
    running out of memory. Linux only; elsewhere the time limit is the only bound."""
    try:
        import resource

        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (ImportError, OSError, ValueError):
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = size + max_memory_mb * 2**20
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _extract_safely(request: _Request) -> _Outcome:
    kind = "unknown"
    password = request.options.pdf_password
    try:
        kind = detect_kind(request.data, request.name)
        text, pages = EXTRACTORS[kind](request.data, request.options)
    except Failure as failure:
        if failure.code is ErrorCode.UNSUPPORTED_TYPE:
            kind = "unknown"
        return _Outcome(
            text=None,
            kind=kind,
            pages=failure.pages,
            error_code=failure.code.value,
            error_message=_redact(failure.message, password),
        )
    except MemoryError:
        return _Outcome(
            text=None,
            kind=kind,
            error_code=ErrorCode.TOO_LARGE.value,
            error_message=(
                f"parsing the {kind} document needs more than "
                f"max_memory_mb={request.options.max_memory_mb} MB of memory"
            ),
        )
    except Exception as exc:  # any parser bug on any input is this document's problem only
        return _Outcome(
            text=None,
            kind=kind,
            error_code=ErrorCode.CORRUPT_DOCUMENT.value,
            error_message=_redact(f"cannot parse the {kind} document: {describe(exc)}", password),
        )
    return _Outcome(text=text, kind=kind, pages=pages)


def _redact(message: str, password: str | None) -> str:
    if password:
        message = message.replace(password, "***")
    return message
