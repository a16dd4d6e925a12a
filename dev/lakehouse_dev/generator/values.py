"""The shop's rows and values, and the records carrying them: what a row looks like, clean, dirty or
invalid, and the helpers every part of the simulated source shares.
"""

from __future__ import annotations

import json
import random
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from pipelines.lake.contract import COLUMNS, COUNTRY_PATTERN, CURRENCIES, EMAIL_PATTERN, ORDER_STATUSES, PRIMARY_KEY

DEBEZIUM_VERSION = "2.7.3.Final"
DATABASE = "shop"
# Customer ids are a plain sequence starting at 1, so ids from here on were never customers.
ORPHAN_CUSTOMER_BASE = 10_000_000

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
CLOCK_START_US = (datetime(2026, 3, 1, tzinfo=UTC) - EPOCH) // timedelta(microseconds=1)
DAY_US = 86_400_000_000
TIMESTAMP_COLUMNS = ("created_at", "updated_at")
# Share of row images that carry values silver can clean (spaces, case) but must not reject.
DIRTY_FRACTION = 0.10
INSERT_SHARE = 0.4  # of the non-delete changes; the rest are updates
CUSTOMER_SHARE = 0.35  # of the changes; orders change more often than customers
# Replays may reach back into earlier runs, as a connector restart re-delivers whatever its last
# committed offset left; this much of each topic's tail is kept (and saved) for that.
HISTORY_TAIL = 500
PROGRESS_EVERY = 1000
ACK_EVERY = 20_000
MESSAGE_KEY = b'{"prefix":"audit"}'  # Debezium keys logical messages by their prefix

FIRST_NAMES = (
    "Anna", "Ben", "Chloé", "David", "Emma", "Felix", "Greta", "Hugo", "Ines", "Jonas", "Karin", "Lukas",
    "Maria", "Noah", "Olga", "Paul", "Zoë", "Rafael", "Sofia", "Tomás", "Ulla", "Viktor", "Wen", "Łukasz",
)
LAST_NAMES = (
    "Schmidt", "Müller", "Dubois", "Rossi", "García", "Smith", "Nowak", "Jensen", "Silva", "Kowalski",
    "Bernard", "Weber", "Novak", "Larsen", "O'Brien", "Tanaka", "Fischer", "Moreau", "Lindqvist", "Costa",
)
DOMAINS = ("example.com", "mail.example.org", "shop.test", "posteo.example", "web.example.net")
COUNTRIES = ("DE", "FR", "GB", "US", "ES", "IT", "NL", "SE", "CH", "JP", "PL", "AT", "BE", "DK", "IE", "PT")
CURRENCY_WEIGHTS = {"EUR": 50, "USD": 20, "GBP": 10, "JPY": 5, "CHF": 8, "SEK": 7}
SNAPSHOT_STATUS_WEIGHTS = {"placed": 30, "paid": 30, "shipped": 25, "cancelled": 10, "refunded": 5}
# An order's life: placed -> paid -> shipped, or off to cancelled/refunded; those two are final.
NEXT_STATUS = {
    "placed": ("paid", "paid", "cancelled"),
    "paid": ("shipped", "shipped", "refunded"),
    "shipped": ("refunded",),
    "cancelled": (),
    "refunded": (),
}
BAD_STATUSES = ("lost", "on_hold", "unknown")
BAD_CURRENCIES = ("XXX", "ZZZ", "BTC")
MALFORMED_KINDS = (
    "truncated_json", "non_utf8", "json_array", "json_object", "json_string",
    "unknown_op", "missing_lsn", "create_without_after", "non_integer_id",
)
# Values of `source.snapshot` in Debezium 2.7 (the Enum's allowed list, in Debezium's order).
SNAPSHOT_MARKERS = (
    "true", "first", "first_in_data_collection", "last_in_data_collection", "last", "false", "incremental",
)
EMAIL_RE = re.compile(EMAIL_PATTERN)
COUNTRY_RE = re.compile(COUNTRY_PATTERN)


@dataclass(frozen=True)
class Message:
    """One Kafka record, as the connector would hand it to the producer."""

    topic: str
    key: bytes | None
    value: bytes | None  # None = tombstone


@dataclass
class WorkloadConfig:
    """How much and what kind of trouble a run produces; fractions are per row or per change."""

    seed: int = 7
    customers: int = 200
    orders: int = 600
    changes: int = 2000
    delete_fraction: float = 0.05
    reinsert_fraction: float = 0.3
    invalid_fraction: float = 0.05
    orphan_fraction: float = 0.05
    malformed_fraction: float = 0.01
    replay_runs: int = 2
    schema_fraction: float = 0.5
    other_ops: bool = True
    # Order updates that give the order to another live customer (a shop fixing who placed
    # it). Off by default: drawing it would change every seeded workload the tests rely on.
    move_fraction: float = 0.0


@dataclass(frozen=True)
class Sent:
    """A delivered record plus what a replay needs to know about it without decoding it again."""

    message: Message
    kind: str  # r c u d m tombstone
    row_id: int | None


class IdPool:
    """Live primary keys of a table in a list, so a random pick stays O(1) on large tables."""

    def __init__(self, ids: Iterable[int] = ()) -> None:
        self.ids = list(ids)
        self._pos = {row_id: i for i, row_id in enumerate(self.ids)}

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, row_id: int) -> None:
        self._pos[row_id] = len(self.ids)
        self.ids.append(row_id)

    def remove(self, row_id: int) -> None:
        i = self._pos.pop(row_id)
        last = self.ids.pop()
        if last != row_id:
            self.ids[i] = last
            self._pos[last] = i

    def choice(self, rng: random.Random) -> int:
        return self.ids[rng.randrange(len(self.ids))]


