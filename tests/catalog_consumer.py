"""A consumer's own PySpark job on the catalog, with the session settings docs/reading.md gives and nothing of
the project's session code: `python -m tests.catalog_consumer SPEC.json` prints one JSON document.

SPEC: {"metastore": uri, "bundle": jar, "queries": {label: sql}, "as_of": {label: [sql, when]},
"describe": [table], "bad": {label: [sql, when or null]}}. The answer holds each database's tables,
each query's rows (Spark's JSON of each row), each described table's columns, every table's properties
and partitions, and the message of each bad query.
"""

from __future__ import annotations

import json
import sys

from pyspark.sql import SparkSession

from pipelines.errors import QueryError
from pipelines.metastore.query import run_sql


def main(spec_path: str) -> None:
    with open(spec_path) as fh:
        spec = json.load(fh)
    # The settings of docs/reading.md ("Tables by name"), word for word.
    spark = (SparkSession.builder.appName("a-consumer")
             .config("spark.driver.extraClassPath", spec["bundle"])
             .config("spark.serializer", "org.apache.spark.serializer.KryoSerializer")
             .config("spark.sql.extensions", "org.apache.spark.sql.hudi.HoodieSparkSessionExtension")
             .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.hudi.catalog.HoodieCatalog")
             .config("spark.sql.catalogImplementation", "hive")
             .config("spark.hadoop.hive.metastore.uris", spec["metastore"])
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.ui.enabled", "false")
             .master("local[2]").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    out: dict = {"tables": {}, "rows": {}, "columns": {}, "properties": {}, "partitions": {}, "bad": {}}
    for db in ("bronze", "silver", "gold"):
        out["tables"][db] = sorted(r.tableName for r in spark.sql(f"SHOW TABLES IN {db}").collect())
        for name in out["tables"][db]:
            table = f"{db}.{name}"
            out["properties"][table] = {r.key: r.value for r in spark.sql(f"SHOW TBLPROPERTIES {table}").collect()}
            partitioned = any(c.isPartition for c in spark.catalog.listColumns(table))
            out["partitions"][table] = [r[0] for r in spark.sql(f"SHOW PARTITIONS {table}").collect()] \
                if partitioned else []
    for label, sql in spec.get("queries", {}).items():
        out["rows"][label] = run_sql(spark, sql).toJSON().collect()
    for label, (sql, when) in spec.get("as_of", {}).items():
        out["rows"][label] = run_sql(spark, sql, when).toJSON().collect()
    for table in spec.get("describe", []):
        out["columns"][table] = [c.name for c in spark.catalog.listColumns(table)]
    for label, (sql, when) in spec.get("bad", {}).items():
        try:
            run_sql(spark, sql, when).collect()
            out["bad"][label] = None
        except QueryError as exc:
            out["bad"][label] = str(exc)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
