"""Sources by pattern (``builder.stream(re.compile(...))``) end to end, on the memory broker and on
real Kafka: every matching topic is read, a matching topic created while the application runs is
picked up (the consumer's metadata refresh, a rebalance, tasks for its partitions), and a
stateful step after a pattern source counts over all of them."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from typing import Any

import pytest

from streamloop import Materialized, StreamsBuilder
from streamloop.serdes import StringSerde
from streamloop.testing import eventually_async
from tests.support.apps import make_streams
from tests.support.cluster import EVERY_BROKER, Cluster

pytestmark = pytest.mark.asyncio

STR = StringSerde()
# Kafka finds new topics on its metadata refresh (5 minutes by default): a short one for the tests.
FAST_METADATA = {"consumer_metadata_max_age_ms": 500}


def assigned_topics(streams: Any) -> set[str]:
    return {tp.topic for thread in streams.metadata_for_local_threads() for task in thread.active_tasks
            for tp in task.topic_partitions}


@pytest.mark.parametrize("bootstrap", EVERY_BROKER, indirect=True)
async def test_a_matching_topic_created_later_is_read_too(cluster: Cluster, names: Any) -> None:
    """Matches RegexSourceIntegrationTest.testRegexMatchesTopicsAWhenCreated and
    testRegexRecordsAreProcessedAfterNewTopicCreatedWithMultipleSubtopologies."""
    first, second, other, sink = names("TEST-TOPIC-1"), names("TEST-TOPIC-2"), names("TEST-OTHER"), names("out")
    await cluster.create_topics({first: 2, other: 1, sink: 1})
    builder = StreamsBuilder()
    builder.stream(re.compile(f"TEST-TOPIC-\\d-{re.escape(names.suffix)}"), key_serde=STR, value_serde=STR).to(sink)
    await cluster.produce(first, [("a", "1-a"), ("b", "1-b")], STR, STR, partitions=2)
    await cluster.produce(other, [("x", "not matched")], STR, STR, partitions=1)

    async with make_streams(builder.build(), cluster.bootstrap, names.app, **FAST_METADATA) as streams:
        await eventually_async(lambda: assigned_topics(streams) == {first}, timeout=60, what="the first topic's tasks")
        await cluster.create_topics({second: 3})
        await eventually_async(lambda: assigned_topics(streams) == {first, second}, timeout=60,
                               what="tasks for the topic created later")
        await cluster.produce(second, [("c", "2-c"), ("d", "2-d"), ("e", "2-e")], STR, STR, partitions=3)
        output = await cluster.read(sink, 5, timeout=60)
    assert sorted(STR.deserialize(r.value) for r in output) == ["1-a", "1-b", "2-c", "2-d", "2-e"]


@pytest.mark.parametrize("bootstrap", EVERY_BROKER, indirect=True)
async def test_a_count_after_a_pattern_source_counts_over_every_matching_topic(cluster: Cluster, names: Any) -> None:
    """Matches RegexSourceIntegrationTest.shouldAddStateStoreToRegexDefinedSource and
    testShouldReadFromRegexAndNamedTopics (a named source beside the pattern)."""
    one, two, named = names("logs-a"), names("logs-b"), names("named")
    await cluster.create_topics({one: 2, two: 2, named: 1})
    builder = StreamsBuilder()
    (builder.stream(re.compile(f"logs-[a-z]-{re.escape(names.suffix)}"), key_serde=STR, value_serde=STR)
            .group_by_key()
            .count(materialized=Materialized("per-key", persistent=False)))
    seen: list[str] = []
    builder.stream(named, key_serde=STR, value_serde=STR).foreach(lambda _k, v: seen.append(v))
    await cluster.produce(one, [("k", "1"), ("j", "2"), ("k", "3")], STR, STR, partitions=2)
    await cluster.produce(two, [("k", "4"), ("j", "5")], STR, STR, partitions=2)
    await cluster.produce(named, [("n", "named")], STR, STR, partitions=1)

    async with make_streams(builder.build(), cluster.bootstrap, names.app, **FAST_METADATA) as streams:
        store = streams.store("per-key")
        await eventually_async(lambda: (store.get("k"), store.get("j"), seen) == (3, 2, ["named"]), timeout=60,
                               what="counts over both matching topics")


async def delete_topic(cluster: Cluster, topic: str) -> None:
    admin = cluster.transport.admin("test-admin")
    await admin.start()
    try:
        await admin.delete_topics([topic])
    finally:
        await admin.close()


@pytest.mark.parametrize("bootstrap", EVERY_BROKER, indirect=True)
async def test_a_deleted_matching_topic_leaves_the_tasks_and_the_others_go_on(cluster: Cluster, names: Any) -> None:
    """Matches RegexSourceIntegrationTest.testRegexMatchesTopicsAWhenDeleted."""
    gone, stays, sink = names("TEST-TOPIC-A"), names("TEST-TOPIC-B"), names("out")
    await cluster.create_topics({gone: 1, stays: 2, sink: 1})
    builder = StreamsBuilder()
    builder.stream(re.compile(f"TEST-TOPIC-[A-Z]-{re.escape(names.suffix)}"), key_serde=STR, value_serde=STR).to(sink)
    await cluster.produce(stays, [("a", "before")], STR, STR, partitions=2)

    async with make_streams(builder.build(), cluster.bootstrap, names.app, **FAST_METADATA) as streams:
        await eventually_async(lambda: assigned_topics(streams) == {gone, stays}, timeout=60, what="both topics' tasks")
        await delete_topic(cluster, gone)
        await eventually_async(lambda: assigned_topics(streams) == {stays}, timeout=60,
                               what="tasks without the deleted topic")
        await cluster.produce(stays, [("b", "after-1"), ("c", "after-2")], STR, STR, partitions=2)
        output = await cluster.read(sink, 3, timeout=60)
    assert sorted(STR.deserialize(r.value) for r in output) == ["after-1", "after-2", "before"]


@pytest.mark.parametrize("bootstrap", EVERY_BROKER, indirect=True)
async def test_two_instances_share_the_tasks_of_the_matching_topics(cluster: Cluster, names: Any) -> None:
    """Matches RegexSourceIntegrationTest.testMultipleConsumersCanReadFromPartitionedTopic: both
    instances subscribe by the pattern and the tasks of both partitioned topics are spread over them."""
    one, two, sink = names("partitioned-1"), names("partitioned-2"), names("out")
    await cluster.create_topics({one: 2, two: 2, sink: 1})

    def topology() -> Any:
        builder = StreamsBuilder()
        builder.stream(re.compile(f"partitioned-\\d-{re.escape(names.suffix)}"), key_serde=STR,
                       value_serde=STR).to(sink)
        return builder.build()

    async with make_streams(topology(), cluster.bootstrap, names.app, **FAST_METADATA) as leader, \
            make_streams(topology(), cluster.bootstrap, names.app, **FAST_METADATA) as follower:
        def spread() -> bool:
            mine, theirs = assigned_topics(leader), assigned_topics(follower)
            return mine == theirs == {one, two}  # task p reads partition p of both topics
        await eventually_async(spread, timeout=90, what="each instance with a task of both topics")
        await cluster.produce(one, [(str(i), f"1-{i}") for i in range(6)], STR, STR, partitions=2)
        await cluster.produce(two, [(str(i), f"2-{i}") for i in range(6)], STR, STR, partitions=2)
        output = await cluster.read(sink, 12, timeout=60)
    assert sorted(STR.deserialize(r.value) for r in output) == sorted(
        [f"1-{i}" for i in range(6)] + [f"2-{i}" for i in range(6)])


@pytest.mark.parametrize("bootstrap", EVERY_BROKER, indirect=True)
async def test_under_exactly_once_a_new_topic_joins_without_duplicates(cluster: Cluster, names: Any) -> None:
    """The tasks that gain the new topic's partitions commit their transaction and start again from it:
    a read_committed reader sees each record once."""
    if cluster.bootstrap.startswith("memory://"):
        pytest.skip("the memory broker has no transactions (exactly_once_v2 is refused there)")
    first, second, sink = names("eos-a"), names("eos-b"), names("out")
    await cluster.create_topics({first: 2, sink: 1})
    builder = StreamsBuilder()
    builder.stream(re.compile(f"eos-[a-z]-{re.escape(names.suffix)}"), key_serde=STR, value_serde=STR).to(sink)
    await cluster.produce(first, [(str(i), f"a-{i}") for i in range(10)], STR, STR, partitions=2)

    async with make_streams(builder.build(), cluster.bootstrap, names.app, processing_guarantee="exactly_once_v2",
                            commit_interval_ms=100, **FAST_METADATA) as streams:
        await cluster.read(sink, 10, timeout=60)
        await cluster.create_topics({second: 2})
        await eventually_async(lambda: assigned_topics(streams) == {first, second}, timeout=60,
                               what="tasks with the new topic")
        await cluster.produce(second, [(str(i), f"b-{i}") for i in range(10)], STR, STR, partitions=2)
        await cluster.produce(first, [(str(i), f"a-{i + 10}") for i in range(10)], STR, STR, partitions=2)
        await cluster.read(sink, 30, timeout=60)
    output = [STR.deserialize(r.value) for r in await cluster.read_all(sink, read_committed=True)]
    assert sorted(output) == sorted([f"a-{i}" for i in range(20)] + [f"b-{i}" for i in range(10)])


class HeldFirst:
    """Forwards each record; the first waits until ``release()``, so the records fetched behind it are
    buffered, not processed, when the task closes. ``holding`` is set once it waits."""

    def __init__(self, holding: threading.Event, release: Callable[[], bool]) -> None:
        self._holding = holding
        self._release = release
        self._held = False

    def init(self, context: Any) -> None:
        self.context = context

    async def process(self, record: Any) -> None:
        if not self._held:
            self._held = True
            self._holding.set()
            await eventually_async(self._release, 60, "the close of the task holding the first record")
        self.context.forward(record)

    def close(self) -> None:
        pass


class CloseSeen(logging.Handler):
    """True once the stream thread logged that it closes tasks for a change of their partitions (it
    asks them to close right after; no public signal says so), counting from ``watch()``."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self._watching = self._seen = False
        self._logger = logging.getLogger("streamloop.threads.stream_thread")

    def __enter__(self) -> CloseSeen:
        self._level = self._logger.level
        self._logger.setLevel(logging.DEBUG)
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._level)

    def watch(self) -> None:
        self._watching = True

    def emit(self, record: logging.LogRecord) -> None:
        if self._watching and ("Partitions revoked" in record.getMessage()
                               or "Input partitions of tasks" in record.getMessage()):
            self._seen = True

    def __call__(self) -> bool:
        return self._seen


