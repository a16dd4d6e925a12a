"""The lake's tables by name: their registration in a Hive Metastore or AWS Glue, and Spark SQL over
them (`lakehouse sql`, with time travel).
"""
