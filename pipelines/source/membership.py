"""Which publication membership each declared table had when the lake last matched the source, kept in the lake.

A table dropped from the publication and added back looks, afterwards, like one that never left: it is
published, the connector streams, nothing fails. The changes made while it was out were never decoded and are in
no topic. PostgreSQL leaves one trace: adding a table to a publication creates a row in `pg_publication_rel`
with a new oid, while `ALTER PUBLICATION ... SET TABLE` (which Debezium's `publication.autocreate.mode=filtered`
runs at each start of its task) keeps the rows of the tables that stay. So the lake keeps each table's row
(`<publication oid>:<row oid>`, pipelines.source.catalog) from a time it was known whole: when `lakehouse
reconcile` found the table exact, or, for a table never reconciled, when `lakehouse source check` first saw it
published. `lakehouse source check` reports a table whose row has changed since, until reconcile finds it exact
again (after `reconcile --heal`).

What this cannot see: a table published through `FOR ALL TABLES` or `FOR TABLES IN SCHEMA` has no row of its own,
and a gap before the lake first remembered the table leaves no difference to find (reconcile finds what it lost).
"""

from __future__ import annotations

import json

from pipelines.lake import storage
from pipelines.lake.layout import membership_path


def remembered(root: str) -> dict[str, str]:
    """Lake name -> the membership the lake last knew whole (empty before any was remembered)."""
    path = membership_path(root)
    if not storage.exists(path):
        return {}
    return dict(json.loads(storage.read_text(path)).get("tables", {}))


def remember(root: str, memberships: dict[str, str]) -> None:
    """Keep `memberships` (lake name -> membership) over what the lake remembered. Read and written again at
    once: two jobs remembering at the same instant can lose one entry, which the next check or reconcile of
    that table writes again."""
    known = remembered(root)
    if all(known.get(name) == value for name, value in memberships.items()):
        return
    storage.write_text(membership_path(root), json.dumps({"tables": known | memberships}, indent=1,
                                                         sort_keys=True) + "\n")
