"""PAUSE as an error-handler answer, resume(task_id), CONTINUE and the dead-letter queue,
on the memory broker and on real Kafka."""

from __future__ import annotations

from typing import Any

import pytest

from streamloop import BaseProcessor, ClientState, PunctuationType, Record, StreamsBuilder
from streamloop.handlers import (
    LogAndContinueExceptionHandler,
    LogAndContinueProcessingExceptionHandler,
    LogAndPauseExceptionHandler,
    LogAndPauseProcessingExceptionHandler,
)
from streamloop.ids import TaskId
from streamloop.records import TopicPartition
from streamloop.serdes import IntegerSerde, JsonSerde
from streamloop.testing import eventually_async
from streamloop.transport.base import ProducerSettings
from tests.support.apps import make_streams
from tests.support.cluster import Cluster, committed_offset

pytestmark = pytest.mark.asyncio

INT, JSON = IntegerSerde(), JsonSerde()
BAD = b"{not json"


def copy_topology(source: str, sink: str, fail_on: int | None = None):
    def check(value: dict) -> dict:
        if value["i"] == fail_on:
            raise ValueError(f"cannot handle record {value['i']}")
        return value

    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .map_values(check, name="check")
            .to(sink, key_serde=INT, value_serde=JSON))
    return builder.build()


async def produce(cluster: Cluster, topic: str, items: list[tuple[int, int, bytes]]) -> None:
    """``(partition, key, raw value)`` triples, in order."""
    producer = cluster.transport.producer(ProducerSettings("pause-test-producer"))
    await producer.start()
    for partition, key, raw in items:
        producer.append(topic, partition, INT.serialize(key), raw, None, ())
    await producer.flush()
    await producer.close()


def good(i: int) -> bytes:
    return JSON.serialize({"i": i})


async def two_partitions_with_a_bad_record(cluster: Cluster, names) -> tuple[str, str]:
    """Partition 0: records 0..2, a bad one at offset 3, records 4..5. Partition 1: 100..109."""
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 2, sink: 2})
    items = [(0, 0, good(i)) for i in range(3)] + [(0, 0, BAD)] + [(0, 0, good(i)) for i in (4, 5)]
    items += [(1, 1, good(100 + i)) for i in range(10)]
    await produce(cluster, source, items)
    return source, sink


def values(records: list) -> list[int]:
    return sorted(JSON.deserialize(r.value)["i"] for r in records)


async def test_pause_stops_only_that_task_and_commits_up_to_the_failed_record(cluster: Cluster, names) -> None:
    source, sink = await two_partitions_with_a_bad_record(cluster, names)
    streams = make_streams(copy_topology(source, sink), cluster.bootstrap, names.app,
                           default_deserialization_exception_handler=LogAndPauseExceptionHandler)
    async with streams:
        await eventually_async(lambda: streams.paused_local_tasks(), 30, "a paused task")
        (paused,) = streams.paused_local_tasks()
        assert paused.task_id == TaskId(0, 0) and not paused.is_running
        output = await cluster.read(sink, 13)
        assert values(output) == [0, 1, 2, *range(100, 110)]
        await eventually_async(
            lambda: _committed_is(cluster, names.app, TopicPartition(source, 0), 3), 30, "commit at offset 3")
        assert streams.state is ClientState.RUNNING
        assert streams.metric("failed-stream-threads") == 0
        assert len(await cluster.read_all(sink)) == 13  # nothing after the pause
        await produce(cluster, source, [(0, 0, good(i)) for i in range(6, 9)])

        def lag_of_paused_task() -> float:
            return sum(m.value for m in streams.metrics()
                       if m.name == "records-lag" and m.tags.get("task-id") == "0_0")

        # The bad record, the two after it and the three new ones wait: the lag shows it.
        await eventually_async(lambda: lag_of_paused_task() == 6, 30, "the paused task's lag grows to 6")


def thread_metric(streams, name: str) -> float:
    return sum(m.value for m in streams.metrics() if m.group == "stream-thread-metrics" and m.name == name)


async def _committed_is(cluster: Cluster, group: str, tp: TopicPartition, offset: int) -> bool:
    return await committed_offset(cluster, group, tp) == offset


