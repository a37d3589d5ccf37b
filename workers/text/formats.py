"""Bytes to text per document type (PDF, DOCX, HTML, JSON, JSONL, plain text and Markdown),
and the detection of the type from magic bytes and the name. Runs inside the extractor child
(:mod:`workers.text.sandbox`); every bad input raises :class:`Failure` with its error code."""

from __future__ import annotations

import codecs
import io
import json
import re
import zipfile
from html.parser import HTMLParser
from pathlib import PurePosixPath
from typing import IO, TYPE_CHECKING
from xml.etree import ElementTree

from overnight.schemas.errors import ErrorCode
from overnight.workers.text.core import Failure, TextOptions, describe
from overnight.workers.text.encoding import decode
from overnight.workers.text.normalize import finish, normalise

if TYPE_CHECKING:
    import pypdfium2

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
# (jobs.dataset.manifest.Selection); a manifest row is a document whatever its name.
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


def guess_kind(data: bytes, name: str) -> str:
    """Cheap guess from magic bytes and extension only, for results the child never saw."""
    if data.startswith(b"%PDF"):
        return "pdf"
    return _EXTENSIONS.get(_extension(name), "unknown")


def detect_kind(data: bytes, name: str) -> str:
    ext = _extension(name)
    if data.startswith(b"%PDF"):
        return "pdf"
    if data.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                is_docx = _DOCX_PART in archive.namelist()
        except (zipfile.BadZipFile, ValueError, OSError) as exc:
            if ext == ".docx":
                raise Failure(
                    ErrorCode.CORRUPT_DOCUMENT, f"broken DOCX zip container: {describe(exc)}"
                ) from exc
            raise Failure(ErrorCode.UNSUPPORTED_TYPE, "a broken zip archive") from exc
        if is_docx:
            return "docx"
        if ext == ".docx":
            raise Failure(ErrorCode.CORRUPT_DOCUMENT, f"a zip file without {_DOCX_PART}")
        raise Failure(
            ErrorCode.UNSUPPORTED_TYPE,
            f"a zip archive without {_DOCX_PART} (e.g. .xlsx, .pptx, .odt or plain .zip)",
        )
    for magic, what in _UNSUPPORTED_MAGIC:
        if data.startswith(magic):
            raise Failure(ErrorCode.UNSUPPORTED_TYPE, f"{what}, not a supported document")
    if ext in _EXTENSIONS:
        return _EXTENSIONS[ext]
    head = data[:512].lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    if head.startswith((b"<!doctype html", b"<html")):
        return "html"
    return "text"


# ---- PDF


# PDFium's load errors (FPDF_GetLastError): a password is missing or wrong; the security
# handler is one PDFium does not implement.
_PDFIUM_PASSWORD = 4
_PDFIUM_SECURITY = 5


def _pdf(data: bytes, options: TextOptions) -> tuple[str, int | None]:
    # PDFium (Chrome's PDF engine) through pypdfium2: 6 ms where pypdf took 60 ms on the
    # shared 4-page LaTeX PDF, the same words (scripts/compare_pdf_text.py).
    import pypdfium2 as pdfium

    document = None
    # An empty user password (owner-only restrictions) opens without configuration.
    for password in ("", options.pdf_password):
        if password is None:
            continue
        try:
            document = pdfium.PdfDocument(data, password=password)
            break
        except pdfium.PdfiumError as exc:
            if _opens_without_pages(data, password):
                raise Failure(
                    ErrorCode.NO_TEXT, "the PDF has no pages: there is no text to read", pages=0
                ) from exc
            if exc.err_code == _PDFIUM_SECURITY:
                raise Failure(
                    ErrorCode.ENCRYPTED, f"the PDF's encryption is not supported: {describe(exc)}"
                ) from exc
            if exc.err_code != _PDFIUM_PASSWORD:
                raise Failure(
                    ErrorCode.CORRUPT_DOCUMENT, f"unreadable PDF: {describe(exc)}"
                ) from exc
    if document is None:
        source = options.pdf_password_source
        if options.pdf_password is None:
            raise Failure(
                ErrorCode.ENCRYPTED,
                f"the PDF is encrypted; put its password in {source} and rerun with "
                "--retry-errors encrypted to open it",
            )
        raise Failure(
            ErrorCode.ENCRYPTED,
            f"the password in {source} does not open it; put the PDF's user password there",
        )
    with document:
        return _pdf_pages(document, options)


