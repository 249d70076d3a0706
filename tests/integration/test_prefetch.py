"""Records aiokafka fetched ahead of ``poll`` are taken, not lost or fetched twice, around a pause."""

from __future__ import annotations

import time
import uuid

import pytest

from streamloop.records import TopicPartition
from streamloop.transport.base import ProducerSettings
from streamloop.transport.kafka import KafkaTransport

pytestmark = [pytest.mark.kafka, pytest.mark.asyncio]

DEADLINE = 30.0
COUNT = 300


async def one_partition_topic(transport: KafkaTransport) -> TopicPartition:
    topic = f"prefetch-{uuid.uuid4().hex[:10]}"
    admin = transport.admin("test-admin")
    await admin.start()
    try:
        await admin.create_topics({topic: 1})
    finally:
        await admin.close()
    producer = transport.producer(ProducerSettings(client_id="test-producer"))
    await producer.start()
    try:
        for i in range(COUNT):
            producer.append(topic, 0, None, f"v{i}".encode(), None, ())
        await producer.flush()
    finally:
        await producer.close()
    return TopicPartition(topic, 0)


async def test_records_fetched_ahead_are_taken_once_and_the_partition_goes_on_after_them(
    kafka_bootstrap: str,
) -> None:
    transport = KafkaTransport(kafka_bootstrap)
    tp = await one_partition_topic(transport)
    reader = transport.reader("prefetch")
    reader.assign([tp])
    await reader.start()
    try:
        reader.seek(tp, 0)
        deadline = time.monotonic() + DEADLINE
        first: list[int] = []
        while not first:  # a slice of the first fetch: the rest of it waits in aiokafka
            assert time.monotonic() < deadline, "nothing fetched"
            first = [r.offset for r in (await reader.poll(200, max_records=10)).get(tp, [])]
        assert first == list(range(10))

        ahead = [r.offset for r in reader.take_fetched(tp)]
        assert ahead, "the rest of the first fetch was not there to take"
        assert ahead == list(range(10, 10 + len(ahead)))
        assert reader.take_fetched(tp) == []  # taken means gone

        # A pause now would have made aiokafka drop them; after it the partition goes on past them.
        reader.pause(tp)
        reader.resume(tp)
        rest: list[int] = []
        while len(first) + len(ahead) + len(rest) < COUNT:
            assert time.monotonic() < deadline, f"read {len(first) + len(ahead) + len(rest)}/{COUNT}"
            rest.extend(r.offset for r in (await reader.poll(200)).get(tp, []))
        assert first + ahead + rest == list(range(COUNT))  # nothing lost, nothing twice
        assert await reader.position(tp) == COUNT
    finally:
        await reader.close()
