"""GDPR erasure (contract section 4): a request, and every trace of its customers gone from the lake.

`request` checks a request, `inbox` keeps the requests waiting for the next run (neither needs
Spark: the DAG imports them), `registry` keeps erased customers out of later writes, `erase`
runs the erasure and writes its certificate, `scan` decodes every file under the lake root to
prove nothing is left, `airflow_records` takes the request out of Airflow's own records.
"""
