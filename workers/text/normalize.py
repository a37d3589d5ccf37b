"""Whitespace and invisible characters, the same for every document type, and the checks
every extracted text passes (``no_text``, ``too_large``)."""

from __future__ import annotations

import re
import unicodedata

from overnight.schemas.errors import ErrorCode
from overnight.workers.text.core import Failure, TextOptions


def finish(text: str, options: TextOptions, *, keep_indent: bool = False) -> str:
    """Normalise whitespace and apply the no_text and too_large checks."""
    text = normalise(text, keep_indent=keep_indent)
    if not text:
        raise Failure(ErrorCode.NO_TEXT, "the document contains only whitespace")
    if len(text) > options.max_chars:
        raise Failure(
            ErrorCode.TOO_LARGE,
            f"the text has {len(text)} characters, more than max_chars={options.max_chars}",
        )
    return text


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


def normalise(text: str, *, keep_indent: bool = False) -> str:
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
