"""The simulated upstream `shop` database and its Debezium connector.

Tests, benchmarks and demos need change streams whose correct outcome is known exactly, including
the awkward cases of the contract (replays after a connector restart, re-inserted ids, orphans,
dirty and malformed data). :class:`ShopSource` plays the database *and* the connector, so its
``state`` is the ground truth that the lake must converge to, whatever the stream looked like.

Everything is driven by one ``random.Random``: the same seed and workload give byte-identical
messages, and a saved simulation continues exactly as an uninterrupted one would.
"""

from __future__ import annotations

from lakehouse_dev.generator.kafka import KafkaUnavailableError, ensure_topics, produce
from lakehouse_dev.generator.source import ShopSource
from lakehouse_dev.generator.values import COUNTRIES, ORPHAN_CUSTOMER_BASE, Message, WorkloadConfig

__all__ = ["COUNTRIES", "ORPHAN_CUSTOMER_BASE", "KafkaUnavailableError", "Message", "ShopSource", "WorkloadConfig",
           "ensure_topics", "produce"]
