"""Bytes to text for each document type overnight reads, with a time limit per document.

The storage layer hands over an object's bytes and its name; this module never opens URLs.
Every input ends as a :class:`TextResult`: bad input becomes an error code from
:mod:`schemas.errors`, never an exception.

Why a child process: parsers (of PDFs above all) can spin for minutes or exhaust memory on a
hostile or broken file, and a Python thread cannot be stopped. Each process that calls
:func:`extract_text` (a Ray worker, a test) therefore owns one long-lived extractor child,
started on first use with ``subprocess`` (fork+exec, so none of the parent's threads, locks or
gRPC state is inherited, which matters inside Ray workers) and fed documents over a pipe.
The common case costs one pickle round trip, well under a millisecond. When a document
exceeds ``timeout_s`` the child is killed and the next document starts a fresh one (about
half a second, not counted against that document's time limit).

The modules: ``core`` (options, result, failure), ``sandbox`` (the child process, parent and
child side), ``formats`` (type detection and one extractor per type), ``encoding`` (bytes to
str), ``normalize`` (whitespace and the checks every text passes).
"""

from overnight.workers.text.core import (
    KINDS,
    ExtractorUnavailable,
    InvalidTextOptions,
    TextOptions,
    TextResult,
)
from overnight.workers.text.formats import DOCUMENT_EXTENSIONS
from overnight.workers.text.sandbox import extract_text

__all__ = [
    "DOCUMENT_EXTENSIONS",
    "KINDS",
    "ExtractorUnavailable",
    "InvalidTextOptions",
    "TextOptions",
    "TextResult",
    "extract_text",
]
