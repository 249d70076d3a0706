"""A commit, and the lag metric's lookup, run beside the poll loop: records keep flowing while
they wait (issue #34, latency).

A commit waits for the producer's acks, the group's answer and the changelogs' ends. Run by the
poll loop itself, it stopped the fetching for that long, so every record that arrived meanwhile
waited for it: tens of milliseconds at each commit interval, the p99 of a count under load. Here
a commit is held open (its protocol's ``commit`` waits on an event) and a record produced then
must still come out; once the commit is let go, every offset is committed as before.

The lag metric reads the partitions' log ends once a second (a ListOffsets request, which a broker
answers after the fetch in flight on the same connection). Awaited by the poll loop under a 0.5 s
limit, it stopped the fetching for that long, once a second.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from streamloop.commit.at_least_once import AtLeastOnce
from streamloop.records import TopicPartition
from streamloop.serdes import IntegerSerde, JsonSerde
from streamloop.testing import eventually_async
from streamloop.transport.kafka.consumer import KafkaConsumer
from streamloop.transport.memory.consumer import MemoryConsumer
from tests.support.apps import doubling_running
from tests.support.cluster import Cluster, committed_offset

pytestmark = pytest.mark.asyncio
INT, JSON = IntegerSerde(), JsonSerde()


class HeldCommits:
    """While ``hold`` is set, a commit with offsets to commit waits (on the stream thread's loop)."""

    def __init__(self) -> None:
        self.hold = threading.Event()
        self.entered = threading.Event()

    def wrap(self, original: Any) -> Any:
        async def commit(committer: AtLeastOnce, tasks: Any) -> Any:
            tasks = list(tasks)
            if self.hold.is_set() and any(t.offsets_to_commit() for t in tasks):
                self.entered.set()
                while self.hold.is_set():
                    await anyio.sleep(0.01)
            return await original(committer, tasks)
        return commit


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[HeldCommits]:
    held = HeldCommits()
    monkeypatch.setattr(AtLeastOnce, "commit", held.wrap(AtLeastOnce.commit))
    yield held
    held.hold.clear()


async def test_records_are_processed_while_a_commit_waits(cluster: Cluster, names, held: HeldCommits) -> None:
    async with doubling_running(cluster, names, held.hold) as (_, source, sink):
        held.hold.set()
        await cluster.produce(source, [(1, {"n": 2})], INT, JSON, 1)
        await eventually_async(held.entered.is_set, 30, "a commit of the second record under way")
        await cluster.produce(source, [(2, {"n": 4})], INT, JSON, 1)
        # The commit still waits: the third record was fetched and processed beside it.
        out = await cluster.read(sink, 3, timeout=20)
        assert [JSON.deserialize(r.value)["n"] for r in out] == [0, 2, 4]
        assert held.hold.is_set()
        held.hold.clear()

        async def all_committed() -> bool:
            return await committed_offset(cluster, names.app, TopicPartition(source, 0)) == 3
        await eventually_async(all_committed, 30, "every offset committed once the commit is let go")


class HeldLookups:
    """While ``hold`` is set, a stream thread's ``end_offsets`` waits; ``cancelled`` counts the ones
    given up on before they were let go."""

    def __init__(self) -> None:
        self.hold = threading.Event()
        self.entered = threading.Event()
        self.cancelled = 0

    def wrap(self, original: Any) -> Any:
        async def end_offsets(consumer: Any, partitions: Any) -> Any:
            if self.hold.is_set() and "StreamThread" in threading.current_thread().name:
                self.entered.set()
                try:
                    while self.hold.is_set():
                        await anyio.sleep(0.01)
                except anyio.get_cancelled_exc_class():
                    self.cancelled += 1
                    raise
            return await original(consumer, partitions)
        return end_offsets


@pytest.fixture
def held_lookups(monkeypatch: pytest.MonkeyPatch) -> Iterator[HeldLookups]:
    held = HeldLookups()
    for consumer in (KafkaConsumer, MemoryConsumer):
        monkeypatch.setattr(consumer, "end_offsets", held.wrap(consumer.end_offsets))
    yield held
    held.hold.clear()


async def test_records_are_processed_while_the_lag_metric_waits_for_log_ends(
        cluster: Cluster, names, held_lookups: HeldLookups) -> None:
    async with doubling_running(cluster, names, held_lookups.hold) as (_, source, sink):
        held_lookups.hold.set()
        await eventually_async(held_lookups.entered.is_set, 30, "a lookup of the log ends under way")
        await cluster.produce(source, [(1, {"n": 2})], INT, JSON, 1)
        out = await cluster.read(sink, 2, timeout=20)
        assert [JSON.deserialize(r.value)["n"] for r in out] == [0, 2]
        # The record came out beside the lookup, not after the poll loop gave up on it.
        assert held_lookups.hold.is_set() and held_lookups.cancelled == 0
        held_lookups.hold.clear()


async def test_offsets_are_committed_while_a_backlog_keeps_the_producer_busy(cluster: Cluster, names) -> None:
    """A commit waits for the acks of the output sent before it, not for the producer to fall idle:
    the tasks go on producing beside it, and on Kafka a flush that waited until nothing was in flight
    found something in flight at every look, so no commit completed until the backlog was done
    (found at 1M records: every state-store write held in memory for the whole run)."""
    backlog = 60_000
    async with doubling_running(cluster, names, threading.Event()) as (_, source, _sink):
        await cluster.produce(source, [(i, {"n": 2 * i}) for i in range(1, backlog + 1)], INT, JSON, 1)
        seen: list[int] = []

        async def caught_up() -> bool:
            offset = await committed_offset(cluster, names.app, TopicPartition(source, 0)) or 0
            seen.append(offset)
            return offset == backlog + 1
        await eventually_async(caught_up, 120, "the whole backlog committed", interval=0.02)
        during = [offset for offset in seen if 1 < offset < backlog + 1]
        assert during, f"no commit landed while the backlog was processed (committed offsets seen: {sorted(set(seen))})"
