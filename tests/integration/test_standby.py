"""Standby replicas (``num.standby.replicas``) end to end, on the memory broker and on real Kafka.

Two instances of one application, one task with a persistent count store of a few thousand
keys: the second instance holds the task's standby, keeps it warm from the changelog and, when
the first instance closes, restores only the tail from its standby's checkpoint.
"""

from __future__ import annotations

from collections import Counter

import pytest

from streamloop import HostInfo, KafkaStreams
from streamloop.ids import TaskId
from streamloop.records import TopicPartition
from streamloop.serdes import StringSerde
from streamloop.state import checkpoint
from streamloop.state.changelog import changelog_topic
from streamloop.testing import eventually_async
from tests.integration.test_state import final_counts
from tests.support.apps import count_topology, make_streams
from tests.support.cluster import EVERY_BROKER, Cluster

pytestmark = pytest.mark.asyncio

STR = StringSerde()
KEYS = 3000


class Restored:
    """A restore listener that keeps each store's total."""

    def __init__(self) -> None:
        self.totals: list[int] = []

    def on_restore_start(self, partition: TopicPartition, store: str, start: int, end: int) -> None:
        pass

    def on_batch_restored(self, partition: TopicPartition, store: str, end: int, n: int) -> None:
        pass

    def on_restore_end(self, partition: TopicPartition, store: str, total: int) -> None:
        self.totals.append(total)


@pytest.mark.parametrize("bootstrap", EVERY_BROKER, indirect=True)
async def test_failover_to_the_standby_restores_only_the_tail(cluster: Cluster, names, tmp_path) -> None:
    source, sink = names("input"), names("counts")
    await cluster.create_topics({source: 1, sink: 1})
    first = [(f"k{i}", "v") for i in range(KEYS)]
    await cluster.produce(source, first, STR, STR, partitions=1)
    restored = Restored()

    def app(directory: str, port: int) -> KafkaStreams:
        streams = make_streams(count_topology(source, sink, persistent=True), cluster.bootstrap, names.app,
                               state_dir=str(tmp_path / directory), num_standby_replicas=1,
                               application_server=f"localhost:{port}",
                               commit_interval_ms=100, cache_max_bytes_buffering=0)
        streams.set_global_state_restore_listener(restored)
        return streams

    one, two = app("one", 1), app("two", 2)
    apps = {"one": one, "two": two}
    ports = {"one": 1, "two": 2}

    def holders(kind: str) -> list[str]:
        return [name for name, streams in apps.items() for m in streams.metadata_for_local_threads()
                for t in getattr(m, kind) if t.task_id == TaskId(0, 0)]

    async with one:
        await final_counts(cluster, sink, Counter(k for k, _ in first))
        async with two:
            # The task active on one instance, its standby on the other (never the same one), and
            # every instance knows where both are.
            def placed() -> tuple[str, str] | None:
                active, standby = holders("active_tasks"), holders("standby_tasks")
                return (active[0], standby[0]) if len(active) == len(standby) == 1 else None
            active, standby = await eventually_async(placed, timeout=60, what="an active and a standby")
            assert active != standby
            # Each instance learns the placement from its own assignment, which may come after the
            # other instance already runs its part of it.
            where = (HostInfo("localhost", ports[active]), {HostInfo("localhost", ports[standby])})

            def known() -> bool:
                metas = [streams.query_metadata_for_key("counts", "k1", STR) for streams in apps.values()]
                return all(m is not None and (m.active_host, m.standby_hosts) == where for m in metas)
            await eventually_async(known, timeout=30, what="every instance knows where the active and the standby are")

            # The standby checkpoints what it applied: wait until it holds every key.
            changelog = TopicPartition(changelog_topic(names.app, "counts"), 0)
            task_dir = str(tmp_path / standby / names.app / "0_0")

            def warm() -> bool:
                return checkpoint.read(task_dir).get(changelog, 0) >= KEYS
            await eventually_async(warm, timeout=60, what="the standby's checkpoint at the changelog's end")

            tail = [(f"k{i}", "v") for i in range(50)]
            await cluster.produce(source, tail, STR, STR, partitions=1)
            await final_counts(cluster, sink, Counter(k for k, _ in first + tail))
            restored.totals.clear()
            await apps[active].close_async()

            def promoted() -> bool:
                return holders("active_tasks") == [standby]
            await eventually_async(promoted, timeout=60, what="the task active where its standby was")
            more = [(f"k{i}", "v") for i in range(10)]
            await cluster.produce(source, more, STR, STR, partitions=1)
            await final_counts(cluster, sink, Counter(k for k, _ in first + tail + more))
    # The promoted standby restored the tail only, never the thousands of keys before it.
    assert restored.totals, "the second instance restored nothing at all"
    assert sum(restored.totals) <= 100, restored.totals
