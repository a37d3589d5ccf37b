"""Explicit pyarrow schemas for every Parquet file overnight writes, and the error codes.

Nothing here imports from ``jobs`` or ``workers``: this package is the contract both sides
depend on. Bump ``SCHEMA_VERSION`` on any change to a schema; readers check it through the
``overnight.schema_version`` metadata key that every file carries.

The schemas load (with pyarrow) on first use, so that ``schemas.errors`` alone stays light:
the command line and the task registry read the error codes and task names without pyarrow.
"""

from typing import TYPE_CHECKING, Any

from overnight.schemas.errors import ERROR_CODES, ErrorCode

if TYPE_CHECKING:
    from overnight.schemas.tables import (
        COSTS,
        DOCUMENT_RESULTS,
        MANIFEST,
        METADATA_COLUMNS,
        PROBES,
        RUNS,
        SCHEMA_VERSION,
        SEGMENT,
        TRANSCRIPTS,
        TRANSCRIPTS_UNREDACTED,
        with_version,
    )

__all__ = [
    "COSTS",
    "DOCUMENT_RESULTS",
    "ERROR_CODES",
    "MANIFEST",
    "METADATA_COLUMNS",
    "PROBES",
    "RUNS",
    "SCHEMA_VERSION",
    "SEGMENT",
    "TRANSCRIPTS",
    "TRANSCRIPTS_UNREDACTED",
    "ErrorCode",
    "with_version",
]

_TABLES = frozenset(__all__) - {"ERROR_CODES", "ErrorCode"}  # loaded from tables.py on use


def __getattr__(name: str) -> Any:
    if name in _TABLES:
        from overnight.schemas import tables

        return getattr(tables, name)
    raise AttributeError(f"module 'schemas' has no attribute {name!r}")
