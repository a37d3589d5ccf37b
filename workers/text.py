"""Bytes to text for each document type overnight reads, with a time limit per document.

The storage layer hands over an object's bytes and its name; this module never opens URLs.
Every input ends as a :class:`TextResult`: bad input becomes an error code from
:mod:`schemas.errors`, never an exception.

Why a child process: parsers (pypdf above all) can spin for minutes or exhaust memory on a
hostile or broken file, and a Python thread cannot be stopped. Each process that calls
:func:`extract_text` (a Ray worker, a test) therefore owns one long-lived extractor child,
started on first use with ``subprocess`` (fork+exec, so none of the parent's threads, locks or
gRPC state is inherited, which matters inside Ray workers) and fed documents over a pipe.
The common case costs one pickle round trip, well under a millisecond. When a document
exceeds ``timeout_s`` the child is killed and the next document starts a fresh one (about
half a second, not counted against that document's time limit).
"""

from __future__ import annotations

import atexit
import codecs
import io
import json
import logging
import math
import os
import pickle
import re
import signal
import subprocess
import sys
import threading
import time
import unicodedata
import warnings
import zipfile
from dataclasses import dataclass, field
from html.parser import HTMLParser
from multiprocessing.connection import Connection
from pathlib import PurePosixPath
from typing import IO
from xml.etree import ElementTree

from schemas.errors import ErrorCode

logger = logging.getLogger(__name__)

KINDS: tuple[str, ...] = ("pdf", "text", "markdown", "html", "docx", "json", "jsonl", "unknown")


class InvalidTextOptions(ValueError):
    """A :class:`TextOptions` field has a value that cannot work; the message names the fix."""


class ExtractorUnavailable(RuntimeError):
    """The extractor child process cannot start: a broken environment, not a bad document."""


@dataclass(frozen=True)
class TextOptions:
    """How documents are read. Validated on construction."""

    # Opens encrypted PDFs. Kept out of repr, logs and error messages.
    pdf_password: str | None = field(default=None, repr=False)
    # Where the password is configured, as the messages about encrypted PDFs name it (the
    # job sets the environment variable it reads, e.g. ``$OVERNIGHT_PDF_PASSWORD``).
    pdf_password_source: str = "pdf_password"
    # Wall-clock limit for parsing one document, in seconds.
    timeout_s: float = 60.0
    # Longer extracted text becomes the error ``too_large``.
    max_chars: int = 2_000_000
    # The field that holds the text in .json objects and .jsonl records.
    json_text_field: str = "text"
    # Memory the extractor child may add while parsing one document (an address-space
    # limit above its idle size); a parser that needs more fails with ``too_large``. A
    # 916 KB DOCX of paragraphs reached 4 GB without it.
    max_memory_mb: int = 2048

    def __post_init__(self) -> None:
        if self.pdf_password is not None and not isinstance(self.pdf_password, str):
            raise InvalidTextOptions(
                "pdf_password must be a string or None; pass the PDF user password as text"
            )
        if (
            isinstance(self.timeout_s, bool)
            or not isinstance(self.timeout_s, (int, float))
            or not math.isfinite(self.timeout_s)
            or self.timeout_s <= 0
        ):
            raise InvalidTextOptions(
                f"timeout_s={self.timeout_s!r} must be a positive number of seconds, e.g. 60"
            )
        if isinstance(self.max_chars, bool) or not isinstance(self.max_chars, int):
            raise InvalidTextOptions(
                f"max_chars={self.max_chars!r} must be a positive integer, e.g. 2000000"
            )
        if self.max_chars <= 0:
            raise InvalidTextOptions(
                f"max_chars={self.max_chars!r} must be a positive integer, e.g. 2000000"
            )
        if (
            isinstance(self.max_memory_mb, bool)
            or not isinstance(self.max_memory_mb, int)
            or self.max_memory_mb <= 0
        ):
            raise InvalidTextOptions(
                f"max_memory_mb={self.max_memory_mb!r} must be a positive integer, e.g. 2048"
            )
        if not isinstance(self.json_text_field, str) or not self.json_text_field:
            raise InvalidTextOptions(
                f"json_text_field={self.json_text_field!r} must name a field, e.g. 'text'"
            )


