"""The lake itself, below every layer: the contract's tables, the declaration of tables, the table
catalog (names, paths, keys), storage (local or S3), Hudi timelines read without Spark, the lake's
layout (metadata columns, the delete flag, commit-metadata keys) and the erasure registry.
"""