async def test_resume_retries_the_failed_record_and_skip_goes_past_it(cluster: Cluster, names) -> None:
    source, sink = await two_partitions_with_a_bad_record(cluster, names)
    streams = make_streams(copy_topology(source, sink), cluster.bootstrap, names.app,
                           default_deserialization_exception_handler=LogAndPauseExceptionHandler)
    async with streams:
        await eventually_async(lambda: streams.paused_local_tasks(), 30, "a paused task")
        assert not await streams.resume_async("0_1")  # not paused: no action
        assert await streams.resume_async(TaskId(0, 0))  # the record is still bad: pauses again
        await eventually_async(lambda: streams.paused_local_tasks(), 30, "paused again")
        assert streams.metrics()  # metrics stay readable while paused
        # One task paused (twice): the gauge counts tasks, the total counts pauses.
        assert thread_metric(streams, "paused-tasks-total") == 1
        assert thread_metric(streams, "pause-total") == 2
        assert await streams.resume_async("0_0", skip=True)
        output = await cluster.read(sink, 15)
        assert values(output) == [0, 1, 2, 4, 5, *range(100, 110)]
        assert not streams.paused_local_tasks()
        assert thread_metric(streams, "paused-tasks-total") == 0
        await eventually_async(
            lambda: _committed_is(cluster, names.app, TopicPartition(source, 0), 6), 30, "commit past the end")


async def test_a_restarted_app_starts_from_the_failed_record(cluster: Cluster, names) -> None:
    source, sink = await two_partitions_with_a_bad_record(cluster, names)
    config = {"default_deserialization_exception_handler": LogAndPauseExceptionHandler}
    first = make_streams(copy_topology(source, sink), cluster.bootstrap, names.app, **config)
    async with first:
        await eventually_async(lambda: first.paused_local_tasks(), 30, "a paused task")
        await eventually_async(
            lambda: _committed_is(cluster, names.app, TopicPartition(source, 0), 3), 30, "commit at offset 3")
    second = make_streams(copy_topology(source, sink), cluster.bootstrap, names.app, **config)
    async with second:
        await eventually_async(lambda: second.paused_local_tasks(), 30, "paused again after the restart")
    assert values(await cluster.read_all(sink)) == [0, 1, 2, *range(100, 110)]  # none processed twice


async def test_continue_drops_the_bad_record_counts_it_and_commits_past_it(cluster: Cluster, names) -> None:
    source, sink = await two_partitions_with_a_bad_record(cluster, names)
    streams = make_streams(copy_topology(source, sink), cluster.bootstrap, names.app,
                           default_deserialization_exception_handler=LogAndContinueExceptionHandler)
    async with streams:
        output = await cluster.read(sink, 15)
        assert values(output) == [0, 1, 2, 4, 5, *range(100, 110)]
        def dropped(group: str) -> float:
            return sum(m.value for m in streams.metrics() if m.name == "dropped-records-total" and m.group == group)

        assert dropped("stream-thread-metrics") == 1
        assert dropped("stream-task-metrics") == 1
        await eventually_async(
            lambda: _committed_is(cluster, names.app, TopicPartition(source, 0), 6), 30, "commit past the end")


async def test_processing_errors_go_to_the_processing_handler(cluster: Cluster, names) -> None:
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    await produce(cluster, source, [(0, 0, good(i)) for i in range(6)])
    streams = make_streams(copy_topology(source, sink, fail_on=2), cluster.bootstrap, names.app,
                           processing_exception_handler=LogAndPauseProcessingExceptionHandler)
    async with streams:
        await eventually_async(lambda: streams.paused_local_tasks(), 30, "paused by the processing handler")
        assert values(await cluster.read(sink, 2)) == [0, 1]
        assert await streams.resume_async("0_0", skip=True)
        assert values(await cluster.read(sink, 5)) == [0, 1, 3, 4, 5]
    again = make_streams(copy_topology(source, sink, fail_on=4), cluster.bootstrap, names("other-app"),
                         processing_exception_handler=LogAndContinueProcessingExceptionHandler)
    async with again:
        await eventually_async(lambda: _len_at_least(cluster, sink, 5 + 5), 30, "the second app's output")
    assert values(await cluster.read_all(sink)) == sorted([0, 1, 3, 4, 5, 0, 1, 2, 3, 5])


async def _len_at_least(cluster: Cluster, topic: str, count: int) -> bool:
    return len(await cluster.read_all(topic)) >= count


async def test_failed_records_go_to_the_dead_letter_queue_with_error_headers(cluster: Cluster, names) -> None:
    source, sink = await two_partitions_with_a_bad_record(cluster, names)
    dlq = names("dlq")
    await cluster.create_topics({dlq: 1})
    streams = make_streams(copy_topology(source, sink), cluster.bootstrap, names.app,
                           default_deserialization_exception_handler=LogAndContinueExceptionHandler,
                           errors_dead_letter_queue_topic_name=dlq)
    async with streams:
        (letter,) = await cluster.read(dlq, 1)
    assert letter.value == BAD and INT.deserialize(letter.key) == 0
    headers = dict(letter.headers)
    assert headers["__streams.errors.topic"] == source.encode()
    assert headers["__streams.errors.partition"] == b"0"
    assert headers["__streams.errors.offset"] == b"3"
    assert b"JSONDecodeError" in headers["__streams.errors.exception"]


