"""Transform: bronze's change log into silver, silver's change feed into gold (`lakehouse etl`), and the
change feed every layer offers its readers (`lakehouse changes`).

`silver` and `gold` are DataFrame functions (rules, aggregates), testable alone; `etl` runs one
incremental cycle of both, `changes` reads a table's changes since a checkpoint.
"""