@pytest.mark.parametrize("change", ["deleted", "created"])
@pytest.mark.parametrize("bootstrap", EVERY_BROKER, indirect=True)
async def test_records_buffered_when_a_task_closes_for_its_topics_change_are_read_again(
        cluster: Cluster, names: Any, change: str) -> None:
    """A task whose partitions change (a matching topic deleted or created) closes and is created
    again on the partitions it keeps. The records it had fetched but not processed are not lost: the
    new task reads each kept partition from the closed task's commit, not from the consumer's position
    (which is past them)."""
    gone, stays, sink = names("HOLD-A"), names("HOLD-B"), names("out")
    await cluster.create_topics({stays: 1, sink: 1, **({gone: 1} if change == "deleted" else {})})
    holding, closing = threading.Event(), CloseSeen()
    builder = StreamsBuilder()
    (builder.stream(re.compile(f"HOLD-[A-Z]-{re.escape(names.suffix)}"), key_serde=STR, value_serde=STR)
            .process(lambda: HeldFirst(holding, closing)).to(sink, key_serde=STR, value_serde=STR))
    values = ["first", "second", "third"]
    await cluster.produce(stays, [("k", v) for v in values], STR, STR, partitions=1)

    with closing:
        async with make_streams(builder.build(), cluster.bootstrap, names.app, **FAST_METADATA) as streams:
            before = {gone, stays} if change == "deleted" else {stays}
            await eventually_async(lambda: assigned_topics(streams) == before and holding.is_set(), timeout=60,
                                   what="the tasks before the change, the first record held")
            closing.watch()  # from the change on
            if change == "deleted":
                await delete_topic(cluster, gone)
            else:
                await cluster.create_topics({gone: 1})
            after = {stays} if change == "deleted" else {gone, stays}
            await eventually_async(lambda: assigned_topics(streams) == after, timeout=60,
                                   what="the tasks after the change")
            output = await cluster.read(sink, 3, timeout=60)
    assert [STR.deserialize(r.value) for r in output] == values
