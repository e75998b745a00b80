"""Runs the fleet queries of this folder on the tables `memlens export` wrote.

    python queries.py TABLES [--engine duckdb|spark] [--query NAME] [--json]

TABLES is the folder `memlens export SNAP... -o TABLES` made (events,
blocks, segments and frames as Parquet). Each `NAME.sql` here is one query in
the SQL that DuckDB and Spark SQL both read; the tables are registered under
their names (`events`, `blocks`, `segments`, `frames`). DuckDB needs
`pip install duckdb`; Spark `pip install pyspark` and a Java runtime (it runs
in local mode, on this machine's cores). For hundreds of runs, export them
into one folder (or several, and point Spark at all of them).

Prints each query's rows (or, with --json, one JSON object: query name to a
list of rows, each a list of values).
"""
import argparse
import decimal
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TABLES = ("events", "blocks", "segments", "frames")


def queries(only=None):
    """The queries of this folder, by name, in name order."""
    names = sorted(f[:-4] for f in os.listdir(HERE) if f.endswith(".sql"))
    if only:
        unknown = [n for n in only if n not in names]
        if unknown:
            sys.exit(f"queries.py: no query {', '.join(unknown)} (have {', '.join(names)})")
        names = [n for n in names if n in only]
    return {n: open(os.path.join(HERE, n + ".sql")).read() for n in names}


def plain(value):
    """A value as JSON has it: engines differ in integer and decimal types."""
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return value


def run_duckdb(tables, sqls):
    import duckdb

    con = duckdb.connect()
    for t in TABLES:
        path = os.path.join(tables, f"{t}.parquet").replace("'", "''")
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{path}')")
    return {n: [[plain(v) for v in row] for row in con.execute(q).fetchall()] for n, q in sqls.items()}


def run_spark(tables, sqls):
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[*]")
        .appName("memlens-fleet")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "8")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        for t in TABLES:
            spark.read.parquet(os.path.join(tables, f"{t}.parquet")).createOrReplaceTempView(t)
        return {n: [[plain(v) for v in row] for row in spark.sql(q).collect()] for n, q in sqls.items()}
    finally:
        spark.stop()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tables", help="the folder memlens export wrote")
    ap.add_argument("--engine", choices=["duckdb", "spark"], default="duckdb")
    ap.add_argument("--query", action="append", help="run only this query (repeatable)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    missing = [t for t in TABLES if not os.path.exists(os.path.join(args.tables, f"{t}.parquet"))]
    if missing:
        sys.exit(f"queries.py: {args.tables}: no {', '.join(m + '.parquet' for m in missing)} (run memlens export first)")
    sqls = queries(args.query)
    results = (run_spark if args.engine == "spark" else run_duckdb)(args.tables, sqls)
    if args.json:
        print(json.dumps(results, indent=1))
        return
    for name, rows in results.items():
        print(f"== {name} ({len(rows)} rows)")
        for row in rows:
            print("  " + " | ".join("" if v is None else str(v) for v in row))


if __name__ == "__main__":
    main()
