"""An independent model of the source: what the contract says a consumer must make of the stream.

It reads only Kafka records (as the generator produced them, or as read back from the
broker) and folds them the contract's way: per key the newest `source.lsn` wins, a delete
removes the row and remembers its LSN, a truncate empties the table, anything that is not
a usable envelope changes nothing. It shares no code with the pipeline.
"""

from __future__ import annotations

import functools
import json
import re
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from lakehouse_dev.generator import Message
from pipelines.lake.contract import CURRENCIES, ORDER_STATUSES, OTHER_OPS, ROW_OPS, TABLES, table_of_topic

Rows = dict[str, dict[int, dict[str, Any]]]
# Debezium's default `unavailable.value.placeholder` (the pipeline reads it from its settings).
UNAVAILABLE = "__debezium_unavailable_value"


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
            # An unchanged TOASTed value arrives as the connector's placeholder: the source still holds
            # the value it had (contract section 6).
            before = rows[table].get(key, {})
            rows[table][key] = {c: before.get(c) if v == UNAVAILABLE else v for c, v in image.items()}
    lsns = {t: {k: newest[t][k] for k in rows[t]} for t in TABLES}
    return rows, lsns




# ---------------------------------------------------------------- silver, the contract's rules in plain Python

_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")
_COUNTRY = re.compile(r"[A-Z]{2}")
_AMOUNT = re.compile(r"-?\d{1,10}(\.\d{1,2})?")


def _ts(text: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(text).astimezone(UTC) if isinstance(text, str) else None
    except ValueError:
        return None


def silver_customer(row: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """(cleaned row, first failed rule or None)."""
    clean = {"id": row["id"], "email": (row["email"] or "").strip().lower(), "full_name": row["full_name"],
             "country": (row["country"] or "").strip().upper(),
             "created_at": _ts(row["created_at"]), "updated_at": _ts(row["updated_at"])}
    checks = [("email_format", _EMAIL.fullmatch(clean["email"])),
              ("country_code", _COUNTRY.fullmatch(clean["country"])),
              ("created_at_timestamp", clean["created_at"]), ("updated_at_timestamp", clean["updated_at"])]
    return clean, next((name for name, ok in checks if not ok), None)


def silver_order(row: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    text = (row.get("amount") or "").strip()
    try:
        amount = Decimal(text) if _AMOUNT.fullmatch(text) else None
    except InvalidOperation:
        amount = None
    created = _ts(row["created_at"])
    clean = {"id": row["id"], "customer_id": row["customer_id"], "status": row["status"], "currency": row["currency"],
             "amount": amount, "created_at": created, "updated_at": _ts(row["updated_at"]),
             "order_date": created.date() if created else None}
    checks = [("status_value", row["status"] in ORDER_STATUSES), ("currency_value", row["currency"] in CURRENCIES),
              ("amount_decimal", amount is not None), ("amount_non_negative", amount is not None and amount >= 0),
              ("created_at_timestamp", created), ("updated_at_timestamp", clean["updated_at"])]
    return clean, next((name for name, ok in checks if not ok), None)


SILVER_RULES = {"customers": silver_customer, "orders": silver_order}


def expected_silver(state: Rows) -> tuple[Rows, dict[str, dict[int, str]]]:
    """What silver and its quarantine must hold for a source state: (valid rows, {table: {id: failed rule}})."""
    silver: Rows = {t: {} for t in TABLES}
    quarantine: dict[str, dict[int, str]] = {t: {} for t in TABLES}
    for table in TABLES:
        for key, row in state[table].items():
            clean, failed = SILVER_RULES[table](row)
            if failed:
                quarantine[table][key] = failed
            else:
                silver[table][key] = clean
    return silver, quarantine




# ---------------------------------------------------------------- gold, the contract's aggregates in plain Python

NOT_COUNTED = ("cancelled", "refunded")


def expected_gold(state: Rows) -> tuple[dict[int, dict[str, Any]], dict[tuple, dict[str, Any]]]:
    """(customer_ltv by customer id, daily_revenue by (order_date, country, currency)) for a source state."""
    silver, _ = expected_silver(state)
    customers = silver["customers"]
    ltv = {cid: {"country": c["country"], "orders_count": 0, "total_amount": Decimal("0.00"),
                 "first_order_at": None, "last_order_at": None} for cid, c in customers.items()}
    daily: dict[tuple, dict[str, Any]] = {}
    for order in silver["orders"].values():
        if order["status"] in NOT_COUNTED:
            continue
        customer = customers.get(order["customer_id"])
        key = (order["order_date"], customer["country"] if customer else "??", order["currency"])
        day = daily.setdefault(key, {"orders_count": 0, "revenue": Decimal("0.00")})
        day["orders_count"] += 1
        day["revenue"] += order["amount"]
        if customer:
            row = ltv[order["customer_id"]]
            row["orders_count"] += 1
            row["total_amount"] += order["amount"]
            at = order["created_at"]
            row["first_order_at"] = min(row["first_order_at"] or at, at)
            row["last_order_at"] = max(row["last_order_at"] or at, at)
    return ltv, daily
