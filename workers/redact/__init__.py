"""PII/PCI redaction of transcripts rows: ``Redactor(types).redact(row)``.

``types`` names what to look for; ``speech`` holds our recognizers for Whisper's output
(digits split over words and turns, spelled-out digits, names, addresses, dates), and
``presidio`` Presidio's for written patterns (e-mail, phone, SSN, card numbers with Luhn).
Presidio and spaCy load on first use, in the process that redacts (never on import).
"""

from typing import Any

from overnight.workers.redact.types import (
    PRESETS,
    TYPES,
    RedactionConfigError,
    resolve_types,
    tag,
)

__all__ = ["PRESETS", "TYPES", "Entity", "RedactionConfigError", "Redactor", "resolve_types", "tag"]


def __getattr__(name: str) -> Any:
    # The recognizers (and text2num) load on first use: the command line reads the type
    # names from .types for --help, and must not pay for, or depend on, the rest.
    if name in ("Entity", "Redactor"):
        from overnight.workers.redact import redactor

        return getattr(redactor, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
