"""Records written to Kafka outside any event loop of ours: the executors' side of a Spark stage
whose output goes straight to its sink topic (``streamloop.spark.kafka_writer``, which runs in
Spark's Python workers).

In the Kafka transport because aiokafka is used only here (``tests/unit/transport/test_kafka_boundaries``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from aiokafka import AIOKafkaProducer

from .executor_clients import borrowed, run

__all__ = ["PRODUCER_OPTIONS", "write_records"]

# aiokafka producer options an executor's writer takes over from the stream thread's client
# options; the rest (a group's, an SSL context, a token provider) stay behind, as for the reader.
PRODUCER_OPTIONS = frozenset({
    "bootstrap_servers", "client_id", "request_timeout_ms", "retry_backoff_ms", "security_protocol",
    "sasl_mechanism", "sasl_plain_username", "sasl_plain_password", "api_version", "connections_max_idle_ms",
    "metadata_max_age_ms",
})


def write_records(kafka: Mapping[str, Any], topic: str,
                  records: Iterable[tuple[int, bytes | None, bytes | None, int]]) -> int:
    """Produce ``(partition, key, value, timestamp)`` records to ``topic`` and wait until the
    broker acknowledged every one of them (``acks=all``), on a private event loop (this is a Spark
    task's thread, not a loop of ours; the worker's producer, kept across ranges:
    ``executor_clients``). Returns how many were written; raises the first send's
    error, which fails the Spark task: Spark runs it again, and the engine's job error after that
    (a record written twice is at-least-once; none is committed past before its write returned)."""
    options = {key: value for key, value in kafka.items() if key in PRODUCER_OPTIONS}

    async def start() -> Any:
        producer = AIOKafkaProducer(**options, acks="all", linger_ms=5, max_batch_size=256 * 1024)
        await producer.start()
        return producer

    async def write(producer: Any) -> int:
        pending = []
        for partition, key, value, timestamp in records:
            pending.append(await producer.send(topic, value, key=key, partition=partition, timestamp_ms=timestamp))
        await producer.flush()
        for delivered in pending:
            delivered.result()  # raises a failed send's error
        return len(pending)

    with borrowed("producer", options, start) as producer:
        return run(write(producer))
