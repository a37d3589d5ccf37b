"""PII/PCI redaction of transcripts rows: ``Redactor(types).redact(row)``.

``types`` names what to look for; ``speech`` holds our recognizers for Whisper's output
(digits split over words and turns, spelled-out digits, names, addresses, dates), and
``presidio`` Presidio's for written patterns (e-mail, phone, SSN, card numbers with Luhn).
Presidio and spaCy load on first use, in the process that redacts (never on import).
"""

from overnight.workers.redact.redactor import Entity, Redactor
from overnight.workers.redact.types import (
    PRESETS,
    TYPES,
    RedactionConfigError,
    resolve_types,
    tag,
)

__all__ = ["PRESETS", "TYPES", "Entity", "RedactionConfigError", "Redactor", "resolve_types", "tag"]
