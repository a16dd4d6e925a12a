"""Services: what keeps the tables healthy and trusted beside the writers.

`table_services`: compaction, the change logs' expiry and clustering, cleaning, archival
(`lakehouse services`, the `hudi_table_services` DAG); `quality`: the Great Expectations suites
(`lakehouse quality`, the `data_quality` DAG); `due`: which tables have work for either, decided
without Spark (the two DAGs' first tasks).
"""
