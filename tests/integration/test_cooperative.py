"""Cooperative rebalancing (KIP-429), on the memory broker and on real Kafka.

With ``rebalance.protocol`` cooperative (the default) a task that stays with its thread through a
rebalance keeps running: it is neither closed nor created again. A task that moves is closed by its
old owner first and handed to its new owner in a follow-up rebalance, so no partition has two
owners at once. Kafka Streams' tests of the same: ``StreamsPartitionAssignorTest`` (the
"shouldNotAssign...OwnedBy" cases) and ``EosIntegrationTest`` with ``COOPERATIVE``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import anyio
import pytest

from streamloop import ClientState, KafkaStreams, StreamsBuilder
from streamloop.processors.api import BaseProcessor, Record
from streamloop.serdes import IntegerSerde, JsonSerde
from streamloop.testing import eventually_async
from tests.integration.test_stream_threads import (
    ALL_TASKS,
    DEADLINE,
    PARTITIONS,
    Topics,
    produce,
    tasks_of,
    topics,
    wait_for_output,
)
from tests.support.apps import streams_config
from tests.support.cluster import EVERY_BROKER, Cluster

pytestmark = pytest.mark.asyncio
__all__ = ["topics"]  # the fixture, shared with test_stream_threads

INT, JSON = IntegerSerde(), JsonSerde()


class Lifecycle(BaseProcessor):
    """Notes when a task's processor starts and stops on an instance, and tags the output with it."""

    def __init__(self, instance: str, events: list[tuple[str, str, str]]) -> None:
        self._instance = instance
        self._events = events

    def init(self, context: Any) -> None:
        super().init(context)
        self._task = str(context.task_id)
        self._events.append((self._instance, "init", self._task))

    def process(self, record: Record) -> None:
        self.context.forward(record.with_value({**record.value, "by": self._instance}))

    def close(self) -> None:
        self._events.append((self._instance, "close", self._task))
        super().close()


def instance(cluster: Cluster, names, topics: Topics, name: str, events: list, **overrides: Any) -> KafkaStreams:
    builder = StreamsBuilder()
    (builder.stream(topics.source, key_serde=INT, value_serde=JSON)
            .process(lambda: Lifecycle(name, events))
            .to(topics.sink, key_serde=INT, value_serde=JSON))
    overrides.setdefault("client_id", names(name))
    return KafkaStreams(builder.build(), streams_config(cluster.bootstrap, names.app, **overrides))


def tasks(streams: KafkaStreams) -> list[str]:
    return sorted(task for t in streams.metadata_for_local_threads() for task in tasks_of(t))


def split_between(first: KafkaStreams, second: KafkaStreams) -> bool:
    a, b = tasks(first), tasks(second)
    return len(a) == len(b) == PARTITIONS // 2 and sorted(a + b) == ALL_TASKS


@pytest.mark.parametrize("bootstrap", EVERY_BROKER, indirect=True)
@pytest.mark.parametrize("protocol", ["cooperative", "eager"])
async def test_an_added_instance_takes_tasks_without_closing_the_ones_that_stay(
        cluster: Cluster, names, topics: Topics, protocol: str) -> None:
    """Under cooperative, the first instance closes only the tasks it hands over, and opens none
    again; under eager it closes all four and opens the two it keeps once more. Either way every
    record comes out."""
    events: list[tuple[str, str, str]] = []
    first = instance(cluster, names, topics, "a", events, rebalance_protocol=protocol)
    second = instance(cluster, names, topics, "b", events, rebalance_protocol=protocol)
    await first.start_async()
    try:
        await eventually_async(lambda: tasks(first) == ALL_TASKS, DEADLINE, "the first instance owning every task")
        await produce(cluster, topics, [{"seq": i} for i in range(40)])
        await wait_for_output(cluster, topics, set(range(40)), "the first 40 records")
        await second.start_async()
        await eventually_async(lambda: split_between(first, second), DEADLINE, "two tasks on each instance")
        await produce(cluster, topics, [{"seq": i} for i in range(40, 80)])
        out = await wait_for_output(cluster, topics, set(range(80)), "every record")
        seen = list(events)  # before the closes move the tasks again
    finally:
        await second.close_async()
        await first.close_async()
    moved = {task for who, kind, task in seen if (who, kind) == ("b", "init")}
    stayed = set(ALL_TASKS) - moved
    assert len(stayed) == len(moved) == 2
    a_events = Counter((kind, task) for who, kind, task in seen if who == "a")
    if protocol == "cooperative":
        # Each task the first instance kept was created once and never closed; each it handed
        # over was closed once.
        for task in stayed:
            assert (a_events[("init", task)], a_events[("close", task)]) == (1, 0), seen
        for task in moved:
            assert (a_events[("init", task)], a_events[("close", task)]) == (1, 1), seen
    else:
        # Eager: every task was closed, and the two kept ones created again.
        for task in stayed:
            assert (a_events[("init", task)], a_events[("close", task)]) == (2, 1), seen
    # After the hand-over, the records of a moved task came from the second instance only.
    late = [v for v in out if v["seq"] >= 40]
    assert {v["by"] for v in late if f"0_{v['seq'] % PARTITIONS}" in moved} == {"b"}



