"""Specifications for the report's engine (DuckDB, exact sums): the same tables as the former
Python loops, on flat and partitioned files, legacy ledgers, outputs given twice, and every
grouping and scope; and sums exact where floats are not.

The former loops are read from git history at a pinned commit (``scripts/bench_report.py``'s
``legacy_report``), not kept in the tree; without git or that commit (a shallow clone) the
comparison is skipped, and tests/jobs/ops/test_report.py still reconciles the main table, the
failures and the reserved time with the ledgers themselves. The comparison stays because it is
the only check of every table, float for float, under every scope (--until, --tenant) and with
one output given twice."""

from __future__ import annotations

import math
import random
import shutil
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from overnight.jobs.ops.report import build_report, load, parse_since, parse_until
from overnight.jobs.ops.report.aggregate import _Exact, _split
from tests.conftest import load_script
from tests.jobs.ops.test_report import (
    DAY1,
    DAY2,
    DAY3,
    _document_rows,
    _speech_rows,
    _write_run,
)

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def legacy() -> Any:
    """The report's aggregation before #38, from git history (skipped where it is not)."""
    bench = load_script("bench_report")
    try:
        return bench.legacy_report(REPO)
    except bench.LegacyUnavailable as exc:
        pytest.skip(f"no former report to compare with: {exc}")


def _move_into_partition(flat: Path, into: Path, night: str) -> None:
    """The flat files of output ``flat`` moved into output ``into`` under run_date=night/."""
    for name in ("transcripts", "results", "costs"):
        for f in sorted((flat / name).glob("*.parquet")) if (flat / name).is_dir() else []:
            folder = into / name / f"run_date={night}"
            folder.mkdir(parents=True, exist_ok=True)
            shutil.move(f, folder / f.name)
    for f in (flat / "runs").glob("*.json"):
        shutil.move(f, into / "runs" / f.name)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> list[str]:
    """An output with flat files of older runs and a partition of a newer one, an output
    whose ledger is from before schema 6, and the first output again under another path."""
    root = tmp_path_factory.mktemp("engine")
    a, b, new = root / "mixed", root / "legacy", root / "new"
    _write_run(a, "night-1", "transcribe", _speech_rows("night-1", 23, 1, DAY1, "h100"), DAY1, 14.0)
    _write_run(a, "docs-1", "process", _document_rows("docs-1", 6, DAY2), DAY2, 9.0)
    _write_run(
        new, "night-2", "transcribe", _speech_rows("night-2", 31, 2, DAY2, "h100"), DAY2, 17.5
    )
    _move_into_partition(new, a, "2026-11-30")  # a backfill: filed under the night before
    _write_run(b, "cpu-1", "transcribe", _speech_rows("cpu-1", 11, 3, DAY3, "cpu"), DAY3, 40.0)
    for f in (b / "costs").rglob("*.parquet"):  # a ledger from before schema 6
        pq.write_table(pq.read_table(f).drop_columns(["model_stage", "work"]), f)
    (root / "again").symlink_to(a)  # one output given twice
    return [str(a), str(b), str(root / "again")]


SCOPES = [
    {},
    {"since": "2026-12-01"},
    {"until": "2026-11-30"},
    {"since": "2026-11-30T12:00:00", "until": "2026-12-02"},
    {"tenant": "acme"},
]


@pytest.mark.parametrize("scope", SCOPES, ids=lambda s: ",".join(s) or "all")
@pytest.mark.parametrize("by", ["day", "tenant", "submission", "model", "run"])
def test_the_engine_gives_the_tables_of_the_python_loops(outputs, legacy, by, scope):
    since, until = parse_since(scope.get("since")), parse_until(scope.get("until"))
    tenant = scope.get("tenant")
    new = build_report(load(outputs, since, until), by, since, until, tenant)
    old = legacy.build_report(legacy.load(outputs, since, until), by, since, until, tenant)
    assert list(new.tables) == list(old.tables)
    for name, table in new.tables.items():
        if "sources" in table.column_names:  # newer than the loops; test_report.py checks it
            table = table.drop_columns(["sources"])
        assert table.schema == old.tables[name].schema, name
        assert table.to_pylist() == old.tables[name].to_pylist(), name
    assert (new.first_recorded, new.last_recorded) == (old.first_recorded, old.last_recorded)
    assert new.notes == old.notes and new.notes  # the output given twice is noted


def test_exact_sums_equal_fsum_bit_for_bit_where_a_float_sum_does_not():
    rng = random.Random(38)
    values = [rng.uniform(0, 1) * 10 ** rng.randint(-12, 6) for _ in range(20_000)]
    values += [1e16, 1.0, -1e16, 1e-300, 5e-324, 0.0]  # cancellation, tiny and subnormal
    import pyarrow as pa

    mantissa, exponent = _split(pa.array(values))
    exact = _Exact()
    for m, e in zip(mantissa.to_pylist(), exponent.to_pylist(), strict=True):
        exact.add(e, m)
    assert exact.value() == math.fsum(values)
    assert sum(values) != math.fsum(values)  # the naive sum differs here