async def test_a_handler_that_raises_is_fatal(cluster: Cluster, names) -> None:
    class Broken:
        def configure(self, config: object) -> None:
            pass

        def handle(self, context, record, exception):
            raise RuntimeError("handler bug")

    source, sink = await two_partitions_with_a_bad_record(cluster, names)
    errors: list[BaseException] = []
    streams = make_streams(copy_topology(source, sink), cluster.bootstrap, names.app,
                           default_deserialization_exception_handler=Broken)
    streams.set_uncaught_exception_handler(lambda exc: errors.append(exc) or _shutdown_client())
    await streams.start_async()
    try:
        assert await streams.wait_for_state_async(ClientState.ERROR, timeout=30)
    finally:
        await streams.close_async()
    assert "Fatal user code error in deserialization error callback" in str(errors[0])
    assert isinstance(errors[0].__cause__, RuntimeError)


def _shutdown_client():
    from streamloop.handlers import StreamThreadExceptionResponse

    return StreamThreadExceptionResponse.SHUTDOWN_CLIENT



async def test_resume_called_from_inside_a_stream_thread_does_not_deadlock(cluster: Cluster, names) -> None:
    """A processor of another task resumes the paused one (same thread or another): no waiting on itself."""
    source, sink = names("in"), names("out")
    control = names("control")
    await cluster.create_topics({source: 1, sink: 1, control: 1})
    await produce(cluster, source, [(0, 0, good(0)), (0, 0, BAD), (0, 0, good(2))])
    holder: dict[str, object] = {}
    answers: list[bool] = []

    def resume_from_processor(_key: int, value: dict) -> None:
        answers.append(holder["streams"].resume("0_0", skip=True))  # type: ignore[attr-defined]

    builder = StreamsBuilder()
    builder.stream(source, key_serde=INT, value_serde=JSON).to(sink, key_serde=INT, value_serde=JSON)
    builder.stream(control, key_serde=INT, value_serde=JSON).foreach(resume_from_processor)
    streams = make_streams(builder.build(), cluster.bootstrap, names.app,
                           default_deserialization_exception_handler=LogAndPauseExceptionHandler)
    holder["streams"] = streams
    async with streams:
        await eventually_async(lambda: streams.paused_local_tasks(), 30, "task 0_0 paused")
        await produce(cluster, control, [(0, 0, good(99))])
        await eventually_async(lambda: answers, 30, "the processor's resume call returned")
        assert answers == [True]
        out = await cluster.read(sink, 2)
    assert sorted(JSON.deserialize(r.value)["i"] for r in out) == [0, 2]


class ResumesItsOwnTask(BaseProcessor):
    """Passes records on; its wall-clock punctuation resumes its own task, paused, past the bad record."""

    def __init__(self, holder: dict[str, object], answers: list[object]) -> None:
        self.holder, self.answers = holder, answers

    def init(self, context: Any) -> None:
        super().init(context)
        context.schedule(20, PunctuationType.WALL_CLOCK_TIME, self.tick)

    async def tick(self, _now: int) -> None:
        streams = self.holder["streams"]
        if streams.paused_local_tasks() and not self.answers:  # type: ignore[attr-defined]
            self.answers.append(await streams.resume_async(self.context.task_id, skip=True))  # type: ignore[attr-defined]

    def process(self, record: Record) -> None:
        self.context.forward(record)


async def test_a_wall_clock_punctuation_of_the_paused_task_can_resume_it(cluster: Cluster, names) -> None:
    """A paused task's wall-clock punctuations still run, and one may await resume_async of its own
    task: the resume must not wait for the punctuation to end."""
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 1, sink: 1})
    await produce(cluster, source, [(0, 0, good(0)), (0, 0, BAD), (0, 0, good(2))])
    holder: dict[str, object] = {}
    answers: list[object] = []
    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .process(lambda: ResumesItsOwnTask(holder, answers))
            .to(sink, key_serde=INT, value_serde=JSON))
    streams = make_streams(builder.build(), cluster.bootstrap, names.app,
                           default_deserialization_exception_handler=LogAndPauseExceptionHandler)
    holder["streams"] = streams
    async with streams:
        await eventually_async(lambda: answers, 30, "the punctuation's resume returned")
        assert answers == [True]
        out = await cluster.read(sink, 2)
    assert sorted(JSON.deserialize(r.value)["i"] for r in out) == [0, 2]
