"""Explicit pyarrow schemas for every Parquet file overnight writes, and the error codes.

Nothing here imports from ``jobs`` or ``workers``: this package is the contract both sides
depend on. Bump ``SCHEMA_VERSION`` on any change to a schema; readers check it through the
``overnight.schema_version`` metadata key that every file carries.
"""

from schemas.errors import ERROR_CODES, ErrorCode
from schemas.tables import (
    COSTS,
    DOCUMENT_RESULTS,
    MANIFEST,
    METADATA_COLUMNS,
    PROBES,
    SCHEMA_VERSION,
    SEGMENT,
    TRANSCRIPTS,
    with_version,
)

__all__ = [
    "COSTS",
    "DOCUMENT_RESULTS",
    "ERROR_CODES",
    "MANIFEST",
    "METADATA_COLUMNS",
    "PROBES",
    "SCHEMA_VERSION",
    "SEGMENT",
    "TRANSCRIPTS",
    "ErrorCode",
    "with_version",
]
