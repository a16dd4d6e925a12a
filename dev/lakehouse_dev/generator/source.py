"""`ShopSource`: the `shop` database and its Debezium connector, and the truth the lake must reach."""

from __future__ import annotations

import base64
import json
import random
from collections import Counter
from collections.abc import Iterable
from typing import Any

from lakehouse_dev.generator.connector import Connector, snapshot_marker
from lakehouse_dev.generator.schemas import PG_TYPES, column_schema
from lakehouse_dev.generator.values import (
    BAD_STATUSES,
    CLOCK_START_US,
    CUSTOMER_SHARE,
    INSERT_SHARE,
    MALFORMED_KINDS,
    MESSAGE_KEY,
    NEXT_STATUS,
    IdPool,
    Message,
    Sent,
    WorkloadConfig,
    draw_amount,
    draw_country,
    draw_email,
    draw_full_name,
    draw_quality,
    draw_row,
    dumps,
    iso,
    key_of,
    sequence,
)
from pipelines.lake.contract import COLUMNS, PRIMARY_KEY, TABLES, topic
from pipelines.runtime import settings

STAT_KEYS = (
    "r", "c", "u", "d", "t", "m", "tombstone", "replayed", "malformed",
    "invalid_values", "dirty_values", "orphan_orders", "schema_format",
)


