"""Specifications for reading an OUTPUT across an upgrade (docs/reading-outputs.md, `overnight views`).

One output holds files of the current schema and of the previous ones side by side: transcripts
of version 4 (no ``degenerate``, neither on the row nor in its segments) and costs of version 5
(no ``model_stage``, ``work``). Each documented reader call, and each DuckDB view `overnight views` prints,
gives every column of the current schema, null on the old rows. DuckDB, Polars and pandas are
in the dev lock (requirements/dev.txt); a reader whose package is missing is skipped.
"""

from __future__ import annotations

import glob
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from overnight.jobs.cli import main
from overnight.schemas import COSTS, DOCUMENT_RESULTS, PROBES, RUNS, SEGMENT, TRANSCRIPTS

OLD, NEW = date(2026, 11, 30), date(2026, 12, 1)
T0 = datetime(2026, 12, 1, 2, tzinfo=UTC)


def _views(capsys: pytest.CaptureFixture[str], output: object, *args: str) -> str:
    """What `overnight views OUTPUT ARGS` prints."""
    capsys.readouterr()
    assert main(["views", str(output), *args]) == 0
    return capsys.readouterr().out


def _old(schema: pa.Schema, version: str, drop: set[str], **retyped: pa.DataType) -> pa.Schema:
    fields = [
        schema.field(f.name).with_type(retyped[f.name]) if f.name in retyped else f
        for f in schema
        if f.name not in drop
    ]
    meta = {**(schema.metadata or {}), b"overnight.schema_version": version.encode()}
    return pa.schema(fields, metadata=meta)


# Version 4: transcripts had no `degenerate`, on the row or in a segment (version 5 added both).
TRANSCRIPTS_V4 = _old(
    TRANSCRIPTS,
    "4",
    {"degenerate"},
    segments=pa.list_(pa.struct([f for f in SEGMENT if f.name != "degenerate"])),
)
# Version 5: the ledger had no `model_stage` and `work` (version 6 added them).
COSTS_V5 = _old(COSTS, "5", {"model_stage", "work"})


def _write(out: Path, dataset: str, night: date, schema: pa.Schema, rows: list[dict]) -> None:
    folder = out / dataset / f"run_date={night.isoformat()}"
    folder.mkdir(parents=True, exist_ok=True)
    full = [{**dict.fromkeys(schema.names), **r} for r in rows]
    pq.write_table(pa.Table.from_pylist(full, schema=schema), folder / "part-0.parquet")


def _transcript(item: str, **kw: Any) -> dict:
    return {
        "item_id": item,
        "source_uri": f"s3://calls/{item}.wav",
        "status": "ok",
        "run_id": "r-" + item,
        **kw,
    }


def _cost(item: str, **kw: Any) -> dict:
    return {
        "item_id": item,
        "run_id": "r-" + item,
        "stage": "transcribe",
        "resource": "h100",
        "cost_usd": 0.01,
        "recorded_at": T0,
        **kw,
    }


