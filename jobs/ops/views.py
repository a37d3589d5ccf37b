"""SQL over an OUTPUT's datasets, for ``overnight views``: DuckDB views, Athena (Glue) and
Trino tables, each column typed as the current ``overnight.schemas`` declares it, with OUTPUT's
location written in. Built from the schemas at run time, so it always matches the installed
release; nothing is committed that could go stale.

Why these settings (docs/reading-outputs.md has the reader-by-reader version): every file keeps
the schema of the version that wrote it, and a new version only adds nullable columns. Readers
that take the first file's schema drop the new columns or fail on them. So each definition
names every column of the current schema, and matches file columns by name:

* DuckDB: ``read_parquet(..., hive_partitioning = true, union_by_name = true)``, under a typed
  empty row set (``UNION ALL BY NAME``), so that a column is there, null, even while no file
  of the output has it yet. The pattern names only ``run_date=YYYY-MM-DD`` folders, as
  overnight's own readers take only those, with ``run_date`` typed DATE: a copy in
  ``run_date=garbage/`` was read as rows, made ``run_date`` text (so the docs' own date filter
  failed), and a plain ``backup/`` folder failed every query as a Hive partition mismatch.
* Athena, Glue and Trino read Parquet columns by name (their default): a column a file lacks
  reads as null. ``run_date`` is projected (``yyyy-MM-dd``, one a day from the first night up
  to NOW), so no ``MSCK REPAIR`` or crawler is needed after a night.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from datetime import date

import pyarrow as pa

from overnight.jobs.choices import DEFAULT_FIRST_NIGHT, VIEW_DATASETS, VIEW_ENGINES
from overnight.jobs.errors import ConfigError, InputNotFound

# Folder under OUTPUT -> (the schema's name in overnight.schemas, what one row is); the same
# names as choices.VIEW_DATASETS, which the command line offers (a test checks).
_DATASETS: dict[str, tuple[str, str]] = {
    "transcripts": ("TRANSCRIPTS", "one row per recording and run"),
    "results": ("DOCUMENT_RESULTS", "one row per document, task and run"),
    "costs": ("COSTS", "the cost ledger: one row per item and stage"),
    "probes": ("PROBES", "one row per probed recording"),
    "run_table": ("RUNS", "one row per finished run"),
}

_TITLES = {
    "duckdb": "DuckDB views",
    "athena": "Athena (AWS Glue Data Catalog) tables",
    "trino": "Trino (Hive connector) tables",
}
_NOTES = {
    "duckdb": (
        "Each view binds when it is created (OUTPUT/<dataset>/ must hold a file then: by\n"
        "default the datasets OUTPUT holds) and reads at query time: `where run_date >= DATE\n"
        "'2026-12-01'` opens only those partitions. Only run_date=YYYY-MM-DD folders are read,\n"
        "as overnight reads them (a copy beside them is not). s3:// and gs:// need DuckDB's\n"
        "httpfs and a secret. Flat files of outputs older than partitions are not read\n"
        "(pyarrow.dataset reads them: docs/reading-outputs.md)."
    ),
}
_NOTES["athena"] = _NOTES["trino"] = (
    "run_date is projected from the first night (--first-night) to NOW: a night before it is\n"
    "not seen. After an upgrade that adds columns, DROP TABLE (the files stay) and rerun."
)


def ddl(
    output: str,
    engine: str,
    datasets: Sequence[str] | None = None,
    *,
    first_night: str = DEFAULT_FIRST_NIGHT,
    catalog: str = "hive",
) -> str:
    """The SQL that defines ``datasets`` of OUTPUT for ``engine``: one script, a statement a
    dataset, to run as it is. By default every dataset for Athena and Trino, and for DuckDB
    those OUTPUT holds partitions of (a view binds to its files when it is created)."""
    from overnight import schemas

    if engine not in VIEW_ENGINES:
        raise ConfigError(f"views: no engine {engine!r}; one of {', '.join(VIEW_ENGINES)}")
    unknown = sorted(set(datasets or ()) - set(VIEW_DATASETS))
    if unknown:
        raise ConfigError(f"views: no dataset {unknown[0]!r}; one of {', '.join(VIEW_DATASETS)}")
    try:
        first_night = date.fromisoformat(first_night).isoformat()
    except ValueError:
        raise ConfigError(
            f"views: --first-night {first_night!r} is not a date (2025-01-01)"
        ) from None
    from overnight.jobs.dataset.storage import one_line

    # A line break in the location would end the header comment and start a statement.
    where = _location(output, engine)
    if engine == "duckdb":
        from overnight.jobs.dataset import storage

        shown = storage.scrub_secrets(output)
        storage.refuse_a_file_as_output(storage.resolve(where), shown, "views")
    if not datasets:
        datasets = partitioned(output) if engine == "duckdb" else VIEW_DATASETS
    parts = [
        f"-- {_TITLES[engine]} over {one_line(where)}, schema version {schemas.SCHEMA_VERSION}.\n"
        "-- Printed by `overnight views` from overnight.schemas; files of older versions read\n"
        "-- with their missing columns null (docs/reading-outputs.md).\n"
        + "".join(f"-- {line}\n" for line in _NOTES[engine].splitlines())
    ]
    for name in datasets:
        schema_name, what = _DATASETS[name]
        schema: pa.Schema = getattr(schemas, schema_name)
        folder = f"{where}/{name}"
        if engine == "duckdb":
            statement = _duckdb_view(name, schema, folder)
        else:
            trino = engine == "trino"
            table = f"{catalog}.overnight.{name}" if trino else name
            statement = _hive_table(table, schema, folder, first_night, trino)
        parts.append(f"-- {name}: {what}.\n{statement}")
    return "\n".join(parts)


def partitioned(output: str) -> list[str]:
    """The datasets of OUTPUT that hold a ``run_date=`` partition; InputNotFound if none."""
    from overnight.jobs.dataset import storage

    root = storage.resolve(output)
    found = [
        name
        for name in VIEW_DATASETS
        if any(_is_partition(d.rpartition("/")[2]) for d in storage.list_dirs(root.join(name)))
    ]
    if not found:
        raise InputNotFound(
            f"views: {storage.scrub_secrets(output)} holds no run_date= partition of "
            f"{', '.join(VIEW_DATASETS)}; name the datasets with --dataset to print their views "
            "anyway"
        )
    return found


# A partition overnight writes and reads (``commits.partition_date``), spelled as it writes it:
# the folders the DuckDB pattern below matches.
_PARTITION = re.compile(r"run_date=(\d{4}-\d{2}-\d{2})")
_PARTITION_GLOB = "run_date=[0-9][0-9][0-9][0-9]-[01][0-9]-[0-3][0-9]"


def _is_partition(name: str) -> bool:
    """A partition as overnight writes it (``commits.partition_date`` reads its date), spelt
    as the DuckDB pattern matches it."""
    from overnight.jobs.dataset import commits

    return _PARTITION.fullmatch(name) is not None and commits.partition_date(name) is not None


def _location(output: str, engine: str) -> str:
    """OUTPUT as the engine reads it: a local path made absolute (DuckDB), an object-store
    URL without its trailing slash; Athena reads only s3://, Trino only a URL."""
    scheme = output.split("://", 1)[0] if "://" in output else ""
    if scheme not in ("", "file"):
        from overnight.jobs.dataset.storage import looks_like_credentials, scrub_secrets

        if looks_like_credentials(output):
            # Written into the SQL, a key and secret in the URL (or a presigned query string,
            # pasted into the path) were printed, then kept in the engine's catalog; as
            # storage.resolve refuses such a URL for every other command.
            raise ConfigError(
                f"views: {scrub_secrets(output)!r} carries credentials in the URL, which "
                "overnight does not read and would print into the SQL: give the plain URL "
                "(s3://bucket/prefix), and the engine its own credentials (Athena: the "
                "workgroup's role; Trino: the Hive connector's S3 settings; DuckDB: CREATE "
                "SECRET)"
            )
    if scheme in ("", "file"):
        if engine != "duckdb":
            raise ConfigError(
                f"views: {engine} reads object storage, not the local path {output!r}: give "
                "OUTPUT as its URL (s3://bucket/prefix)"
            )
        path = output.split("://", 1)[1] if scheme else output
        return os.path.abspath(os.path.expanduser(path))
    if engine == "athena" and scheme not in ("s3", "s3a"):
        raise ConfigError(f"views: Athena reads s3:// only, not {output!r}")
    if engine == "athena":
        output = "s3://" + output.split("://", 1)[1]
    return output.rstrip("/")


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _glob_escaped(path: str) -> str:
    """``path`` as a DuckDB file pattern that matches only itself: each of ``[ * ?`` inside
    brackets. Unescaped, ``out [x]`` matched nothing and ``out?q`` a sibling ``outZq`` too."""
    if "\\" in path:
        # No DuckDB pattern matches a backslash (2.0: neither \\ nor [\] does).
        raise ConfigError(
            f"views: DuckDB's file patterns cannot name {path!r}, whose path holds a "
            "backslash: give OUTPUT by a path without one (a symbolic link to it)"
        )
    return re.sub(r"([\[*?])", r"[\1]", path)


