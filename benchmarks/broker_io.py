"""The harness's own side of the broker: topics, input, and reading a peer's output.

It uses aiokafka directly (not the engine under test). Output topics are created
with ``message.timestamp.type=LogAppendTime``, so every output record carries the
broker's time of append: the throughput of a run is measured between the first and
the last output append, and a record's latency is its append time minus the
``ts`` its producer wrote into it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from benchmarks.workloads import PARTITIONS, order


def _quiet_startup_noise(record: logging.LogRecord) -> bool:
    # A fresh topic's partitions answer "not leader", and a fresh broker has no group
    # coordinator, for a moment; aiokafka retries both, and logs them as errors.
    message = record.getMessage()
    return "NotLeaderForPartition" not in message and "GroupCoordinatorNotAvailable" not in message


for _name in ("aiokafka.producer.sender", "aiokafka.consumer.fetcher", "aiokafka.consumer.group_coordinator"):
    logging.getLogger(_name).addFilter(_quiet_startup_noise)


async def create_topics(bootstrap: str, inputs: list[str], outputs: list[str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        append_time = {"message.timestamp.type": "LogAppendTime"}
        await admin.create_topics([NewTopic(n, PARTITIONS, 1) for n in inputs]
                                  + [NewTopic(n, PARTITIONS, 1, topic_configs=append_time) for n in outputs])
    finally:
        await admin.close()


async def produce_timed(bootstrap: str, records: list[tuple[str, bytes, bytes, int]]) -> None:
    """``(topic, key, value, timestamp ms)`` records in their order, partitioned by key (murmur2)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=256 * 1024)
    await producer.start()
    try:
        for topic, key, value, timestamp in records:
            await producer.send(topic, value, key=key, timestamp_ms=timestamp)
        await producer.flush()
    finally:
        await producer.stop()


async def produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    """All of ``records``, partitioned by key (murmur2, as Kafka's Java clients do)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=256 * 1024)
    await producer.start()
    try:
        for key, value in records:
            await producer.send(topic, value, key=key)
        await producer.flush()
    finally:
        await producer.stop()


class FixedRateProducer:
    """Orders at ``rate`` per second, each stamped with its send time (``ts``), sent at once (linger 0)."""

    def __init__(self, bootstrap: str, topic: str, rate: int, seed: int = 11) -> None:
        self.topic = topic
        self.rate = rate
        self._rng = random.Random(seed)
        self._producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
        self._sent = 0

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    async def send_for(self, seconds: float, until: Callable[[], bool] = lambda: False,
                       passes: Callable[[bytes], bool] = lambda v: True, **extra: object) -> int:
        """Send for ``seconds`` (or until ``until()``); return how many sent records lead to output."""
        start = time.monotonic()
        sent = passing = 0
        tick = 0.01
        while not until():
            elapsed = time.monotonic() - start
            if elapsed >= seconds:
                break
            due = int(elapsed * self.rate) + 1 - sent
            for _ in range(max(due, 0)):
                key, value = order(self._sent, self._rng, time.time(), **extra)
                await self._producer.send(self.topic, value, key=key)
                self._sent += 1
                sent += 1
                passing += passes(value)
            await asyncio.sleep(tick)
        await self._producer.flush()
        return passing


class OutputTail:
    """Reads an output topic from its start, keeping what the figures need.

    ``catch_up`` reads up to the end offsets of the moment. It keeps the number of
    records, the first and last append time (with ``append_times``, every one), the last value per key (as an int, for
    ``count``) and, for latency runs, the latency of every record stamped ``ts``.
    """

    def __init__(self, bootstrap: str, topic: str, *, counts: bool = False, latencies: bool = False,
                 append_times: bool = False, values: bool = False) -> None:
        self.topic = topic
        self._counts = counts
        # The last raw value per key (None: a tombstone), for the DSL workloads' checks.
        self._values = values
        self._latencies = latencies
        self._consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                          max_partition_fetch_bytes=4 * 1024 * 1024)
        # End offsets through a consumer of their own: a broker answers one connection's requests in
        # order, so behind the reader's fetch (which waits up to fetch.max.wait.ms) they would take 500 ms.
        self._offsets = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        self._tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        self.records = 0
        self.first_ms: int | None = None
        self.last_ms: int | None = None
        self.last_values: dict[bytes, Any] = {}
        self.latencies_ms: list[float] = []
        self.warmup_records = 0
        # Every record's append time, when asked for: the steady rate after a warm-up part needs them.
        self.append_times_ms: list[int] | None = [] if append_times else None

    async def start(self) -> None:
        await self._offsets.start()
        await self._consumer.start()
        self._consumer.assign(self._tps)
        await self._consumer.seek_to_beginning(*self._tps)
        # Paused between catch-ups: no fetching (and no harness CPU) while a peer is being timed.
        self._consumer.pause(*self._tps)

    async def stop(self) -> None:
        await self._consumer.stop()
        await self._offsets.stop()

    async def end_total(self) -> int:
        return sum((await self._offsets.end_offsets(self._tps)).values())

    async def catch_up(self) -> None:
        ends = await self._offsets.end_offsets(self._tps)
        self._consumer.resume(*self._tps)
        try:
            while [tp for tp in self._tps if await self._consumer.position(tp) < ends[tp]]:
                for records in (await self._consumer.getmany(timeout_ms=200, max_records=10_000)).values():
                    for r in records:
                        self._take(r.key, r.value, r.timestamp)
        finally:
            self._consumer.pause(*self._tps)

    def _take(self, key: bytes, value: bytes, append_ms: int) -> None:
        self.records += 1
        self.first_ms = append_ms if self.first_ms is None else min(self.first_ms, append_ms)
        self.last_ms = append_ms if self.last_ms is None else max(self.last_ms, append_ms)
        if self.append_times_ms is not None:
            self.append_times_ms.append(append_ms)
        if self._counts:
            self.last_values[key] = int(value)
        elif self._values:
            self.last_values[key] = value
        if self._latencies:
            order = orjson.loads(value)
            if order.get("warmup"):
                self.warmup_records += 1
            else:
                self.latencies_ms.append(append_ms - order["ts"] * 1000)


class GroupWatch:
    """Tells when a consumer group first became Stable with members: a peer has its partitions.

    The coordinator is looked up once; a group that does not exist yet reads as "Dead" or "Empty".
    """

    def __init__(self, bootstrap: str, group: str) -> None:
        self.group = group
        self._admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        self._coordinator: int | None = None

    async def start(self) -> None:
        await self._admin.start()

    async def stop(self) -> None:
        await self._admin.close()

    async def stable(self) -> bool:
        try:
            if self._coordinator is None:
                self._coordinator = await self._admin.find_coordinator(self.group)
            [response] = await self._admin.describe_consumer_groups([self.group], self._coordinator)
        except KafkaError:
            # No coordinator yet (a fresh broker creates __consumer_offsets on first use): not Stable.
            self._coordinator = None
            return False
        for group in response.groups:
            _error, group_id, state, _protocol_type, _protocol, members = group[:6]
            if group_id == self.group and state == "Stable" and members:
                return True
        return False


async def warm_up(bootstrap: str, topic: str, records: int) -> None:
    """Read ``topic`` once through a consumer group, so that the broker's fetch and commit
    paths (and ``__consumer_offsets``) are warm before the first peer is timed, not during its run."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"warm-up-{topic}",
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    try:
        seen = 0
        while seen < records:
            for batch in (await consumer.getmany(timeout_ms=500, max_records=10_000)).values():
                seen += len(batch)
        await consumer.commit()
    finally:
        await consumer.stop()
