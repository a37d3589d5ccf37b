"""The entity types redaction knows, its presets, and their resolution from a job's list.

Light on purpose (no Presidio, no spaCy): the job spec imports it to validate ``redact``.
"""

from __future__ import annotations

from collections.abc import Iterable

# In the order the tags and the entities list name them.
TYPES: tuple[str, ...] = (
    "card_number",
    "cvv",
    "expiry",
    "ssn",
    "bank_account",
    "phone",
    "email",
    "person",
    "address",
    "date_of_birth",
)
PRESETS: dict[str, tuple[str, ...]] = {
    # What PCI DSS forbids storing after authorization, plus the account numbers that go with it.
    "pci": ("card_number", "cvv", "expiry", "bank_account"),
    "all": TYPES,
}


class RedactionConfigError(ValueError):
    """A ``redact`` list naming a type or preset that does not exist."""


def resolve_types(names: Iterable[str]) -> tuple[str, ...]:
    """Types and presets (``pci``, ``all``), case-insensitive, in ``TYPES`` order; an unknown
    name raises with the known ones listed."""
    chosen: set[str] = set()
    for raw in names:
        name = raw.strip().lower().replace("-", "_")
        if not name:
            continue
        if name in PRESETS:
            chosen.update(PRESETS[name])
        elif name in TYPES:
            chosen.add(name)
        else:
            raise RedactionConfigError(
                f"unknown redaction type {raw!r}; known types: {', '.join(TYPES)}; presets: "
                f"{', '.join(PRESETS)}"
            )
    return tuple(t for t in TYPES if t in chosen)


def tag(entity_type: str) -> str:
    """The text an entity of this type is replaced by: ``[CARD_NUMBER]``."""
    return f"[{entity_type.upper()}]"