@pytest.fixture
def output(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    _write(
        out,
        "transcripts",
        OLD,
        TRANSCRIPTS_V4,
        [_transcript("old", segments=[{"start": 0.0, "end": 1.0, "text": "hello"}])],
    )
    _write(
        out,
        "transcripts",
        NEW,
        TRANSCRIPTS,
        [
            _transcript(
                "new",
                degenerate=True,
                segments=[{"start": 0.0, "end": 1.0, "text": "la la", "degenerate": True}],
            )
        ],
    )
    _write(out, "costs", OLD, COSTS_V5, [_cost("old")])
    _write(out, "costs", NEW, COSTS, [_cost("new", model_stage=True, work="audio")])
    _write(
        out,
        "results",
        NEW,
        DOCUMENT_RESULTS,
        [{"item_id": "d", "source_uri": "s3://docs/d.pdf", "status": "ok", "run_id": "r-d"}],
    )
    _write(out, "run_table", NEW, RUNS, [{"run_id": "r-new", "kind": "transcribe"}])
    return out


def _check(rows: list[dict], dataset: str) -> None:
    """Every column of the current schema and run_date; the old row's new columns null."""
    by_item = {r["item_id"]: r for r in rows}
    assert set(by_item) == {"old", "new"}
    schema = TRANSCRIPTS if dataset == "transcripts" else COSTS
    for row in rows:
        assert set(schema.names) | {"run_date"} <= set(row), set(schema.names) - set(row)
    old, new = by_item["old"], by_item["new"]
    assert str(old["run_date"]) == OLD.isoformat() and str(new["run_date"]) == NEW.isoformat()
    if dataset == "transcripts":
        assert old["degenerate"] is None and new["degenerate"] is True
        assert old["segments"][0]["degenerate"] is None
        assert old["segments"][0]["text"] == "hello"
        assert new["segments"][0]["degenerate"] is True
    else:
        assert old["model_stage"] is None and old["work"] is None
        assert new["model_stage"] is True and new["work"] == "audio"
        assert old["cost_usd"] == new["cost_usd"] == 0.01


@pytest.mark.parametrize("dataset", ["transcripts", "costs"])
def test_duckdb_read_parquet_with_union_by_name_keeps_the_new_columns(output: Path, dataset):
    duckdb = pytest.importorskip("duckdb")
    rel = duckdb.sql(
        f"select * from read_parquet('{output}/{dataset}/run_date=*/*.parquet', "
        "hive_partitioning = true, union_by_name = true)"
    )
    _check(rel.to_arrow_table().to_pylist(), dataset)


@pytest.mark.parametrize("dataset", ["transcripts", "costs"])
def test_duckdb_views_read_both_versions_with_every_column(
    output: Path, dataset: str, capsys: pytest.CaptureFixture[str]
):
    duckdb = pytest.importorskip("duckdb")
    con = duckdb.connect()
    # no --dataset: the views of the datasets the output holds (it has no probes)
    sql = _views(capsys, output, "--engine", "duckdb")
    assert "CREATE OR REPLACE VIEW probes" not in sql
    con.execute(sql)
    _check(con.sql(f"select * from {dataset}").to_arrow_table().to_pylist(), dataset)
    # a run_date filter opens only that night's files
    assert con.execute(
        f"select count(*) from {dataset} where run_date = DATE '{OLD}'"
    ).fetchall() == [(1,)]
    plan = "".join(
        r[1]
        for r in con.sql(
            f"explain select * from {dataset} where run_date = DATE '{OLD}'"
        ).fetchall()
    )
    assert "Scanning Files: 1/2" in plan, plan
    assert con.execute("select count(*) from results").fetchall() == [(1,)]
    assert con.execute("select run_id from run_table").fetchall() == [("r-new",)]


def test_a_duckdb_view_has_the_current_columns_before_any_file_has_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    duckdb = pytest.importorskip("duckdb")
    out = tmp_path / "out"
    _write(out, "costs", OLD, COSTS_V5, [_cost("old")])
    monkeypatch.chdir(tmp_path)  # a relative OUTPUT is written in as an absolute path
    sql = _views(capsys, "out", "--engine", "duckdb", "--dataset", "costs")
    assert f"'{out}/costs/run_date=[0-9][0-9][0-9][0-9]-[01][0-9]-[0-3][0-9]/*.parquet'" in sql
    con = duckdb.connect()
    con.execute(sql)
    rows = con.sql("select * from costs").to_arrow_table().to_pylist()
    assert rows[0]["model_stage"] is None and rows[0]["work"] is None
    assert con.sql("select * from costs").columns == [*COSTS.names, "run_date"]


@pytest.mark.parametrize("dataset", ["transcripts", "costs"])
def test_polars_scan_with_the_current_schema_inserts_missing_columns(output: Path, dataset: str):
    pl = pytest.importorskip("polars")
    schema = TRANSCRIPTS if dataset == "transcripts" else COSTS
    frame = pl.scan_parquet(
        f"{output}/{dataset}/run_date=*/*.parquet",
        hive_partitioning=True,
        schema=pl.from_arrow(schema.empty_table()).schema,
        missing_columns="insert",
        extra_columns="ignore",
        cast_options=pl.ScanCastOptions(
            missing_struct_fields="insert", extra_struct_fields="ignore"
        ),
    ).collect()
    _check(frame.to_dicts(), dataset)


def test_polars_without_a_schema_fails_as_the_issue_says(output: Path):
    pl = pytest.importorskip("polars")
    with pytest.raises(pl.exceptions.SchemaError):
        pl.scan_parquet(f"{output}/costs/run_date=*/*.parquet", hive_partitioning=True).collect()


@pytest.mark.parametrize("dataset", ["transcripts", "costs"])
def test_pyarrow_dataset_with_the_unified_schema_reads_both_versions(output: Path, dataset):
    files = sorted(glob.glob(f"{output}/{dataset}/run_date=*/*.parquet"))
    unified = pa.unify_schemas([pq.read_schema(f) for f in files], promote_options="permissive")
    table = ds.dataset(
        f"{output}/{dataset}",
        schema=unified.append(pa.field("run_date", pa.date32())),
        partitioning=ds.partitioning(pa.schema([("run_date", pa.date32())]), flavor="hive"),
    ).to_table()
    _check(table.to_pylist(), dataset)


@pytest.mark.parametrize("dataset", ["transcripts", "costs"])
def test_pandas_with_the_current_schema_reads_both_versions(output: Path, dataset: str):
    pd = pytest.importorskip("pandas")
    schema = TRANSCRIPTS if dataset == "transcripts" else COSTS
    frame = pd.read_parquet(
        f"{output}/{dataset}",
        schema=schema.append(pa.field("run_date", pa.date32())),
        partitioning=ds.partitioning(pa.schema([("run_date", pa.date32())]), flavor="hive"),
    )
    rows = frame.astype(object).where(frame.notna(), None).to_dict("records")
    if dataset == "costs":  # nested columns come back as numpy arrays; costs has none
        _check(rows, dataset)
    else:
        assert frame["degenerate"].isna().tolist() == [True, False]


def _statements(sql: str, start: str) -> dict[str, str]:
    """Each statement of a printed script that begins with ``start``, by its table's name."""
    found = {}
    for chunk in sql.split(";\n"):
        body = chunk[chunk.find(start) :] if start in chunk else ""
        if body:
            found[body[len(start) :].split(" ", 1)[0].rpartition(".")[2]] = body
    return found


def test_athena_and_trino_tables_declare_every_column_and_project_run_date(
    capsys: pytest.CaptureFixture[str],
):
    out = "s3://lake/overnight/"  # the trailing slash is not doubled
    athena = _statements(
        _views(capsys, out, "--engine", "athena", "--first-night", "2026-11-01"),
        "CREATE EXTERNAL TABLE IF NOT EXISTS ",
    )
    trino = _statements(
        _views(capsys, out, "--engine", "trino", "--catalog", "lake"),
        "CREATE TABLE IF NOT EXISTS ",
    )
    schemas = {
        "transcripts": TRANSCRIPTS,
        "results": DOCUMENT_RESULTS,
        "costs": COSTS,
        "probes": PROBES,
        "run_table": RUNS,
    }
    assert set(athena) == set(trino) == set(schemas)
    for dataset, schema in schemas.items():
        for name in schema.names:
            assert f"`{name}` " in athena[dataset], (dataset, name)
            assert f'"{name}" ' in trino[dataset], (dataset, name)
        assert f"LOCATION 's3://lake/overnight/{dataset}/'" in athena[dataset]
        assert "'projection.run_date.type' = 'date'" in athena[dataset]
        assert "'projection.run_date.range' = '2026-11-01,NOW'" in athena[dataset]
        assert f"'s3://lake/overnight/{dataset}/run_date=${{run_date}}/'" in athena[dataset]
        assert trino[dataset].startswith(f"CREATE TABLE IF NOT EXISTS lake.overnight.{dataset} (")
        assert f"external_location = 's3://lake/overnight/{dataset}'" in trino[dataset]
        assert "partition_projection_range = ARRAY['2025-01-01', 'NOW']" in trino[dataset]
        assert "partition_projection_enabled = true" in trino[dataset]
    assert "your-bucket" not in "".join(athena.values()) + "".join(trino.values())


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["out", "--engine", "athena"], 2, "not the local path"),
        (["gs://b/out", "--engine", "athena"], 2, "Athena reads s3:// only"),
        (["s3://b/out", "--engine", "trino", "--first-night", "2026-13-01"], 2, "not a date"),
        (["empty", "--engine", "duckdb"], 4, "holds no run_date= partition"),
    ],
)
def test_views_refuse_what_the_engine_cannot_read_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, args, code, message
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty" / "costs").mkdir(parents=True)
    assert main(["views", *args]) == code
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
