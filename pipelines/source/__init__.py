"""The source database and its change stream as the product reaches them: any PostgreSQL (RDS, Aurora, a local one)
captured by a Debezium connector in any Kafka Connect cluster, both named by the configuration's `[source]` and
`[connect]` sections.

`check` finds every reason a declared table's changes would not reach its topic; `sync` makes the publication and
the connector capture exactly the declared tables. `postgres` and `connect_rest` are the two clients they share
(the connector watchdog, pipelines.deploy.connector, uses the second). The modules are imported on use: the
watchdog's Airflow worker imports `connect_rest` alone, without psycopg.
"""
