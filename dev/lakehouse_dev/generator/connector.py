"""The connector's side of the simulated source: Debezium envelopes, their encoding with either converter
setting, and the history a connector restart re-delivers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lakehouse_dev.generator.schemas import SCHEMA_BYTES, shape_schema
from lakehouse_dev.generator.values import (
    DATABASE,
    DEBEZIUM_VERSION,
    HISTORY_TAIL,
    ORPHAN_CUSTOMER_BASE,
    Message,
    Sent,
    WorkloadConfig,
    dirty,
    dumps,
    key_of,
    rejected,
    sequence,
)
from pipelines.lake.contract import PRIMARY_KEY, SCHEMA, TOPIC_PREFIX, topic


class Connector:
    """What Debezium adds to a database change: source block, envelope, encoding, delivery history, and the
    re-deliveries of a restart.

    A base of `ShopSource`, which owns the state these methods read (`lsn`, `_tx_id`, `_clock_us`,
    `_rng`, `_history`, `columns`, `stats`); kept apart so that the database's behaviour and the
    connector's format each read on their own.
    """

    def _commit(self, table: str) -> dict[str, Any]:
        """A new transaction: later clock, later LSN; `sequence` names the previous commit's LSN."""
        rng = self._rng
        self._clock_us += rng.randint(500_000, 5_000_000)
        previous = self.lsn
        self.lsn += rng.randint(56, 4000)
        self._tx_id += rng.randint(1, 3)
        return self._source(table, sequence(previous, self.lsn), "false")

    def _source(self, table: str, sequence: str, snapshot: str) -> dict[str, Any]:
        return {
            "version": DEBEZIUM_VERSION,
            "connector": "postgresql",
            "name": TOPIC_PREFIX,
            "ts_ms": self._clock_us // 1000,
            "snapshot": snapshot,
            "db": DATABASE,
            "sequence": sequence,
            "schema": SCHEMA,
            "table": table,
            "txId": self._tx_id,
            "lsn": self.lsn,
            "xmin": None,
        }

    def _processing_ms(self, source: dict[str, Any]) -> int:
        return source["ts_ms"] + self._rng.randint(2, 400)

    def _envelope(self, op: str, before: Any, after: Any, source: dict[str, Any]) -> dict[str, Any]:
        return {
            "before": before,
            "after": after,
            "source": source,
            "op": op,
            "ts_ms": self._processing_ms(source),
            "transaction": None,
        }

    def _encode(self, schema_name: str, envelope: dict[str, Any], cfg: WorkloadConfig) -> bytes:
        """The value bytes under one of the two converter settings, drawn per record."""
        payload = dumps(envelope)
        if self._rng.random() >= cfg.schema_fraction:
            return payload
        self.stats["schema_format"] += 1
        columns = self.columns.get(schema_name)
        schema = SCHEMA_BYTES[schema_name] if columns is None else shape_schema(schema_name, tuple(columns.items()))
        return b'{"schema":' + schema + b',"payload":' + payload + b"}"

    def _emit(
        self,
        out: list[Message],
        cfg: WorkloadConfig,
        table: str,
        op: str,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
        source: dict[str, Any],
        image: dict[str, Any] | None = None,
    ) -> None:
        """Emit a row change; `image` is the `after` sent when it differs from the row (placeholders)."""
        row_id = (after or before or {})[PRIMARY_KEY]
        self.stats[op] += 1
        if after is not None:
            if rejected(table, after):
                self.stats["invalid_values"] += 1
            elif dirty(table, after):
                self.stats["dirty_values"] += 1
            if table == "orders" and op != "u" and after["customer_id"] >= ORPHAN_CUSTOMER_BASE:
                self.stats["orphan_orders"] += 1
        sent = image if image is not None else after
        value = self._encode(table, self._envelope(op, before, sent, source), cfg)
        self._remember(out, Message(topic(table), key_of(row_id), value), op, row_id)

    def _remember(self, out: list[Message], message: Message, kind: str, row_id: int | None) -> None:
        out.append(message)
        self._history[message.topic].append(Sent(message, kind, row_id))

    def _trim_history(self) -> None:
        for history in self._history.values():
            del history[: max(0, len(history) - HISTORY_TAIL)]

    def _replay(self, call_start: dict[str, int]) -> list[Message]:
        """A connector restart: per topic, a contiguous run of older records is delivered again.

        The run is steered onto a delete whose id was re-inserted afterwards when there is one,
        because that is the replay a pipeline most easily gets wrong (it would delete a live row).
        """
        rng = self._rng
        replayed: list[Message] = []
        for name, history in self._history.items():
            sent_this_call = len(history) - call_start[name]
            if not sent_this_call:
                continue
            length = min(len(history), max(1, round(sent_this_call * rng.uniform(0.05, 0.15))))
            candidates = deletes_reinserted_later(history)
            if candidates:
                anchor = rng.choice(candidates)
                start = min(max(0, anchor - rng.randrange(length)), len(history) - length)
            else:
                start = rng.randrange(len(history) - length + 1)
            end = start + length
            if history[end - 1].kind == "d" and end < len(history):
                end += 1  # a delete and its tombstone are re-delivered together
            replayed.extend(sent.message for sent in history[start:end])
        self.stats["replayed"] += len(replayed)
        return replayed


def snapshot_marker(tables: Sequence[str], i: int) -> str:
    """Debezium's `source.snapshot` of the i-th record of a snapshot whose records belong to `tables`, in order."""
    if i == len(tables) - 1:
        return "last"
    if i == 0:
        return "first"
    if tables[i + 1] != tables[i]:
        return "last_in_data_collection"
    if tables[i - 1] != tables[i]:
        return "first_in_data_collection"
    return "true"


def deletes_reinserted_later(history: Sequence[Sent]) -> list[int]:
    """Positions of deletes whose id comes back with an insert later in ``history``."""
    inserted_later: set[int | None] = set()
    found = []
    for i in range(len(history) - 1, -1, -1):
        sent = history[i]
        if sent.kind == "c":
            inserted_later.add(sent.row_id)
        elif sent.kind == "d" and sent.row_id in inserted_later:
            found.append(i)
    found.reverse()
    return found
