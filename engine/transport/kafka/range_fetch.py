"""One partition's offset range, read outside any event loop of ours: the executors' side of a Spark
stage that reads Kafka itself (``streamloop.spark.kafka_reader``, which runs in Spark's Python workers).

In the Kafka transport because aiokafka is used only here (``tests/unit/transport/test_kafka_boundaries``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from .executor_clients import borrowed, run

__all__ = ["fetch_range"]

# A range's records are all in the log already (it ends at an end offset seen), so the broker has
# nothing to wait for; a long fetch wait only holds up the fetch at a new range's start, which
# follows the worker consumer's last fetch past the previous range (500 ms a range at aiokafka's
# default, measured: 10 records in 510 ms, and in 20 ms at this bound).
FETCH_MAX_WAIT_MS = 10


def fetch_range(kafka: Mapping[str, Any], topic: str, partition: int, start_offset: int, end: int,
                stall_ms: int) -> Iterator[Any]:
    """The records of ``topic``-``partition`` from ``start_offset`` up to ``end`` (exclusive) in
    offset order, fetched by a consumer of no group (the worker's, kept across ranges:
    ``executor_clients``). Raises ``TimeoutError`` when no offset of the range arrives for
    ``stall_ms``: the Spark task fails and Spark runs it again (its retries, then the job's error,
    which the engine retries)."""
    tp = TopicPartition(topic, partition)
    options = {**kafka, "enable_auto_commit": False, "group_id": None, "auto_offset_reset": "none",
               "fetch_max_wait_ms": min(int(kafka.get("fetch_max_wait_ms", FETCH_MAX_WAIT_MS)), FETCH_MAX_WAIT_MS)}

    async def start() -> Any:
        consumer = AIOKafkaConsumer(**options)
        await consumer.start()
        return consumer

    async def assign(consumer: Any) -> None:
        # aiokafka's assignment makes futures of the running loop: inside it, not beside it.
        consumer.assign([tp])
        consumer.seek(tp, start_offset)

    with borrowed("consumer", options, start) as consumer:
        run(assign(consumer))
        position = start_offset
        progress = time.monotonic()
        while position < end:
            fetched = run(consumer.getmany(tp, timeout_ms=500))
            for raw in fetched.get(tp, ()):
                if raw.offset >= end:
                    break
                yield raw
            # Transaction markers and aborted records move the position without a record.
            moved = run(consumer.position(tp))
            if moved > position:
                position, progress = moved, time.monotonic()
            elif time.monotonic() - progress > stall_ms / 1000.0:
                raise TimeoutError(f"reading {topic}-{partition} offsets {start_offset}..{end - 1}: "
                                   f"no progress at {position} for {stall_ms} ms")
