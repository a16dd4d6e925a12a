"""An independent model of the source: what the contract says a consumer must make of the stream.

It reads only Kafka records (as the generator produced them, or as read back from the
broker) and folds them the contract's way: per key the newest `source.lsn` wins, a delete
removes the row and remembers its LSN, a truncate empties the table, anything that is not
a usable envelope changes nothing. It shares no code with the pipeline.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from pipelines.contract import OTHER_OPS, ROW_OPS, TABLES, table_of_topic
from pipelines.generator import Message

Rows = dict[str, dict[int, dict[str, Any]]]


@functools.cache  # every test reads the same records; decoding them once keeps the suite fast
def unwrap(message: Message) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(schema, envelope) of a record; envelope None for tombstones and anything that is not one."""
    if message.value is None:
        return None, None
    try:
        doc = json.loads(message.value)
    except ValueError:  # not JSON, or not UTF-8
        return None, None
    schema = None
    if isinstance(doc, dict) and set(doc) == {"schema", "payload"}:
        schema, doc = doc["schema"], doc["payload"]
    if not isinstance(doc, dict) or "op" not in doc or not isinstance(doc.get("source"), dict):
        return schema, None
    return schema, doc


def row_event(envelope: dict[str, Any] | None) -> tuple[str, int, int, dict[str, Any]] | None:
    """(op, key, lsn, row image) of a usable row change, else None."""
    if envelope is None or envelope["op"] not in ROW_OPS:
        return None
    lsn = envelope["source"].get("lsn")
    image = envelope.get("before") if envelope["op"] == "d" else envelope.get("after")
    if not isinstance(lsn, int) or not isinstance(image, dict) or not isinstance(image.get("id"), int):
        return None
    return envelope["op"], image["id"], lsn, image


def is_malformed(message: Message) -> bool:
    if message.value is None:
        return False
    _, envelope = unwrap(message)
    if envelope is None or envelope["op"] not in ROW_OPS | OTHER_OPS:
        return True
    return envelope["op"] in ROW_OPS and row_event(envelope) is None


def fold(messages: list[Message]) -> Rows:
    """Live rows per table after applying every record in order."""
    return fold_with_lsn(messages)[0]


def fold_with_lsn(messages: list[Message]) -> tuple[Rows, dict[str, dict[int, int]]]:
    """Live rows per table, and the LSN of the event that produced each live row."""
    rows: Rows = {table: {} for table in TABLES}
    newest: dict[str, dict[int, int]] = {table: {} for table in TABLES}
    truncated_at = dict.fromkeys(TABLES, -1)
    for message in messages:
        table = table_of_topic(message.topic)
        _, envelope = unwrap(message)
        if envelope is not None and envelope["op"] == "t":
            rows[table].clear()
            newest[table].clear()
            truncated_at[table] = envelope["source"]["lsn"]
            continue
        event = row_event(envelope)
        if event is None:
            continue
        op, key, lsn, image = event
        if lsn <= max(newest[table].get(key, -1), truncated_at[table]):
            continue
        newest[table][key] = lsn
        if op == "d":
            rows[table].pop(key, None)
        else:
            rows[table][key] = image
    lsns = {t: {k: newest[t][k] for k in rows[t]} for t in TABLES}
    return rows, lsns


