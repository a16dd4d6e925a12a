"""The erasure's Kafka side: tombstones for the erased keys on the source topics, with log compaction on them, so
that Kafka drops the raw events as the lake dropped the rows (contract section 4; `erase` step 5)."""

from __future__ import annotations

import json

import hudi_configs
from pipelines.gdpr.find import Target, subject_tables
from pipelines.runtime.config import KafkaSettings
from pipelines.runtime.kafka_clients import connect_json, python_options


def kafka_tombstones(brokers: KafkaSettings, target: Target,
                     key_types: dict[str, tuple[str, ...]]) -> dict[str, object]:
    """Tombstones for the erased keys, and log compaction on the source topics, so Kafka drops the raw events.

    The topics are those of the target's declaration. A table keyed by its subject gets one per
    customer, every other one per row of theirs (its key columns, integers as JSON numbers:
    `key_types`), in each form a record's key may take (`_key_forms`). Rows that moved keep their key: their
    newest record is another customer's row.
    """
    from kafka import KafkaProducer
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

    configs = hudi_configs.section("gdpr", "kafka_topics")
    decl = target.decl
    topics = list(decl.topics())
    admin = KafkaAdminClient(**python_options(brokers), client_id="lakehouse-gdpr")
    try:
        admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, t, configs=configs) for t in topics])
    finally:
        admin.close()
    keys: list[tuple[str, dict[str, object]]] = []
    for name, table in subject_tables(decl).items():
        if table.subject is not None and table.key == (table.subject,):
            keys += [(name, {table.subject: c}) for c in target.customers]
            continue
        types = key_types.get(name, ())
        for text in sorted(target.rows.get(name, ())):
            values = json.loads(text)
            keys.append((name, {c: int(v) if v is not None and i < len(types) and types[i] in _INTEGERS else v
                                for i, (c, v) in enumerate(zip(table.key, values, strict=True))}))
    producer = KafkaProducer(**python_options(brokers), acks="all")
    try:
        for name, record_key in keys:
            for key in _key_forms(record_key):
                producer.send(decl.topic(name), key=key, value=None)
        producer.flush(60)
    finally:
        producer.close()
    return {"tombstones": len(keys), "topics": topics, "topic_config": configs}


_INTEGERS = ("bigint", "int", "smallint", "tinyint")


def _key_forms(record_key: dict[str, object]) -> set[bytes]:
    """The key bytes a source topic's records of `record_key` may carry: Kafka Connect's compact JSON (Debezium)
    and the spaced form the contract writes (`{"id": 42}`). Compaction keeps one record per key *bytes*, in the
    partition those bytes hash to: a tombstone removes only the records of its own form, and one of a form no
    record has is dropped by the next compaction."""
    return {connect_json(record_key), json.dumps(record_key).encode()}
