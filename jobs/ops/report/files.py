"""Writing the report's tables as files: csv (safe for spreadsheets), parquet, or the HTML page."""

from __future__ import annotations

import csv
import io
import os

import pyarrow as pa
import pyarrow.parquet as pq

from overnight.jobs.choices import REPORT_FORMATS as FORMATS
from overnight.jobs.dataset import storage
from overnight.jobs.errors import ConfigError, OutputNotWritable
from overnight.jobs.ops.report.aggregate import Report
from overnight.jobs.ops.report.html import render_html

# A spreadsheet runs a cell that starts with one of these as a formula (=HYPERLINK(...)
# exfiltrates the sheet): tenant, submission and model names are tenant-controlled text.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _csv_cell(value: object) -> object:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value  # OWASP: a leading quote makes the cell text
    return value


def _csv_bytes(table: pa.Table) -> bytes:
    """CSV with floats written by ``repr`` (shortest text that round-trips exactly) and text
    that a spreadsheet would run as a formula escaped."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([_csv_cell(name) for name in table.column_names])
    for row in table.to_pylist():
        writer.writerow([_csv_cell(v) for v in row.values()])
    return buf.getvalue().encode()


def write(report: Report, fmt: str, out: str | None) -> list[str]:
    """Write the report; returns the URLs written (nothing for ``table``)."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if fmt == "table":
        return []
    if not out:
        raise ConfigError(
            f"--format {fmt} writes files: give --out (a file for html, a folder for csv/parquet)"
        )
    loc = storage.resolve(out)
    if fmt == "html":
        if loc.scheme == "file" and os.path.isdir(loc.path):
            # Renamed over a folder, the page was IsADirectoryError's traceback.
            raise OutputNotWritable(
                f"cannot write {loc.path}: it is a folder; --format html writes one file, "
                "give its name (report.html)"
            )
        storage.write_bytes_atomic(loc, render_html(report).encode())
        return [loc.url()]
    written = []
    for name, table in report.tables.items():
        target = loc.join(f"{name}.{fmt}")
        if fmt == "csv":
            data = _csv_bytes(table)
        else:
            buf = io.BytesIO()
            pq.write_table(table, buf)
            data = buf.getvalue()
        storage.write_bytes_atomic(target, data)
        written.append(target.url())
    return written
