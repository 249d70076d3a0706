"""Timestamp extractors in a task: which partition goes next, partition time and stream time.

The rig is ``test_task.TaskRig`` (one task driven on the test's loop). Values are JSON objects
``{"t": ...}``; the extractor reads the event time from them, as a user's would.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest

from streamloop.processors.api import BaseProcessor
from streamloop.records import Record
from streamloop.serdes import IntegerSerde, JsonSerde
from streamloop.testing import eventually_async
from streamloop.timestamps import ConsumedRecord
from streamloop.topology.builder import StreamsBuilder
from streamloop.topology.topology import Topology
from streamloop.transport import open_transport
from tests.support.apps import make_streams
from tests.support.cluster import Cluster

from .test_task import IN, A, B, TaskRig, plain

INT = IntegerSerde()


class FromValue:
    """The event time is the value's ``t``; records it saw with their partition time."""

    def __init__(self) -> None:
        self.partition_times: list[tuple[int, int]] = []

    def extract(self, record: ConsumedRecord, partition_time: int) -> int:
        self.partition_times.append((record.offset, partition_time))
        return int(record.value["t"])


class Seen(BaseProcessor):
    """Keeps each record's (value's name, timestamp, task stream time before it)."""

    def __init__(self, rig: list[TaskRig]) -> None:
        self.rig = rig
        self.seen: list[tuple[str, int, int]] = []

    def process(self, record: Record) -> None:
        self.seen.append((record.value["n"], record.timestamp, self.rig[0].task.stream_time))


def event(offset: int, name: str, event_time: int, log_time: int = 0) -> tuple[int, Any, Any, int]:
    return plain(offset, json.dumps({"n": name, "t": event_time}).encode(), timestamp=log_time)


def rig_with(extractor: object, topics: str | list[str] = "in",
             partitions: tuple[Any, ...] = (IN,)) -> tuple[TaskRig, Seen]:
    holder: list[TaskRig] = []
    seen = Seen(holder)
    builder = StreamsBuilder()
    builder.stream(topics, value_serde=JsonSerde(), timestamp_extractor=extractor).process(lambda: seen, name="seen")
    topology: Topology = builder.build()
    rig = TaskRig(topology, partitions=list(partitions))
    holder.append(rig)
    return rig, seen


@pytest.mark.asyncio
async def test_the_partition_whose_head_has_the_lowest_extracted_timestamp_goes_first() -> None:
    """Kafka Streams ``PartitionGroupTest.testTimeTracking``: the queue with the lowest head
    timestamp (the extractor's, not the log's) gives the next record; stream time is the largest
    timestamp taken so far."""
    rig, seen = rig_with(FromValue(), ["a", "b"], (A, B))
    # The log timestamps say the opposite order of the event times.
    rig.add(A, event(0, "a1", 10, log_time=900), event(1, "a2", 30, log_time=800), event(2, "a3", 50, log_time=0))
    rig.add(B, event(0, "b1", 20, log_time=0), event(1, "b2", 40, log_time=0))

    async with rig.running():
        await rig.processed(5)

    assert [(n, t) for n, t, _ in seen.seen] == [("a1", 10), ("b1", 20), ("a2", 30), ("b2", 40), ("a3", 50)]
    assert rig.task.stream_time == 50


@pytest.mark.asyncio
async def test_stream_time_is_the_largest_timestamp_so_far_and_out_of_order_records_keep_theirs() -> None:
    """Kafka Streams ``PartitionGroupTest.testTimeTracking`` / ``StreamTaskTest.shouldProcessInOrder``:
    an out-of-order record is processed with its own timestamp and leaves stream time where it is;
    the extractor gets the partition's time so far (-1 before the first record)."""
    extractor = FromValue()
    rig, seen = rig_with(extractor)
    rig.add(IN, event(0, "x", 100), event(1, "y", 40), event(2, "z", 150))

    async with rig.running():
        await rig.processed(3)

    assert seen.seen == [("x", 100, -1), ("y", 40, 100), ("z", 150, 100)]
    assert rig.task.stream_time == 150
    assert extractor.partition_times == [(0, -1), (1, 100), (2, 100)]


class ReadsContext(BaseProcessor):
    """An async processor: several records are in flight; each reads its context's timestamp."""

    def __init__(self, seen: list[tuple[int, int]]) -> None:
        self.seen = seen

    async def process(self, record: Record) -> None:
        await asyncio.sleep(0)  # let the other records in flight start
        self.seen.append((record.timestamp, self.context.timestamp))


@pytest.mark.asyncio
async def test_records_in_flight_each_see_their_extracted_timestamp_in_the_context() -> None:
    bootstrap = f"memory://timestamps-{uuid.uuid4().hex[:8]}"
    cluster = Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)
    await cluster.create_topics({"in": 1})
    await cluster.produce("in", [(i, {"n": str(i), "t": 1_000 + i}) for i in range(8)], INT, JsonSerde(),
                          partitions=1, timestamp=5)
    seen: list[tuple[int, int]] = []
    builder = StreamsBuilder()
    builder.stream("in", key_serde=INT, value_serde=JsonSerde(), timestamp_extractor=FromValue()).process(
        lambda: ReadsContext(seen))
    async with make_streams(builder.build(), bootstrap, "timestamps-app", num_threads_per_task=4):
        await eventually_async(lambda: len(seen) == 8, timeout=10, what="8 records processed")
    assert sorted(seen) == [(1_000 + i, 1_000 + i) for i in range(8)]
