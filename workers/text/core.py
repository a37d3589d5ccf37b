"""What every part of :mod:`workers.text` shares: the options, the result, and the
per-document failure that becomes an error code."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from overnight.schemas.errors import ErrorCode

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


class Failure(Exception):
    """A per-document failure with its error code."""

    def __init__(self, code: ErrorCode, message: str, pages: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.pages = pages


def describe(exc: BaseException) -> str:
    detail = str(exc).strip()
    return f"{type(exc).__name__}: {detail[:200]}" if detail else type(exc).__name__
