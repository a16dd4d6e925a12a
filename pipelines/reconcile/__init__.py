"""Reconciliation: does the lake still hold what the source database holds?

`lakehouse reconcile` compares each declared table's bronze rows with the PostgreSQL table it mirrors, at one
consistent point of each side, without moving every row: both sides hash the same canonical text of every row
(`canonical`), group the hashes into buckets of their keys' hashes and move only the buckets' sums
(`digest`); only buckets that differ are read row by row, and a row that differs is looked at again after the
stream has had time to apply what the source changed meanwhile (`compare`): what still differs then, with the
source row unchanged, is drift.

`lakehouse reconcile --layer silver` compares each declared table's silver and quarantine with what the declared
rules make of bronze as of the version each consumed (`silver`), in Spark: both sides are in the lake.
"""
