"""Where a commit moves a persistent store's checkpoint: to the offset after the changelog's last
record the producer had acknowledged, as Kafka Streams' checkpoint (its record collector's
offsets), never to an end offset read from the broker.

Under exactly-once the broker writes a transaction's markers after the commit returns, so the
last stable offset read right after a commit can lag the transaction just committed. Seen in CI
(``test_tail_restore.py``, exactly-once, on Kafka): the first part of a stream had gone out in one
transaction, the end read after its commit was still 0, and an idle task never read it again, so
its checkpoint stayed at 0.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer

from streamloop.records import TopicPartition
from streamloop.serdes import LongSerde, StringSerde
from streamloop.state import checkpoint
from streamloop.state.changelog import changelog_topic
from streamloop.testing import eventually_async
from tests.support.apps import count_topology, make_streams
from tests.support.cluster import Cluster

pytestmark = pytest.mark.asyncio
STR, LONG = StringSerde(), LongSerde()


class LateEnds:
    """The log ends a stream thread reads for a changelog come one read late: what it reads after
    a commit is what the broker had before it (a transaction's markers written after the commit)."""

    def __init__(self) -> None:
        self.previous: dict[Any, int] = {}
        self.late = 0

    def wrap(self, original: Any) -> Any:
        async def end_offsets(consumer: Any, partitions: Any) -> Any:
            ends = dict(await original(consumer, partitions))
            if "StreamThread" not in threading.current_thread().name:
                return ends
            for tp, end in list(ends.items()):
                if tp.topic.endswith("-changelog"):
                    before = self.previous.get(tp, 0)
                    self.previous[tp] = end
                    if before < end:
                        self.late += 1
                        ends[tp] = before
            return ends
        return end_offsets


@pytest.fixture
def late_ends(monkeypatch: pytest.MonkeyPatch) -> Iterator[LateEnds]:
    late = LateEnds()
    monkeypatch.setattr(AIOKafkaConsumer, "end_offsets", late.wrap(AIOKafkaConsumer.end_offsets))
    yield late


async def _checkpoint_after_counting(cluster: Cluster, names: Any, tmp_path: Any, guarantee: str) -> tuple[int, int]:
    """Count 200 records in a persistent store, then stay idle: returns the checkpointed offset of
    its changelog once it has been the same for several commits, and the offset after the
    changelog's last record."""
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    streams = make_streams(count_topology(source, sink, persistent=True), cluster.bootstrap, names.app,
                           state_dir=str(tmp_path), commit_interval_ms=50, cache_max_bytes_buffering=0,
                           processing_guarantee=guarantee)
    changelog = TopicPartition(changelog_topic(names.app, "counts"), 0)
    task_dir = tmp_path / names.app / "0_0"
    async with streams:
        await cluster.produce(source, [(f"k{i % 7}", f"v{i}") for i in range(200)], STR, STR, partitions=1)
        await cluster.read(sink, 200, timeout=60)
        seen: list[int] = []

        def settled() -> bool:
            seen.append(checkpoint.read(str(task_dir)).get(changelog, -1))
            return len(seen) >= 10 and len(set(seen[-10:])) == 1  # ten reads, 50 ms apart: many commits
        await eventually_async(settled, 30, "the checkpoint to settle", interval=0.05)
        records = await cluster.read_all(changelog.topic, read_committed=True)
        assert len(records) == 200
        return seen[-1], records[-1].offset + 1


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once_v2"])
async def test_an_idle_tasks_checkpoint_is_the_offset_after_the_changelogs_last_record(
        cluster: Cluster, names: Any, tmp_path: Any, guarantee: str) -> None:
    if guarantee == "exactly_once_v2" and cluster.bootstrap.startswith("memory://"):
        pytest.skip("the memory broker has no transactions")
    checkpointed, after_last = await _checkpoint_after_counting(cluster, names, tmp_path, guarantee)
    assert checkpointed == after_last


@pytest.mark.kafka
@pytest.mark.parametrize("bootstrap", ["kafka"], indirect=True)
async def test_the_checkpoint_does_not_wait_for_a_transactions_markers(
        cluster: Cluster, names: Any, tmp_path: Any, late_ends: LateEnds) -> None:
    checkpointed, after_last = await _checkpoint_after_counting(cluster, names, tmp_path, "exactly_once_v2")
    assert checkpointed == after_last
