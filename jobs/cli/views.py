"""``overnight views OUTPUT --engine duckdb|athena|trino [--dataset NAME]``: print the SQL
that defines an OUTPUT's datasets as views or tables."""

from __future__ import annotations

import argparse

from overnight.jobs.choices import DEFAULT_FIRST_NIGHT, VIEW_DATASETS, VIEW_ENGINES


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "views",
        help="print SQL views (DuckDB) or tables (Athena, Trino) over an output's datasets",
        description="Print the SQL that defines OUTPUT's datasets for an engine, OUTPUT's "
        "location written in: DuckDB views over read_parquet, Athena (Glue) or Trino tables "
        "with run_date partition projection. Every column of the current schema is declared, "
        "so files of older versions read with their missing columns null. Of OUTPUT it reads "
        "only which datasets it holds (DuckDB, no --dataset). Pipe it into the engine: "
        "overnight views OUT --engine duckdb | duckdb my.db",
    )
    p.add_argument("output", metavar="OUTPUT", help="output folder or prefix (local, s3://, gs://)")
    p.add_argument("--engine", required=True, choices=VIEW_ENGINES, help="the SQL dialect to print")
    p.add_argument(
        "--dataset",
        action="append",
        choices=VIEW_DATASETS,
        metavar="NAME",
        help=f"only this dataset (repeatable): {', '.join(VIEW_DATASETS)}. Default: all of "
        "them for athena and trino; for duckdb those OUTPUT holds partitions of (a view "
        "needs a file in its folder when it is created)",
    )
    p.add_argument(
        "--first-night",
        default=DEFAULT_FIRST_NIGHT,
        metavar="YYYY-MM-DD",
        help="athena, trino: the first run_date the partition projection covers (default "
        f"{DEFAULT_FIRST_NIGHT}); a night before it is not seen",
    )
    p.add_argument(
        "--catalog", default="hive", help="trino: the Hive connector's catalog (default hive)"
    )
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    import sys

    from overnight.jobs.ops.views import ddl

    text = ddl(
        args.output,
        args.engine,
        args.dataset,
        first_night=args.first_night,
        catalog=args.catalog,
    )
    sys.stdout.write(text)
    return 0