@dataclass(frozen=True)
class TextResult:
    """The text of one document, or the reason there is none."""

    text: str | None
    kind: str  # one of KINDS
    pages: int | None  # PDFs only
    error_code: str | None  # a value of schemas.errors.ErrorCode
    error_message: str | None  # for humans; never contains the PDF password
    seconds: float  # wall time of the whole call, including any extractor restart


def extract_text(data: bytes, name: str, options: TextOptions = TextOptions()) -> TextResult:
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
                return _Outcome(
                    text=None,
                    kind=_guess_kind(request.data, request.name),
                    error_code=ErrorCode.CORRUPT_DOCUMENT.value,
                    error_message=(
                        f"the extractor process died (exit code {code}) while parsing this "
                        "document, most likely out of memory or a parser crash"
                    ),
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
            "check that pypdf and charset-normalizer import in this environment "
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
        outcome = _Outcome(
            text=None,
            kind=_guess_kind(request.data, request.name),
            error_code=ErrorCode.EMPTY_FILE.value,
            error_message="the object has zero bytes",
        )
    else:
        maybe = _SANDBOX.run(request, options.timeout_s)
        if maybe is None:
            logger.warning(
                "text extraction of %r exceeded %.3g s; extractor restarted",
                request.name,
                options.timeout_s,
            )
            maybe = _Outcome(
                text=None,
                kind=_guess_kind(request.data, request.name),
                error_code=ErrorCode.EXTRACT_TIMEOUT.value,
                error_message=(
                    f"text extraction took longer than timeout_s={options.timeout_s:g} s "
                    "and was stopped"
                ),
            )
        outcome = maybe
    return TextResult(
        text=outcome.text,
        kind=outcome.kind,
        pages=outcome.pages,
        error_code=outcome.error_code,
        error_message=outcome.error_message,
        seconds=time.perf_counter() - start,
    )


# --------------------------------------------------------------------------------------------
# Child side.


def _child_main(req_fd: int, resp_fd: int) -> None:
    """Serve extraction requests until the parent closes the pipe or goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    # Broken files make pypdf log and warn a lot; the outcome already says what went wrong.
    logging.getLogger("pypdf").setLevel(logging.CRITICAL)
    warnings.simplefilter("ignore")
    import charset_normalizer  # noqa: F401  (import now, not inside a document's time limit)
    import pypdf  # noqa: F401

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


class _Failure(Exception):
    """A per-document failure with its error code."""

    def __init__(self, code: ErrorCode, message: str, pages: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.pages = pages


def _extract_safely(request: _Request) -> _Outcome:
    kind = "unknown"
    password = request.options.pdf_password
    try:
        kind = _detect_kind(request.data, request.name)
        text, pages = _EXTRACTORS[kind](request.data, request.options)
    except _Failure as failure:
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
            error_message=_redact(f"cannot parse the {kind} document: {_describe(exc)}", password),
        )
    return _Outcome(text=text, kind=kind, pages=pages)


def _describe(exc: BaseException) -> str:
    detail = str(exc).strip()
    return f"{type(exc).__name__}: {detail[:200]}" if detail else type(exc).__name__


def _redact(message: str, password: str | None) -> str:
    if password:
        message = message.replace(password, "***")
    return message


def _finish(text: str, options: TextOptions, *, keep_indent: bool = False) -> str:
    """Normalise whitespace and apply the no_text and too_large checks."""
    text = _normalise(text, keep_indent=keep_indent)
    if not text:
        raise _Failure(ErrorCode.NO_TEXT, "the document contains only whitespace")
    if len(text) > options.max_chars:
        raise _Failure(
            ErrorCode.TOO_LARGE,
            f"the text has {len(text)} characters, more than max_chars={options.max_chars}",
        )
    return text


# ---- type detection


_EXTENSIONS = {
    ".pdf": "pdf",
    ".txt": "text",
    ".text": "text",
    ".md": "markdown",
    ".markdown": "markdown",
    ".html": "html",
    ".htm": "html",
    ".xhtml": "html",
    ".json": "json",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".docx": "docx",
}
# A folder or prefix listing of the process job takes these as documents by default
# (jobs.manifest.Selection); a manifest row is a document whatever its name.
DOCUMENT_EXTENSIONS = frozenset(_EXTENSIONS)

# Formats recognised only to say clearly that they are not read.
_UNSUPPORTED_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF87a", "a GIF image"),
    (b"GIF89a", "a GIF image"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "a legacy Office file (.doc/.xls/.ppt)"),
    (b"{\\rtf", "an RTF document"),
    (b"\x1f\x8b", "a gzip archive"),
    (b"7z\xbc\xaf\x27\x1c", "a 7z archive"),
    (b"Rar!\x1a\x07", "a RAR archive"),
)

_DOCX_PART = "word/document.xml"


def _extension(name: str) -> str:
    return PurePosixPath(name.replace("\\", "/")).suffix.lower()


def _guess_kind(data: bytes, name: str) -> str:
    """Cheap guess from magic bytes and extension only, for results the child never saw."""
    if data.startswith(b"%PDF"):
        return "pdf"
    return _EXTENSIONS.get(_extension(name), "unknown")


def _detect_kind(data: bytes, name: str) -> str:
    ext = _extension(name)
    if data.startswith(b"%PDF"):
        return "pdf"
    if data.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                is_docx = _DOCX_PART in archive.namelist()
        except (zipfile.BadZipFile, ValueError, OSError) as exc:
            if ext == ".docx":
                raise _Failure(
                    ErrorCode.CORRUPT_DOCUMENT, f"broken DOCX zip container: {_describe(exc)}"
                ) from exc
            raise _Failure(ErrorCode.UNSUPPORTED_TYPE, "a broken zip archive") from exc
        if is_docx:
            return "docx"
        if ext == ".docx":
            raise _Failure(ErrorCode.CORRUPT_DOCUMENT, f"a zip file without {_DOCX_PART}")
        raise _Failure(
            ErrorCode.UNSUPPORTED_TYPE,
            f"a zip archive without {_DOCX_PART} (e.g. .xlsx, .pptx, .odt or plain .zip)",
        )
    for magic, what in _UNSUPPORTED_MAGIC:
        if data.startswith(magic):
            raise _Failure(ErrorCode.UNSUPPORTED_TYPE, f"{what}, not a supported document")
    if ext in _EXTENSIONS:
        return _EXTENSIONS[ext]
    head = data[:512].lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    if head.startswith((b"<!doctype html", b"<html")):
        return "html"
    return "text"


# ---- PDF


def _pdf(data: bytes, options: TextOptions) -> tuple[str, int | None]:
    from pypdf import PasswordType, PdfReader

    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
    except Exception as exc:
        raise _Failure(ErrorCode.CORRUPT_DOCUMENT, f"unreadable PDF: {_describe(exc)}") from exc
    if reader.is_encrypted:
        # An empty user password (owner-only restrictions) opens without configuration.
        opened = False
        for password in ("", options.pdf_password):
            if password is None:
                continue
            try:
                opened = reader.decrypt(password) != PasswordType.NOT_DECRYPTED
            except Exception as exc:
                raise _Failure(
                    ErrorCode.ENCRYPTED, f"the PDF's encryption is not supported: {_describe(exc)}"
                ) from exc
            if opened:
                break
        if not opened:
            source = options.pdf_password_source
            if options.pdf_password is None:
                raise _Failure(
                    ErrorCode.ENCRYPTED,
                    f"the PDF is encrypted; put its password in {source} and rerun to open it",
                )
            raise _Failure(
                ErrorCode.ENCRYPTED,
                f"the password in {source} does not open it; put the PDF's user password there",
            )
    try:
        pages = list(reader.pages)
    except Exception as exc:
        raise _Failure(
            ErrorCode.CORRUPT_DOCUMENT, f"unreadable page tree: {_describe(exc)}"
        ) from exc
    texts: list[str] = []
    total = 0
    failures: list[str] = []
    for number, page in enumerate(pages, start=1):
        try:
            page_text = _normalise(page.extract_text() or "")
        except Exception as exc:  # one broken page does not lose the others
            failures.append(f"page {number}: {_describe(exc)}")
            continue
        if page_text:
            texts.append(page_text)
            total += len(page_text) + 2
            if total > options.max_chars + 2:
                raise _Failure(
                    ErrorCode.TOO_LARGE,
                    f"the text exceeds max_chars={options.max_chars} "
                    f"after {number} of {len(pages)} pages",
                    pages=len(pages),
                )
    if not texts:
        if failures:
            raise _Failure(
                ErrorCode.CORRUPT_DOCUMENT,
                f"no page could be read ({'; '.join(failures[:3])})",
                pages=len(pages),
            )
        raise _Failure(
            ErrorCode.NO_TEXT,
            f"no extractable text on {len(pages)} page(s); scanned pages need OCR",
            pages=len(pages),
        )
    return _finish("\n\n".join(texts), options), len(pages)


# ---- DOCX

_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
_MC_FALLBACK = "{http://schemas.openxmlformats.org/markup-compatibility/2006}Fallback"


def _docx(data: bytes, options: TextOptions) -> tuple[str, int | None]:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            with archive.open(_DOCX_PART) as part:
                _docx_text_fits(part, options.max_chars)
            xml = archive.read(_DOCX_PART)
        root = ElementTree.fromstring(xml)
    except (zipfile.BadZipFile, KeyError, ElementTree.ParseError, OSError) as exc:
        raise _Failure(ErrorCode.CORRUPT_DOCUMENT, f"unreadable DOCX: {_describe(exc)}") from exc
    body = root.find(f"{_W}body")
    if body is None:
        raise _Failure(ErrorCode.CORRUPT_DOCUMENT, f"{_DOCX_PART} has no body")
    return _finish("\n\n".join(_docx_blocks(body)), options), None


def _docx_text_fits(part: IO[bytes], max_chars: int) -> None:
    """Stream the part once, counting its text, and stop at ``max_chars``: a DOCX of a few
    MB can hold a GiB of text, which the whole-tree parse would hold several times over."""
    chars = depth = 0
    body: ElementTree.Element | None = None
    for event, elem in ElementTree.iterparse(part, events=("start", "end")):
        if event == "start":
            depth += 1
            if depth == 2:
                body = elem
            continue
        depth -= 1
        if elem.tag == f"{_W}t" and elem.text:
            chars += len(elem.text)
            if chars > max_chars:
                raise _Failure(
                    ErrorCode.TOO_LARGE, f"the text has more than max_chars={max_chars} characters"
                )
        if depth == 2 and body is not None:
            body.clear()  # a finished block of the body: counted, so let it go


def _docx_blocks(container: ElementTree.Element) -> list[str]:
    """Paragraphs and tables of a body, cell or content control, in document order."""
    blocks: list[str] = []
    for child in container:
        if child.tag == f"{_W}p":
            blocks.append("".join(_docx_runs(child)))
        elif child.tag == f"{_W}tbl":
            rows = []
            for row in child.iter(f"{_W}tr"):
                cells = [" ".join(_docx_blocks(cell)) for cell in row.findall(f"{_W}tc")]
                rows.append(" | ".join(cell.strip() for cell in cells))
            blocks.append("\n".join(rows))
        elif child.tag in (f"{_W}sdt", f"{_W}sdtContent", f"{_W}customXml"):
            blocks.extend(_docx_blocks(child))
    return blocks


def _docx_runs(element: ElementTree.Element) -> list[str]:
    parts: list[str] = []
    for child in element:
        tag = child.tag
        if tag == _MC_FALLBACK:  # the same content again, for older readers
            continue
        if tag == f"{_W}t":
            parts.append(child.text or "")
        elif tag == f"{_W}tab":
            parts.append("\t")
        elif tag in (f"{_W}br", f"{_W}cr"):
            parts.append("\n")
        elif tag == f"{_W}noBreakHyphen":
            parts.append("-")
        elif tag == f"{_W}p":  # a paragraph inside a text box
            parts.append("\n")
            parts.extend(_docx_runs(child))
            parts.append("\n")
        else:
            parts.extend(_docx_runs(child))
    return parts


# ---- HTML

_DROP_TAGS = frozenset({"script", "style", "head", "template", "noscript", "svg"})
_PARAGRAPH_TAGS = frozenset(
    {
        "p",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "table",
        "ul",
        "ol",
        "dl",
        "pre",
        "blockquote",
        "section",
        "article",
        "header",
        "footer",
        "main",
        "aside",
        "nav",
        "figure",
        "form",
        "fieldset",
        "address",
        "details",
    }
)
_LINE_TAGS = frozenset(
    {"br", "div", "li", "tr", "dt", "dd", "hr", "caption", "figcaption", "summary", "option"}
)
_CELL_TAGS = frozenset({"td", "th"})
_HTML_SPACE = re.compile(r"[ \t\n\r\f]+")


class _HtmlText(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._dropping = 0
        self._newlines = 0  # line breaks owed before the next text: 1 line, 2 paragraph

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _DROP_TAGS:
            self._dropping += 1
        elif not self._dropping:
            self._break(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if not self._dropping and tag not in _DROP_TAGS:
            self._break(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in _DROP_TAGS:
            self._dropping = max(0, self._dropping - 1)
        elif not self._dropping:
            self._break(tag)

    def handle_data(self, data: str) -> None:
        if self._dropping:
            return
        if self._newlines:
            if not data.strip():
                return
            if self.parts:
                self.parts.append("\n" * self._newlines)
            self._newlines = 0
        self.parts.append(_HTML_SPACE.sub(" ", data))

    def _break(self, tag: str) -> None:
        if tag in _PARAGRAPH_TAGS:
            self._newlines = 2
        elif tag in _LINE_TAGS:
            self._newlines = max(self._newlines, 1)
        elif tag in _CELL_TAGS:
            self.parts.append(" ")


_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.I)


def _html(data: bytes, options: TextOptions) -> tuple[str, int | None]:
    match = _META_CHARSET.search(data[:4096])
    markup = _decode(data, _declared_encoding(match.group(1)) if match else None)
    parser = _HtmlText()
    parser.feed(markup)
    parser.close()
    return _finish("".join(parser.parts), options), None


def _declared_encoding(label: bytes) -> str | None:
    try:
        name = codecs.lookup(label.decode("ascii")).name
    except LookupError:
        return None
    if name.startswith(("utf-16", "utf-32")):  # a page that decodes as ASCII is not UTF-16
        return None
    # As browsers do (WHATWG Encoding): these labels mean windows-1252.
    return "cp1252" if name in ("latin-1", "iso8859-1", "ascii") else name


# ---- JSON and JSONL


def _json(data: bytes, options: TextOptions) -> tuple[str, int | None]:
    try:
        value = json.loads(_decode(data))
    except (ValueError, RecursionError) as exc:
        raise _Failure(ErrorCode.CORRUPT_DOCUMENT, f"invalid JSON: {_describe(exc)}") from exc
    records = value if isinstance(value, list) else [value]
    return _finish(_join_records(records, options.json_text_field, "JSON"), options), None


def _jsonl(data: bytes, options: TextOptions) -> tuple[str, int | None]:
    records = []
    for number, line in enumerate(_decode(data).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except (ValueError, RecursionError) as exc:
            raise _Failure(
                ErrorCode.CORRUPT_DOCUMENT, f"invalid JSON on line {number}: {_describe(exc)}"
            ) from exc
    return _finish(_join_records(records, options.json_text_field, "JSONL"), options), None


def _join_records(records: list[object], text_field: str, what: str) -> str:
    texts = [
        _normalise(record[text_field])
        for record in records
        if isinstance(record, dict) and isinstance(record.get(text_field), str)
    ]
    texts = [text for text in texts if text]
    if not texts:
        raise _Failure(
            ErrorCode.NO_TEXT,
            f"no {what} record has a non-empty string field {text_field!r} "
            f"({len(records)} record(s)); set json_text_field to the field that holds the text",
        )
    return "\n\n".join(texts)


# ---- plain text and Markdown


def _plain(data: bytes, options: TextOptions) -> tuple[str, int | None]:
    return _finish(_decode(data), options, keep_indent=True), None


_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),  # before UTF-16 LE: its BOM starts the same way
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
_SAMPLE = 65_536
# Bytes that do not occur in text in any encoding we accept: C0 controls except
# tab, newline, vertical tab, form feed, carriage return and escape.
_CONTROL_BYTES = bytes([*range(0x01, 0x09), 0x0E, *range(0x0F, 0x1B), *range(0x1C, 0x20), 0x7F])


def _decode(data: bytes, declared: str | None = None) -> str:
    """Decode text bytes: BOM, then strict UTF-8, then a declared or detected encoding.

    Binary data raises ``unsupported_type``; text in an encoding that cannot be determined
    raises ``invalid_encoding``.
    """
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            try:
                return _check_printable(data[len(bom) :].decode(encoding))
            except UnicodeDecodeError as exc:
                raise _Failure(
                    ErrorCode.INVALID_ENCODING,
                    f"starts with a {encoding} byte order mark but is not valid {encoding}",
                ) from exc
    sample = data[:_SAMPLE]
    nuls = sample.count(0)
    if nuls:
        wide = _wide_encoding(sample)
        if wide is not None:
            try:
                return _check_printable(data.decode(wide))
            except UnicodeDecodeError as exc:
                raise _Failure(
                    ErrorCode.INVALID_ENCODING, f"looks like {wide} but is not valid {wide}"
                ) from exc
        if nuls > 0.01 * len(sample):  # a stray NUL in text is dropped by normalisation
            raise _Failure(ErrorCode.UNSUPPORTED_TYPE, "binary data (NUL bytes), not text")
    try:
        return _check_printable(data.decode("utf-8"))
    except UnicodeDecodeError:
        pass
    if len(sample.translate(None, _CONTROL_BYTES)) < 0.98 * len(sample):
        raise _Failure(ErrorCode.UNSUPPORTED_TYPE, "binary data (control bytes), not text")
    if declared:
        try:
            return _check_printable(data.decode(declared))
        except (LookupError, UnicodeDecodeError):
            pass  # a wrong declaration is common; detect instead
    detected = _detect_encoding(data)
    if detected is None:
        raise _Failure(
            ErrorCode.INVALID_ENCODING,
            "not valid UTF-8 and no other encoding fits; re-encode the file as UTF-8",
        )
    return _check_printable(data.decode(detected))


def _wide_encoding(sample: bytes) -> str | None:
    """UTF-32 or UTF-16 without a byte order mark, told by where the NUL bytes sit."""
    usable = len(sample) - len(sample) % 4
    if usable >= 4:
        lanes = [sample[lane:usable:4] for lane in range(4)]
        if lanes[2].count(0) == len(lanes[2]) and lanes[3].count(0) == len(lanes[3]):
            return "utf-32-le"
        if lanes[0].count(0) == len(lanes[0]) and lanes[1].count(0) == len(lanes[1]):
            return "utf-32-be"
    usable = len(sample) - len(sample) % 2
    if usable >= 2:
        even, odd = sample[0:usable:2], sample[1:usable:2]
        half = usable // 2
        if odd.count(0) > 0.3 * half and even.count(0) < 0.05 * half:
            return "utf-16-le"
        if even.count(0) > 0.3 * half and odd.count(0) < 0.05 * half:
            return "utf-16-be"
    return None


def _detect_encoding(data: bytes) -> str | None:
    from charset_normalizer import from_bytes
    from charset_normalizer.md import mess_ratio

    best = from_bytes(data).best()
    # charset-normalizer often misnames short Western text (cp1257, johab, ...); when
    # Windows-1252 reads it about as cleanly, take it: the most common legacy encoding.
    try:
        western = mess_ratio(data[:_SAMPLE].decode("cp1252"), maximum_threshold=1.0)
    except UnicodeDecodeError:
        western = math.inf
    best_chaos = best.chaos if best is not None else 0.0
    if western <= 0.2 and western <= best_chaos + 0.1:
        return "cp1252"
    return best.encoding if best is not None else None


_CONTROL_CHARS = re.compile(r"[\x00-\x08\x0e-\x1a\x1c-\x1f\x7f-\x9f]")


def _check_printable(text: str) -> str:
    sample = text[:_SAMPLE]
    if len(_CONTROL_CHARS.findall(sample)) > 0.05 * len(sample):
        raise _Failure(ErrorCode.UNSUPPORTED_TYPE, "binary data (unprintable characters), not text")
    return text


_EXTRACTORS = {
    "pdf": _pdf,
    "docx": _docx,
    "html": _html,
    "json": _json,
    "jsonl": _jsonl,
    "text": _plain,
    "markdown": _plain,
}


# ---- whitespace


def _translation() -> dict[int, str | None]:
    table: dict[int, str | None] = {}
    for code in (*range(0x00, 0x09), *range(0x0E, 0x20), 0x7F):  # C0 controls but \t\n\v\f\r
        table[code] = None
    for code in (*range(0x80, 0xA0),):  # C1 controls
        table[code] = None
    table[0x0B] = "\n"  # vertical tab
    table[0x0C] = "\n"  # form feed: PDF and text page breaks
    table[0x2028] = "\n"  # line separator
    table[0x2029] = "\n\n"  # paragraph separator
    for code in (0x00AD, 0x200B, 0x200C, 0x200D, 0x2060, 0xFEFF):  # soft hyphen, zero-width
        table[code] = None
    for code in (0x00A0, 0x1680, *range(0x2000, 0x200B), 0x202F, 0x205F, 0x3000):
        table[code] = " "  # every other Unicode space
    for code, letters in {
        0xFB00: "ff",
        0xFB01: "fi",
        0xFB02: "fl",
        0xFB03: "ffi",
        0xFB04: "ffl",
    }.items():
        table[code] = letters  # ligatures from PDF fonts break search and tokenisers
    return table


_TRANSLATION = _translation()
# Literal patterns: the regex engine scans for them at C speed; character classes and
# lookbehinds made normalising 1 MB of text take 150 ms instead of 15.
_SPACE_RUN = re.compile("  +")
_BLANK_LINES = re.compile("\n\n\n+")


def _normalise(text: str, *, keep_indent: bool = False) -> str:
    """One space between words, single newlines kept, at most one blank line in a row.

    ``keep_indent`` keeps leading whitespace (Markdown code blocks and nested lists).
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = unicodedata.normalize("NFC", text).translate(_TRANSLATION)
    if keep_indent:
        text = _SPACE_RUN.sub(_collapse_inner_space, text.replace("\t", "    "))
    else:
        text = _SPACE_RUN.sub(" ", text.replace("\t", " ")).replace("\n ", "\n")
    text = _BLANK_LINES.sub("\n\n", text.replace(" \n", "\n"))
    return text.strip("\n").rstrip(" ") if keep_indent else text.strip()


def _collapse_inner_space(match: re.Match[str]) -> str:
    text, start, end = match.string, match.start(), match.end()
    if end == len(text) or text[end] == "\n":
        return ""  # trailing
    if start == 0 or text[start - 1] == "\n":
        return match.group()  # indentation
    return " "
