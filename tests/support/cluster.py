"""A test's view of a cluster (Kafka or memory): create topics, produce input, read output."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pytest

from streamloop.records import ConsumerRecord, Headers, TopicPartition
from streamloop.serdes import Serde
from streamloop.transport.base import Transport

EVERY_BROKER = ["memory", pytest.param("kafka", marks=pytest.mark.kafka),
                pytest.param("kafka-defaults", marks=pytest.mark.kafka)]
"""The ``bootstrap`` variants of a group test: the memory broker, the session's Kafka broker (its
group timing shortened for speed) and a Kafka broker at Kafka's default group settings
(``group.initial.rebalance.delay.ms`` 3 s, ``group.min.session.timeout.ms`` 6 s)."""


class Cluster:
    def __init__(self, transport: Transport, bootstrap: str) -> None:
        self.transport = transport
        self.bootstrap = bootstrap

    async def create_topics(self, partitions: dict[str, int]) -> None:
        admin = self.transport.admin("test-admin")
        await admin.start()
        try:
            await admin.create_topics(partitions)
        finally:
            await admin.close()

    async def partition_counts(self, topics: Sequence[str]) -> dict[str, int]:
        admin = self.transport.admin("test-admin")
        await admin.start()
        try:
            return await admin.partition_counts(topics)
        finally:
            await admin.close()

    async def produce(
        self,
        topic: str,
        records: Iterable[tuple[Any, Any]],
        key_serde: Serde,
        value_serde: Serde,
        partitions: int,
        timestamp: int | None = None,
        headers: Callable[[int], Headers] | None = None,
    ) -> int:
        """Produce ``(key, value)`` pairs; the partition is the key's index modulo ``partitions``
        when the key is an int, else hashed like Kafka's default. ``headers(i)``: the headers of
        the ``i``-th record (none without it)."""
        from aiokafka.partitioner import murmur2

        producer = self.transport.producer(_producer_settings())
        await producer.start()
        count = 0
        try:
            for key, value in records:
                key_bytes = key_serde.serialize(key)
                if isinstance(key, int):
                    partition = key % partitions
                elif key_bytes is None:
                    partition = count % partitions
                else:
                    partition = (murmur2(key_bytes) & 0x7FFFFFFF) % partitions
                producer.append(topic, partition, key_bytes, value_serde.serialize(value), timestamp,
                                headers(count) if headers is not None else ())
                count += 1
            await producer.flush()
        finally:
            await producer.close()
        return count

    async def read(self, topic: str, count: int, timeout: float = 30.0) -> list[ConsumerRecord]:
        """At least ``count`` records of ``topic`` from the beginning (all partitions)."""
        counts = await self.partition_counts([topic])
        reader = self.transport.reader("test-reader")
        await reader.start()
        tps = [TopicPartition(topic, p) for p in range(counts[topic])]
        reader.assign(tps)
        for tp in tps:
            reader.seek(tp, 0)
        result: list[ConsumerRecord] = []
        deadline = time.monotonic() + timeout
        try:
            while len(result) < count:
                if time.monotonic() > deadline:
                    got = [(r.partition, r.offset, r.key, r.value) for r in result]
                    raise TimeoutError(f"Read {len(result)} of {count} records from {topic} within {timeout} s: {got}")
                batch = await reader.poll(200, 10_000)
                for records in batch.values():
                    result.extend(records)
        finally:
            await reader.close()
        return result

    async def read_all(self, topic: str, read_committed: bool = False, timeout: float = 30.0) -> list[ConsumerRecord]:
        """Every record now in ``topic`` (read up to its end offsets), in offset order per partition.

        ``read_committed`` skips aborted transactions and waits for open ones to end.
        """
        counts = await self.partition_counts([topic])
        reader = self.transport.reader("test-reader", read_committed=read_committed)
        await reader.start()
        tps = [TopicPartition(topic, p) for p in range(counts[topic])]
        reader.assign(tps)
        for tp in tps:
            reader.seek(tp, 0)
        result: list[ConsumerRecord] = []
        try:
            ends = await reader.end_offsets(tps)
            pending = {tp for tp in tps if ends[tp] > 0}
            deadline = time.monotonic() + timeout
            while pending:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"Could not read {topic} to its end offsets {ends}")
                for records in (await reader.poll(200, 10_000)).values():
                    result.extend(records)
                # Transaction markers take offsets too: the reader's position says where it is.
                pending = {tp for tp in pending if await reader.position(tp) < ends[tp]}
        finally:
            await reader.close()
        return result

    async def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        reader = self.transport.reader("test-offsets")
        await reader.start()
        try:
            return await reader.end_offsets(partitions)
        finally:
            await reader.close()


def _producer_settings() -> Any:
    from streamloop.transport.base import ProducerSettings

    return ProducerSettings(client_id="test-producer")


def by_partition(records: Iterable[ConsumerRecord]) -> dict[int, list[ConsumerRecord]]:
    result: dict[int, list[ConsumerRecord]] = {}
    for record in records:
        result.setdefault(record.partition, []).append(record)
    for records in result.values():
        records.sort(key=lambda r: r.offset)
    return result


async def committed_offset(cluster: Cluster, group: str, tp: TopicPartition) -> int | None:
    """The group's committed offset of ``tp`` as the broker has it (no group membership needed)."""
    committed = await committed_position(cluster, group, tp)
    return None if committed is None else committed[0]


async def committed_position(cluster: Cluster, group: str, tp: TopicPartition) -> tuple[int, str] | None:
    """The group's committed ``(offset, metadata)`` of ``tp``."""
    if cluster.bootstrap.startswith("memory://"):
        from streamloop.transport.memory import MemoryBroker

        committed = MemoryBroker.for_url(cluster.bootstrap).committed(group, tp)
        return None if committed is None else (committed.offset, committed.metadata)
    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as KafkaTopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=cluster.bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        ktp = KafkaTopicPartition(tp.topic, tp.partition)
        # consumer.committed() drops the metadata; the coordinator's answer keeps it.
        found = await consumer._coordinator.fetch_committed_offsets([ktp])
        entry = found.get(ktp)
        return None if entry is None or entry.offset < 0 else (entry.offset, entry.metadata or "")
    finally:
        await consumer.stop()
