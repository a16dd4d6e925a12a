"""Producing the source's records to Kafka (acknowledged in bounded chunks, at a rate if asked) and the topics."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import ConfigResource, ConfigResourceType
from kafka.errors import KafkaError, TopicAlreadyExistsError

from lakehouse_dev.generator.values import ACK_EVERY, PROGRESS_EVERY, Message
from pipelines.lake.contract import TABLES, topic
from pipelines.runtime.config import KafkaSettings
from pipelines.runtime.kafka_clients import python_options

# The brokers: an address (a PLAINTEXT listener, as the tests' brokers have) or a whole [kafka] section, with
# its authentication.
Brokers = str | KafkaSettings

# --- Kafka ---------------------------------------------------------------------------------------------

class KafkaUnavailableError(RuntimeError):
    """The brokers could not be reached or did not take the records."""


def client_options(brokers: Brokers) -> dict[str, Any]:
    """kafka-python's options for `brokers`."""
    return python_options(brokers if isinstance(brokers, KafkaSettings) else KafkaSettings(bootstrap_servers=brokers))


def where(brokers: Brokers) -> str:
    """The brokers' address, as an error names them."""
    return brokers.bootstrap_servers if isinstance(brokers, KafkaSettings) else brokers


def optional_config(client: type, **config: Any) -> dict[str, Any]:
    # Settings newer kafka-python releases know; older ones reject unknown keys outright.
    known = getattr(client, "DEFAULT_CONFIG", {})
    return {name: value for name, value in config.items() if name in known}


def produce(
    messages: Iterable[Message],
    bootstrap: Brokers,
    *,
    rate: float | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Send ``messages`` in order and wait until the brokers acknowledged all of them.

    Order matters: replays and delete/tombstone pairs only mean something in the order they were
    generated, and the default partitioner keeps each key's records in one partition, in order.
    """
    batch = messages if isinstance(messages, Sequence) else list(messages)
    total = len(batch)
    if compacted := _compacted({m.topic for m in batch if m.key is None}, bootstrap):
        # A compacted topic (the source topics after an erasure, hudi_configs/gdpr.toml) refuses a record
        # without a key, as it would refuse Debezium's: a keyless malformed record goes with an empty key there.
        batch = [Message(m.topic, b"", m.value) if m.key is None and m.topic in compacted else m for m in batch]
    try:
        producer = KafkaProducer(
            **client_options(bootstrap),
            acks="all",
            linger_ms=20,
            # Batches of up to 1 MiB instead of kafka-python's 16 KiB: a record with its Connect
            # schema is about 2 KB, so the default sent a handful per request. 83,671 records on
            # the local broker: 5,675 records/s with the default, 13,959 with this (both with the
            # crc32c extension, pyproject.toml; 1,479 and 2,200 without it).
            batch_size=1 << 20,
            **optional_config(KafkaProducer, enable_idempotence=True, bootstrap_timeout_ms=15_000),
        )
    except KafkaError as exc:
        raise KafkaUnavailableError(f"cannot reach Kafka at {where(bootstrap)}: {exc}") from exc
    failures: list[BaseException] = []
    try:
        started = time.monotonic()
        for sent, message in enumerate(batch, 1):
            producer.send(message.topic, key=message.key, value=message.value).add_errback(failures.append)
            if rate:
                delay = started + sent / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            if sent % ACK_EVERY == 0:
                # Wait for the acknowledgements of what is buffered: a backlog of a million records
                # queued at once outlives the producer's delivery timeout (records expire unsent).
                producer.flush()
            if progress and (sent % PROGRESS_EVERY == 0 or sent == total):
                progress(sent, total)
        producer.flush()
    except KafkaError as exc:
        raise KafkaUnavailableError(f"producing to Kafka at {where(bootstrap)} failed: {exc}") from exc
    finally:
        producer.close(timeout=10)  # after a failure, do not hang on records that will never go out
    if failures:
        raise KafkaUnavailableError(
            f"Kafka at {where(bootstrap)} did not acknowledge {len(failures)} of {total} records: {failures[0]}"
        )
    return total


def _compacted(topics: set[str], bootstrap: Brokers) -> set[str]:
    """Those of `topics` whose cleanup.policy compacts (a topic not there yet is not)."""
    if not topics:
        return set()
    try:
        admin = KafkaAdminClient(**client_options(bootstrap), client_id="shop-generator",
                                 **optional_config(KafkaAdminClient, bootstrap_timeout_ms=15_000))
    except KafkaError as exc:
        raise KafkaUnavailableError(f"cannot reach Kafka at {where(bootstrap)}: {exc}") from exc
    try:
        existing = set(admin.list_topics()) & topics
        found = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, t, configs=["cleanup.policy"])
                                        for t in sorted(existing)]) if existing else {}
    except KafkaError as exc:
        raise KafkaUnavailableError(f"reading the topics' configs on Kafka at {where(bootstrap)} failed: "
                                    f"{exc}") from exc
    finally:
        admin.close()
    return {t for t, configs in dict(found).get("topic", {}).items()
            if "compact" in configs.get("cleanup.policy", {}).get("value", "delete")}


def ensure_topics(bootstrap: Brokers, partitions: int = 3, topics: Iterable[str] | None = None) -> None:
    """Create the source topics if missing (`topics`, default the shop's), so the keyed records spread over
    several partitions: a broker would create a topic it is first sent to with one partition.

    Existing topics are left as they are (whatever their partition count), which keeps this safe to
    call before every run.
    """
    try:
        admin = KafkaAdminClient(
            **client_options(bootstrap),
            client_id="shop-generator",
            **optional_config(KafkaAdminClient, bootstrap_timeout_ms=15_000),
        )
    except KafkaError as exc:
        raise KafkaUnavailableError(f"cannot reach Kafka at {where(bootstrap)}: {exc}") from exc
    try:
        existing = set(admin.list_topics())
        for name in topics if topics is not None else map(topic, TABLES):
            if name in existing:
                continue
            with contextlib.suppress(TopicAlreadyExistsError):  # another run created it meanwhile: fine
                admin.create_topics({name: {"num_partitions": partitions}}, wait_for_metadata=True)
    except KafkaError as exc:
        raise KafkaUnavailableError(f"creating topics on Kafka at {where(bootstrap)} failed: {exc}") from exc
    finally:
        admin.close()