def _opens_without_pages(data: bytes, password: str) -> bool:
    """Whether PDFium opens ``data`` and finds no page in it (a page tree of /Count 0, or
    none). pypdfium2 takes such a document for one that failed to load, with PDFium's last
    error as the reason, which this load never sets: the row read "unreadable PDF: Failed to
    load document (PDFium: Success)", or ``encrypted`` after an encrypted PDF in the same
    extractor process (pypdfium2 5.15)."""
    import pypdfium2.raw as pdfium_c

    handle = pdfium_c.FPDF_LoadMemDocument64(data, len(data), (password + "\x00").encode())
    if not handle:
        return False  # it did fail to load: PDFium's error is this load's own
    try:
        return bool(pdfium_c.FPDF_GetPageCount(handle) < 1)
    finally:
        pdfium_c.FPDF_CloseDocument(handle)


def _pdf_pages(document: pypdfium2.PdfDocument, options: TextOptions) -> tuple[str, int | None]:
    pages = len(document)
    texts: list[str] = []
    total = 0
    failures: list[str] = []
    for number in range(1, pages + 1):
        try:
            page = document[number - 1]
            raw = page.get_textpage().get_text_range()
        except Exception as exc:  # one broken page does not lose the others
            failures.append(f"page {number}: {describe(exc)}")
            continue
        # PDFium writes a hyphen that ends a line as U+FFFE and drops the line break; put
        # back what the page shows, as the other formats keep it.
        page_text = normalise(raw.replace("\ufffe", "-\n"))
        if page_text:
            texts.append(page_text)
            total += len(page_text) + 2
            if total > options.max_chars + 2:
                raise Failure(
                    ErrorCode.TOO_LARGE,
                    f"the text exceeds max_chars={options.max_chars} "
                    f"after {number} of {pages} pages",
                    pages=pages,
                )
    if not texts:
        if failures:
            raise Failure(
                ErrorCode.CORRUPT_DOCUMENT,
                f"no page could be read ({'; '.join(failures[:3])})",
                pages=pages,
            )
        raise Failure(
            ErrorCode.NO_TEXT,
            f"no extractable text on {pages} page(s); scanned pages need OCR",
            pages=pages,
        )
    return finish("\n\n".join(texts), options), pages


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
        raise Failure(ErrorCode.CORRUPT_DOCUMENT, f"unreadable DOCX: {describe(exc)}") from exc
    body = root.find(f"{_W}body")
    if body is None:
        raise Failure(ErrorCode.CORRUPT_DOCUMENT, f"{_DOCX_PART} has no body")
    return finish("\n\n".join(_docx_blocks(body)), options), None


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
                raise Failure(
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
    markup = decode(data, _declared_encoding(match.group(1)) if match else None)
    parser = _HtmlText()
    parser.feed(markup)
    parser.close()
    return finish("".join(parser.parts), options), None


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
        value = json.loads(decode(data))
    except (ValueError, RecursionError) as exc:
        raise Failure(ErrorCode.CORRUPT_DOCUMENT, f"invalid JSON: {describe(exc)}") from exc
    records = value if isinstance(value, list) else [value]
    return finish(_join_records(records, options.json_text_field, "JSON"), options), None


def _jsonl(data: bytes, options: TextOptions) -> tuple[str, int | None]:
    records = []
    for number, line in enumerate(decode(data).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except (ValueError, RecursionError) as exc:
            raise Failure(
                ErrorCode.CORRUPT_DOCUMENT, f"invalid JSON on line {number}: {describe(exc)}"
            ) from exc
    return finish(_join_records(records, options.json_text_field, "JSONL"), options), None


def _join_records(records: list[object], text_field: str, what: str) -> str:
    texts = [
        normalise(record[text_field])
        for record in records
        if isinstance(record, dict) and isinstance(record.get(text_field), str)
    ]
    texts = [text for text in texts if text]
    if not texts:
        raise Failure(
            ErrorCode.NO_TEXT,
            f"no {what} record has a non-empty string field {text_field!r} "
            f"({len(records)} record(s)); set json_text_field to the field that holds the text",
        )
    return "\n\n".join(texts)


# ---- plain text and Markdown


def _plain(data: bytes, options: TextOptions) -> tuple[str, int | None]:
    return finish(decode(data), options, keep_indent=True), None


EXTRACTORS = {
    "pdf": _pdf,
    "docx": _docx,
    "html": _html,
    "json": _json,
    "jsonl": _jsonl,
    "text": _plain,
    "markdown": _plain,
}