# -- DuckDB -----------------------------------------------------------------------------------


def _duckdb_view(name: str, schema: pa.Schema, folder: str) -> str:
    import duckdb

    rel = duckdb.from_arrow(schema.empty_table())
    columns = [
        *(
            f'NULL::{kind} AS "{col}"'
            for col, kind in zip(rel.columns, map(str, rel.types), strict=True)
        ),
        'NULL::DATE AS "run_date"',
    ]
    body = ",\n    ".join(columns)
    return (
        f"CREATE OR REPLACE VIEW {name} AS\n"
        f"SELECT\n    {body}\nWHERE false\n"
        "UNION ALL BY NAME\n"
        "SELECT * FROM read_parquet(\n"
        f"    {_literal(_glob_escaped(folder) + '/' + _PARTITION_GLOB + '/*.parquet')},\n"
        "    hive_partitioning = true,\n"
        "    hive_types = {'run_date': DATE},\n"
        "    union_by_name = true\n"
        ");\n"
    )


# -- Athena (Glue) and Trino ------------------------------------------------------------------


# The scalar types of the schemas: (Athena's Hive DDL name, Trino's name).
_SCALARS: dict[pa.DataType, tuple[str, str]] = {
    pa.string(): ("string", "varchar"),
    pa.large_string(): ("string", "varchar"),
    pa.bool_(): ("boolean", "boolean"),
    pa.int64(): ("bigint", "bigint"),
    pa.int32(): ("int", "integer"),
    pa.int16(): ("smallint", "smallint"),
    pa.float32(): ("float", "real"),
    pa.float64(): ("double", "double"),
    pa.date32(): ("date", "date"),
}