class ShopSource(Connector):
    """The `shop` database plus its connector: emits exactly what Debezium would, and knows the truth.

    ``state`` holds every live row exactly as its last ``after`` image carried it, so a pipeline that
    applies the stream correctly (newest LSN per key wins) ends up with exactly ``state``.
    """

    def __init__(self, seed: int = 7) -> None:
        self._rng = random.Random(seed)
        self.state: dict[str, dict[int, dict[str, Any]]] = {table: {} for table in TABLES}
        # The WAL position before anything was captured; real LSNs are byte offsets, hence large.
        self.lsn: int = self._rng.randrange(20_000_000, 30_000_000)
        self.stats: Counter[str] = Counter()
        self._tx_id = self._rng.randrange(500, 1000)
        self._clock_us = CLOCK_START_US
        self._next_id = dict.fromkeys(TABLES, 1)
        self._live = {table: IdPool() for table in TABLES}
        self._reinsert: dict[str, list[int]] = {table: [] for table in TABLES}
        self._history: dict[str, list[Sent]] = {topic(table): [] for table in TABLES}
        # Each table's columns and Connect types while they differ from the contract's (`alter`).
        self.columns: dict[str, dict[str, str] | None] = dict.fromkeys(TABLES)

    # --- public operations --------------------------------------------------------------------------

    def snapshot(self, cfg: WorkloadConfig) -> list[Message]:
        """The initial snapshot: existing rows as op=r events that all carry the snapshot's one LSN."""
        if self.stats or any(self.state.values()):
            raise RuntimeError("snapshot() needs an empty source: Debezium snapshots on first start only")
        for table, count in (("customers", cfg.customers), ("orders", cfg.orders)):
            for _ in range(count):
                self._put(table, self._new_row(table, self._take_new_id(table), cfg, snapshot=True))
        self.lsn += self._rng.randint(56, 4000)
        self._tx_id += 1
        records = [(table, row) for table in TABLES for row in self.state[table].values()]
        tables = [table for table, _ in records]
        out: list[Message] = []
        for i, (table, row) in enumerate(records):
            self._clock_us += self._rng.randint(20, 400)
            source = self._source(table, sequence(None, self.lsn), snapshot_marker(tables, i))
            self._emit(out, cfg, table, "r", None, row, source)
        self._trim_history()
        return out

    def changes(self, cfg: WorkloadConfig) -> list[Message]:
        """``cfg.changes`` inserts/updates/deletes, plus the noise a real topic carries around them."""
        out: list[Message] = []
        n = cfg.changes
        first_replay = n // 4  # a restart needs some history behind it to re-deliver
        replay_at = set(self._rng.sample(range(first_replay, n), min(cfg.replay_runs, n - first_replay)))
        message_at = set(self._rng.sample(range(n), min(n, max(1, n // 400)))) if cfg.other_ops else set()
        call_start = {name: len(history) for name, history in self._history.items()}
        for i in range(n):
            self._change(out, cfg)
            if i in message_at:
                self._logical_message(out, cfg)
            if self._rng.random() < cfg.malformed_fraction:
                out.append(self._malformed(cfg))
            if i in replay_at:
                out.extend(self._replay(call_start))
        self._trim_history()
        return out

    def truncate(self, table: str, cfg: WorkloadConfig | None = None) -> list[Message]:
        """A TRUNCATE of ``table``: Debezium sends one op=t event without a key (no row is named)."""
        cfg = cfg or WorkloadConfig()
        source = self._commit(table)
        envelope = self._envelope("t", None, None, source)
        self.stats["t"] += 1
        self.state[table].clear()
        self._live[table] = IdPool()
        # Replays never reach back across a truncate: the contract orders events per key, and a
        # replayed pre-truncate insert has no key-level LSN left in the table to lose against.
        self._history[topic(table)].clear()
        return [Message(topic(table), None, self._encode(table, envelope, cfg))]

    def alter(self, table: str, *, add: dict[str, str] | None = None, retype: dict[str, str] | None = None,
              drop: Iterable[str] = ()) -> str:
        """A change of the table's shape (contract section 6), returned as PostgreSQL DDL for the SQL sink.

        `add` and `retype` map columns to Kafka Connect types (`int32`, `int64`, `string`, ...);
        Debezium sends no event for DDL: the next change of the table carries the new shape.
        """
        columns = dict(self._columns(table))
        ddl = []
        for name, kind in (add or {}).items():
            columns[name] = kind
            ddl.append(f"ADD COLUMN {name} {PG_TYPES[kind]}")
        for name, kind in (retype or {}).items():
            columns[name] = kind
            ddl.append(f"ALTER COLUMN {name} TYPE {PG_TYPES[kind]}")
        for name in drop:
            del columns[name]
            ddl.append(f"DROP COLUMN {name}")
        self.columns[table] = columns
        self.state[table] = {k: self._shaped(table, row) for k, row in self.state[table].items()}
        return f"ALTER TABLE {table} " + ", ".join(ddl)

    def update(self, table: str, row_id: int, values: dict[str, Any], cfg: WorkloadConfig | None = None,
               *, unchanged: Iterable[str] = ()) -> list[Message]:
        """A scripted UPDATE of one live row (tests and benchmarks that need the same change on two databases).

        `unchanged` names TOASTed columns the update leaves as they are: Debezium sends its placeholder
        (`settings.unavailable_placeholder()`) in their place, under REPLICA IDENTITY DEFAULT.
        """
        if row_id not in self.state[table]:
            raise KeyError(f"{table} has no live row {row_id}")
        unknown = set(values) - set(self._columns(table)) | ({PRIMARY_KEY} & set(values))
        if unknown:
            raise ValueError(f"cannot set {sorted(unknown)} of {table}")
        source = self._commit(table)
        row = self._shaped(table, self.state[table][row_id] | values | {"updated_at": iso(self._clock_us)})
        self.state[table][row_id] = row
        out: list[Message] = []
        placeholder = settings.unavailable_placeholder()
        self._emit(out, cfg or WorkloadConfig(), table, "u", None, row, source,
                   image=row | dict.fromkeys(unchanged, placeholder))
        return out

    def delete(self, table: str, row_id: int, cfg: WorkloadConfig | None = None) -> list[Message]:
        """A scripted DELETE of one live row: the delete event and its tombstone."""
        if row_id not in self.state[table]:
            raise KeyError(f"{table} has no live row {row_id}")
        out: list[Message] = []
        self._delete(out, cfg or WorkloadConfig(reinsert_fraction=0.0), table, row_id)
        return out

    def to_json(self) -> str:
        """Everything a later run needs to continue exactly where this one stopped."""
        version, internal, gauss = self._rng.getstate()
        doc = {
            "format": 1,
            "rng": [version, list(internal), gauss],
            "lsn": self.lsn,
            "tx_id": self._tx_id,
            "clock_us": self._clock_us,
            "next_id": self._next_id,
            "state": {table: list(rows.values()) for table, rows in self.state.items()},
            "columns": self.columns,
            "live": {table: pool.ids for table, pool in self._live.items()},
            "reinsert": self._reinsert,
            "stats": dict(self.stats),
            "history": {
                name: [
                    [sent.kind, sent.row_id, text_of(sent.message.key), text_of(sent.message.value)]
                    for sent in history
                ]
                for name, history in self._history.items()
            },
        }
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> ShopSource:
        """Restore a simulation saved by :meth:`to_json`."""
        doc = json.loads(text)
        if doc.get("format") != 1:
            raise ValueError(f"unsupported ShopSource state format {doc.get('format')!r}")
        source = cls()
        version, internal, gauss = doc["rng"]
        source._rng.setstate((version, tuple(internal), gauss))
        source.lsn = doc["lsn"]
        source._tx_id = doc["tx_id"]
        source._clock_us = doc["clock_us"]
        source._next_id = doc["next_id"]
        source.columns = doc.get("columns") or dict.fromkeys(TABLES)
        source.state = {
            table: {row[PRIMARY_KEY]: row for row in rows} for table, rows in doc["state"].items()
        }
        source._live = {table: IdPool(ids) for table, ids in doc["live"].items()}
        source._reinsert = doc["reinsert"]
        source.stats = Counter(doc["stats"])
        source._history = {
            name: [
                Sent(Message(name, bytes_of(key), bytes_of(value)), kind, row_id)
                for kind, row_id, key, value in history
            ]
            for name, history in doc["history"].items()
        }
        return source

    # --- row changes -------------------------------------------------------------------------------

    def _change(self, out: list[Message], cfg: WorkloadConfig) -> None:
        rng = self._rng
        table = "customers" if rng.random() < CUSTOMER_SHARE else "orders"
        live = self._live[table]
        draw = rng.random()
        inserts_below = cfg.delete_fraction + (1 - cfg.delete_fraction) * INSERT_SHARE
        if not live or cfg.delete_fraction <= draw < inserts_below:
            self._insert(out, cfg, table)
        elif draw < cfg.delete_fraction:
            self._delete(out, cfg, table, live.choice(rng))
        else:
            self._update(out, cfg, table, live.choice(rng))

    def _insert(self, out: list[Message], cfg: WorkloadConfig, table: str) -> None:
        pending = self._reinsert[table]
        if pending and self._rng.random() < 0.5:
            row_id = pending.pop(self._rng.randrange(len(pending)))
        else:
            row_id = self._take_new_id(table)
        source = self._commit(table)
        row = self._shaped(table, self._new_row(table, row_id, cfg))
        self._put(table, row)
        self._emit(out, cfg, table, "c", None, row, source)

    def _update(self, out: list[Message], cfg: WorkloadConfig, table: str, row_id: int) -> None:
        rng = self._rng
        source = self._commit(table)
        row = dict(self.state[table][row_id])
        if table == "customers":
            for column in rng.sample(("email", "full_name", "country"), rng.randint(1, 2)):
                if column == "full_name":
                    row["full_name"] = draw_full_name(self._rng)
                elif column == "email":
                    row["email"] = draw_email(self._rng, row["full_name"], row_id, draw_quality(self._rng, cfg))
                else:
                    row["country"] = draw_country(self._rng, draw_quality(self._rng, cfg))
        elif cfg.move_fraction and rng.random() < cfg.move_fraction and len(self._live["customers"]) > 1:
            owner = row["customer_id"]
            while (other := self._live["customers"].choice(rng)) == owner:
                pass
            row["customer_id"] = other
        else:
            for column in rng.sample(("status", "amount"), rng.randint(1, 2)):
                quality = draw_quality(self._rng, cfg)
                following = NEXT_STATUS.get(row["status"], ("placed",))
                if column == "status" and quality == "invalid":
                    row["status"] = rng.choice(BAD_STATUSES)
                elif column == "status" and following:
                    row["status"] = rng.choice(following)
                else:  # an amount change, also when the status is final
                    row["amount"] = draw_amount(self._rng, quality)
        row["updated_at"] = iso(self._clock_us)
        row = self._shaped(table, row)
        self.state[table][row_id] = row
        self._emit(out, cfg, table, "u", None, row, source)

    def _delete(self, out: list[Message], cfg: WorkloadConfig, table: str, row_id: int) -> None:
        source = self._commit(table)
        del self.state[table][row_id]
        self._live[table].remove(row_id)
        if self._rng.random() < cfg.reinsert_fraction:
            self._reinsert[table].append(row_id)
        # REPLICA IDENTITY DEFAULT: the old row image carries the primary key only.
        before: dict[str, Any] = dict.fromkeys(self._columns(table))
        before[PRIMARY_KEY] = row_id
        self._emit(out, cfg, table, "d", before, None, source)
        self.stats["tombstone"] += 1
        self._remember(out, Message(topic(table), key_of(row_id), None), "tombstone", row_id)

    def _logical_message(self, out: list[Message], cfg: WorkloadConfig) -> None:
        """A pg_logical_emit_message() from the application: it takes a WAL position but no row."""
        table = self._rng.choice(TABLES)
        source = self._commit(table) | {"schema": "", "table": ""}
        action = self._rng.choice(("export", "login", "refund-review", "price-change"))
        content = dumps({"actor": "backoffice", "action": action, "at": iso(self._clock_us)})
        envelope = {
            "before": None,
            "after": None,
            "source": source,
            "op": "m",
            "ts_ms": self._processing_ms(source),
            "message": {"prefix": "audit", "content": base64.b64encode(content).decode()},
        }
        self.stats["m"] += 1
        self._remember(out, Message(topic(table), MESSAGE_KEY, self._encode("m", envelope, cfg)), "m", None)

    # --- noise: malformed records (replays: Connector._replay) -------------------------------------

    def _malformed(self, cfg: WorkloadConfig) -> Message:
        """A record the pipeline must park with a reason; none of them is a change of the database.

        The envelope-shaped ones carry a fresh random row for a live id, so a pipeline that wrongly
        applies one makes the lake diverge from ``state`` visibly.
        """
        rng = self._rng
        table = rng.choice(TABLES)
        kind = rng.choice(MALFORMED_KINDS)
        live = self._live[table]
        row_id = live.choice(rng) if live else self._next_id[table]
        key = None if rng.random() < 0.25 else key_of(row_id)
        self.stats["malformed"] += 1
        raw = {
            "truncated_json": b'{"op": "c", "after": ',
            "non_utf8": b'{"op":"c","after":{"id":\xff\xfe\xc3\x28}}',
            "json_array": b"[1,2,3]",
            "json_object": b'{"hello":"world"}',
            "json_string": b'"text"',
        }
        if kind in raw:
            return Message(topic(table), key, raw[kind])
        source = self._source(table, sequence(self.lsn, self.lsn), "false")
        row = self._new_row(table, row_id, cfg)
        if kind == "unknown_op":
            envelope = self._envelope("x", None, row, source)
        elif kind == "missing_lsn":
            envelope = self._envelope("u", None, row, {k: v for k, v in source.items() if k != "lsn"})
        elif kind == "create_without_after":
            envelope = self._envelope("c", None, None, source)
        else:
            envelope = self._envelope("c", None, row | {PRIMARY_KEY: "abc"}, source)
            key = None if key is None else key_of("abc")
        return Message(topic(table), key, self._encode(table, envelope, cfg))

    def _new_row(self, table: str, row_id: int, cfg: WorkloadConfig, *, snapshot: bool = False) -> dict[str, Any]:
        return draw_row(self._rng, table, row_id, cfg, self._clock_us, self._live["customers"], snapshot=snapshot)

    # --- rows ------------------------------------------------------------------------------------------

    def _take_new_id(self, table: str) -> int:
        row_id = self._next_id[table]
        self._next_id[table] += 1
        return row_id

    def _columns(self, table: str) -> dict[str, str]:
        """The table's columns and their Connect types now."""
        return self.columns[table] or {c: column_schema(table, c)["type"] for c in COLUMNS[table]}

    def _shaped(self, table: str, row: dict[str, Any]) -> dict[str, Any]:
        """`row` with the table's columns now: added ones null until set, dropped ones gone."""
        if self.columns[table] is None:
            return row
        return {c: row.get(c) for c in self.columns[table]}

    def _put(self, table: str, row: dict[str, Any]) -> None:
        row = self._shaped(table, row)
        self.state[table][row[PRIMARY_KEY]] = row
        self._live[table].add(row[PRIMARY_KEY])

def text_of(data: bytes | None) -> str | None:
    return None if data is None else data.decode()


def bytes_of(text: str | None) -> bytes | None:
    return None if text is None else text.encode()
