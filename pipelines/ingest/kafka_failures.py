"""Whether Kafka caused a streaming query's failure, told from the Java throwables of its cause chain.

The stream waits for Kafka and starts again after such a failure (`bronze._restart_after`), while any other
failure stops it: a broker that is down or a network that drops is not the pipeline's fault.
"""

from __future__ import annotations

from py4j.java_gateway import JavaObject

# A query's failure that Kafka caused, told by the Java throwables of its cause chain: the Kafka clients' timeouts
# and lost connections (these classes or a subclass), or whatever Spark's Kafka source threw while fetching records
# (a frame of its record fetcher on the stack: a fetch that timed out, records it could not get).
KAFKA_ERRORS = frozenset({"org.apache.kafka.common.errors.TimeoutException",
                          "org.apache.kafka.common.errors.DisconnectException",
                          "org.apache.kafka.common.errors.NetworkException"})
KAFKA_FETCHER = "org.apache.spark.sql.kafka010.consumer.KafkaDataConsumer"


def kafka_caused(exc: BaseException) -> bool:
    """Whether Kafka caused the query's failure: a Java throwable of its cause chain is one of KAFKA_ERRORS (or of
    their subclasses), or was thrown inside KAFKA_FETCHER.

    The chain is followed through Python's causes too: a failure of the batch function reaches the query as the
    text of its Python traceback only (py4j's proxy error), so `_run_query` makes what the batch raised the cause,
    with the Java throwable pyspark keeps in it. A task's throwable is the cause of its job's failure on the driver
    (Spark sends it back whole: the Kafka classes are on the driver's class path too).
    """
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        # pyspark's captured exceptions keep the Java throwable as `_origin`, py4j's own errors as `java_exception`.
        throwable = getattr(error, "_origin", None) or getattr(error, "java_exception", None)
        while throwable is not None:
            if _kafkas(throwable):
                return True
            cause = throwable.getCause()
            throwable = None if cause is None or cause.equals(throwable) else cause
        error = error.__cause__ or error.__context__
    return False


def _kafkas(throwable: JavaObject) -> bool:
    """One Java throwable: of a class in KAFKA_ERRORS or under one, or with KAFKA_FETCHER on its stack."""
    kind = throwable.getClass()
    while kind is not None:
        if kind.getName() in KAFKA_ERRORS:
            return True
        kind = kind.getSuperclass()
    return any(frame.getClassName().startswith(KAFKA_FETCHER) for frame in throwable.getStackTrace())
