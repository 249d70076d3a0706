"""One partition's offset range, read outside any event loop of ours: the executors' side of a Spark
stage that reads Kafka itself (``streamloop.spark.kafka_reader``, which runs in Spark's Python workers).

In the Kafka transport because aiokafka is used only here (``tests/unit/transport/test_kafka_boundaries``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

__all__ = ["fetch_range"]


def fetch_range(kafka: Mapping[str, Any], topic: str, partition: int, start_offset: int, end: int,
                stall_ms: int) -> Iterator[Any]:
    """The records of ``topic``-``partition`` from ``start_offset`` up to ``end`` (exclusive) in
    offset order, fetched by a consumer of no group on a private event loop (this is a Spark task's
    thread, not a loop of ours). Raises ``TimeoutError`` when no offset of the range arrives for
    ``stall_ms``: the Spark task fails and Spark runs it again (its retries, then the job's error,
    which the engine retries)."""
    tp = TopicPartition(topic, partition)
    loop = asyncio.new_event_loop()

    async def start() -> Any:
        consumer = AIOKafkaConsumer(**{**kafka, "enable_auto_commit": False, "group_id": None,
                                       "auto_offset_reset": "none"})
        await consumer.start()
        consumer.assign([tp])
        consumer.seek(tp, start_offset)
        return consumer

    consumer = loop.run_until_complete(start())
    try:
        position = start_offset
        progress = time.monotonic()
        while position < end:
            fetched = loop.run_until_complete(consumer.getmany(tp, timeout_ms=500))
            for raw in fetched.get(tp, ()):
                if raw.offset >= end:
                    break
                yield raw
            # Transaction markers and aborted records move the position without a record.
            moved = loop.run_until_complete(consumer.position(tp))
            if moved > position:
                position, progress = moved, time.monotonic()
            elif time.monotonic() - progress > stall_ms / 1000.0:
                raise TimeoutError(f"reading {topic}-{partition} offsets {start_offset}..{end - 1}: "
                                   f"no progress at {position} for {stall_ms} ms")
    finally:
        loop.run_until_complete(consumer.stop())
        loop.close()