def _hive_type(kind: pa.DataType, trino: bool) -> str:
    if kind in _SCALARS:
        return _SCALARS[kind][trino]
    if pa.types.is_timestamp(kind):  # any unit, with or without a time zone
        return "timestamp(6)" if trino else "timestamp"
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        inner = _hive_type(kind.value_type, trino)
        return f"array({inner})" if trino else f"array<{inner}>"
    if pa.types.is_map(kind):
        k, v = _hive_type(kind.key_type, trino), _hive_type(kind.item_type, trino)
        return f"map({k}, {v})" if trino else f"map<{k},{v}>"
    if pa.types.is_struct(kind):
        if trino:
            fields = ", ".join(f'"{f.name}" {_hive_type(f.type, trino)}' for f in kind)
            return f"row({fields})"
        return "struct<" + ",".join(f"`{f.name}`:{_hive_type(f.type, trino)}" for f in kind) + ">"
    raise TypeError(f"no Athena/Trino type for {kind}: add it to jobs/ops/views.py")


# The statements, filled in by str.format: the projection of run_date says where each night's
# partition is, so no crawler or MSCK REPAIR is needed after a night.
_ATHENA = """\
CREATE EXTERNAL TABLE IF NOT EXISTS overnight.{name} (
  {columns}
)
PARTITIONED BY (`run_date` string)
STORED AS PARQUET
LOCATION {location}
TBLPROPERTIES (
  'projection.enabled' = 'true',
  'projection.run_date.type' = 'date',
  'projection.run_date.format' = 'yyyy-MM-dd',
  'projection.run_date.range' = '{first_night},NOW',
  'projection.run_date.interval' = '1',
  'projection.run_date.interval.unit' = 'DAYS',
  'storage.location.template' = {template}
);
"""
_TRINO = """\
CREATE TABLE IF NOT EXISTS {name} (
  {columns},
  "run_date" varchar WITH (
    partition_projection_type = 'date',
    partition_projection_format = 'yyyy-MM-dd',
    partition_projection_range = ARRAY['{first_night}', 'NOW'],
    partition_projection_interval = 1,
    partition_projection_interval_unit = 'DAYS'
  )
)
WITH (
  format = 'PARQUET',
  external_location = {location},
  partitioned_by = ARRAY['run_date'],
  partition_projection_enabled = true,
  partition_projection_location_template = {template}
);
"""


def _hive_table(name: str, schema: pa.Schema, folder: str, first_night: str, trino: bool) -> str:
    """An Athena (Glue) or Trino table over ``folder``'s run_date= partitions."""
    quote = '"' if trino else "`"
    columns = ",\n  ".join(f"{quote}{f.name}{quote} {_hive_type(f.type, trino)}" for f in schema)
    # Athena wants the folders with their slash, Trino without.
    end = "" if trino else "/"
    return (_TRINO if trino else _ATHENA).format(
        name=name,
        columns=columns,
        location=_literal(folder + end),
        first_night=first_night,
        template=_literal(folder + "/run_date=${run_date}" + end),
    )