async def test_commits_while_the_group_rebalances_wait_for_it_instead_of_failing_the_thread(
        cluster: Cluster, names, topics: Topics) -> None:
    """Records keep coming and the first instance commits every 100 ms while the second joins; with
    heartbeats 3 s apart, the follow-up rebalance waits seconds for the second instance. A commit
    sent then under the old generation used to come back IllegalGeneration and kill the thread."""
    events: list[tuple[str, str, str]] = []
    slow = {"heartbeat_interval_ms": 3_000, "commit_interval_ms": 100}
    first = instance(cluster, names, topics, "a", events, **slow)
    second = instance(cluster, names, topics, "b", events, **slow)
    sent = 0

    async def keep_producing(stop: anyio.Event) -> None:
        nonlocal sent
        while not stop.is_set():
            await produce(cluster, topics, [{"seq": sent + i} for i in range(4)])
            sent += 4
            with anyio.move_on_after(0.05):
                await stop.wait()

    await first.start_async()
    try:
        await eventually_async(lambda: tasks(first) == ALL_TASKS, DEADLINE, "the first instance owning every task")
        stop = anyio.Event()
        async with anyio.create_task_group() as group:
            group.start_soon(keep_producing, stop)
            await second.start_async()
            await eventually_async(lambda: split_between(first, second), DEADLINE, "two tasks on each instance")
            stop.set()
        await eventually_async(lambda: first.state is second.state is ClientState.RUNNING, DEADLINE,
                               "both instances RUNNING")
        await wait_for_output(cluster, topics, set(range(sent)), "every record")
        assert first.metric("failed-stream-threads") == 0
    finally:
        await second.close_async()
        await first.close_async()


@pytest.mark.parametrize("protocol", ["cooperative", "eager"])
async def test_only_the_tasks_of_a_leaving_instance_move(cluster: Cluster, names, topics: Topics,
                                                          protocol: str) -> None:
    """Sticky under both protocols: an eager member names the tasks it had in its rejoin (it used to
    name none, having just closed them), so the others keep theirs and share the leaver's."""
    events: list[tuple[str, str, str]] = []
    clients = {name: instance(cluster, names, topics, name, events, rebalance_protocol=protocol)
               for name in ("a", "b", "c")}
    try:
        for client in clients.values():
            await client.start_async()
        await eventually_async(lambda: sorted(t for c in clients.values() for t in tasks(c)) == ALL_TASKS
                               and all(tasks(c) for c in clients.values()), DEADLINE, "every instance with tasks")
        before = {name: set(tasks(client)) for name, client in clients.items()}
        await clients.pop("a").close_async()
        await eventually_async(lambda: sorted(t for c in clients.values() for t in tasks(c)) == ALL_TASKS
                               and all(len(tasks(c)) == 2 for c in clients.values()), DEADLINE, "b and c, two each")
        for name, client in clients.items():
            assert before[name] <= set(tasks(client)), (name, before, tasks(client))
    finally:
        for client in clients.values():
            await client.close_async()