def dumps(doc: Any) -> bytes:
    # Kafka Connect's JsonConverter writes compact UTF-8 without escaping non-ASCII characters.
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def key_of(row_id: int | str) -> bytes:
    return dumps({PRIMARY_KEY: row_id})


def iso(us: int) -> str:
    return (EPOCH + timedelta(microseconds=us)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def slug(text: str) -> str:
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return "".join(ch for ch in ascii_text.lower() if ch.isalnum())


def sequence(previous: int | None, lsn: int) -> str:
    # Debezium's `sequence`: the last committed LSN and this event's LSN, as a JSON array of strings.
    return json.dumps([None if previous is None else str(previous), str(lsn)], separators=(",", ":"))


def weighted(rng: random.Random, weights: dict[str, int]) -> str:
    return rng.choices(list(weights), weights=list(weights.values()))[0]


def money(cents: int) -> str:
    sign = "-" if cents < 0 else ""
    return f"{sign}{abs(cents) // 100}.{abs(cents) % 100:02d}"


def rejected(table: str, row: dict[str, Any]) -> bool:
    """Silver's validation rules, so the stats say how many rows the lake must quarantine."""
    if table == "customers":
        email = row["email"].strip().lower()
        country = row["country"].strip().upper()
        return not (EMAIL_RE.match(email) and COUNTRY_RE.match(country))
    return (
        row["status"] not in ORDER_STATUSES or row["currency"] not in CURRENCIES
        or row.get("amount") is None or Decimal(row["amount"]) < 0
    )


def dirty(table: str, row: dict[str, Any]) -> bool:
    return table == "customers" and (
        row["email"] != row["email"].strip().lower() or row["country"] != row["country"].strip().upper()
    )


# --- rows and values: drawn from the source's one random generator ------------------------------------

def draw_quality(rng: random.Random, cfg: WorkloadConfig) -> str:
    draw = rng.random()
    if draw < cfg.invalid_fraction:
        return "invalid"
    return "dirty" if draw < cfg.invalid_fraction + DIRTY_FRACTION else "ok"


def draw_full_name(rng: random.Random) -> str:
    return f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"


def draw_email(rng: random.Random, full_name: str, row_id: int, quality: str) -> str:
    first, _, last = full_name.partition(" ")
    local = f"{slug(first)}.{slug(last)}{row_id}"
    domain = rng.choice(DOMAINS)
    if quality == "invalid":
        return rng.choice((
            f"{local}.{domain}",  # no @
            f"{local}@{domain.split('.')[0]}",  # no dot in the domain
            f"{local.replace('.', ' ', 1)}@{domain}",  # a space inside
        ))
    if quality == "dirty":
        return rng.choice((
            f"  {local}@{domain} ",
            f"{local}@{domain}".upper(),
            f" {local.title()}@{domain.title()}",
        ))
    return f"{local}@{domain}"


def draw_country(rng: random.Random, quality: str) -> str:
    code = rng.choice(COUNTRIES)
    if quality == "invalid":
        return rng.choice((
            f"{rng.randint(0, 9)}{code[0]}",  # "1A"
            f"{code[0]}{rng.randint(0, 9)}",  # "D3"
            f"{code[0]} ",  # a one-letter value, blank-padded by char(2)
        ))
    if quality == "dirty":
        return rng.choice((code.lower(), code.lower(), code.title(), f" {code.title()}"))
    return code


def draw_amount(rng: random.Random, quality: str) -> str:
    if quality == "invalid":
        return money(-rng.randint(1, 5_000))
    return money(rng.randint(199, 99_999))


def draw_customer(rng: random.Random, cfg: WorkloadConfig, customers: IdPool) -> int:
    """The customer of a new order: a live one, or (orphan_fraction) one the source never had."""
    if not customers or rng.random() < cfg.orphan_fraction:
        return ORPHAN_CUSTOMER_BASE + rng.randrange(1_000_000)
    return customers.choice(rng)


def draw_row(rng: random.Random, table: str, row_id: int, cfg: WorkloadConfig, clock_us: int, customers: IdPool,
             *, snapshot: bool = False) -> dict[str, Any]:
    """A fresh row; snapshot rows were created during the month before the snapshot started."""
    if snapshot:
        created = clock_us - rng.randrange(1_000_000, 30 * DAY_US)
        updated = created + rng.randrange(clock_us - created)
    else:
        created = updated = clock_us
    quality = draw_quality(rng, cfg)
    if table == "customers":
        spoiled = rng.choice(("email", "country"))
        name = draw_full_name(rng)
        values: dict[str, Any] = {
            "id": row_id,
            "email": draw_email(rng, name, row_id, quality if spoiled == "email" else "ok"),
            "full_name": name,
            "country": draw_country(rng, quality if spoiled == "country" else "ok"),
        }
    else:
        spoiled = rng.choice(("status", "amount", "currency")) if quality == "invalid" else ""
        status = weighted(rng, SNAPSHOT_STATUS_WEIGHTS) if snapshot else "placed"
        currency = weighted(rng, CURRENCY_WEIGHTS)
        values = {
            "id": row_id,
            "customer_id": draw_customer(rng, cfg, customers),
            "status": rng.choice(BAD_STATUSES) if spoiled == "status" else status,
            "amount": draw_amount(rng, "invalid" if spoiled == "amount" else "ok"),
            "currency": rng.choice(BAD_CURRENCIES) if spoiled == "currency" else currency,
        }
    row = values | {"created_at": iso(created), "updated_at": iso(updated)}
    return {column: row[column] for column in COLUMNS[table]}
