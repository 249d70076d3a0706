"""``TopologyTestDriver``: the engine's tasks run in the calling thread, with no broker and no real time."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, ClassVar

import pytest

from streamloop import BaseProcessor, PunctuationType, Record, StreamsBuilder, TaskId, Topology
from streamloop.errors import DeserializationError, IllegalStateError, ProcessingError, TaskTimeoutError, TopologyError
from streamloop.serdes import IntegerSerde, JsonSerde, StringSerde
from streamloop.testing import (
    DriverTimeoutError,
    EmptyTopicError,
    TopologyTestDriver,
    UnusedTopicsError,
)

STR, INT = StringSerde(), IntegerSerde()


def doubling(source: str = "in", sink: str = "out", fn: Any = None) -> Topology:
    builder = StreamsBuilder()
    (builder.stream(source, key_serde=STR, value_serde=INT)
            .map_values(fn or (lambda v: v * 2))
            .to(sink, key_serde=STR, value_serde=INT))
    return builder.build()


@pytest.fixture
def driver() -> Any:
    with TopologyTestDriver(doubling()) as d:
        yield d


def test_piped_records_come_out_transformed_in_order_with_timestamp_and_headers(driver) -> None:
    source = driver.create_input_topic("in", STR, INT)
    out = driver.create_output_topic("out", STR, INT)
    source.pipe_input("a", 1, timestamp=10, headers=(("trace", b"x"),))
    source.pipe_records([("b", 2), ("a", 3)])
    first = out.read_record()
    assert (first.key, first.value, first.timestamp, tuple(first.headers)) == ("a", 2, 10, (("trace", b"x"),))
    assert out.read_key_values() == [("b", 4), ("a", 6)]
    assert out.is_empty()
    with pytest.raises(EmptyTopicError, match="'out'"):
        out.read_key_value()


def test_each_call_processes_the_record_and_commits_past_it(driver) -> None:
    source = driver.create_input_topic("in", STR, INT)
    driver.create_output_topic("out", STR, INT)
    for n in range(3):
        source.pipe_input("k", n)
        assert driver.committed("in") == n + 1


def test_async_processors_are_awaited_and_their_sleeps_take_no_real_time() -> None:
    async def slow_double(value: int) -> int:
        await asyncio.sleep(60)  # a minute of the driver's virtual time
        return value * 2

    with TopologyTestDriver(doubling(fn=slow_double)) as driver:
        source = driver.create_input_topic("in", STR, INT)
        out = driver.create_output_topic("out", STR, INT)
        started = time.monotonic()
        source.pipe_records([("a", 1), ("b", 2)])
        assert time.monotonic() - started < 5
        assert out.read_key_values() == [("a", 2), ("b", 4)]


def test_a_processor_that_awaits_forever_fails_the_call_with_an_error_naming_it() -> None:
    async def hangs(value: int) -> int:
        await asyncio.Event().wait()
        return value

    builder = StreamsBuilder()
    builder.stream("in", key_serde=STR, value_serde=INT).map_values(hangs, name="stuck-lookup").to("out")
    with TopologyTestDriver(builder.build()) as driver:
        source = driver.create_input_topic("in", STR, INT)
        driver.create_output_topic("out")
        started = time.monotonic()
        with pytest.raises(DriverTimeoutError, match=r"'stuck-lookup' of task 0_0 .*in-0 offset 0") as caught:
            source.pipe_input("a", 1)
        assert time.monotonic() - started < 5
        assert (caught.value.processor, caught.value.task_id, caught.value.offset) == ("stuck-lookup", TaskId(0, 0), 0)


def test_piping_into_a_topic_the_topology_does_not_read_is_a_topology_error(driver) -> None:
    with pytest.raises(TopologyError, match=r"'orders' is not read by this topology; its source topics are \['in'\]"):
        driver.create_input_topic("orders")


def test_reading_a_topic_the_topology_does_not_write_is_a_topology_error(driver) -> None:
    with pytest.raises(TopologyError, match=r"'outt' is not written by this topology; its sink topics are \['out'\]"):
        driver.create_output_topic("outt")


def test_unfed_sources_and_unread_outputs_are_reported_at_close(caplog: pytest.LogCaptureFixture) -> None:
    builder = StreamsBuilder()
    builder.stream("a").to("out")
    builder.stream("b").to("never-read")
    driver = TopologyTestDriver(builder.build())
    driver.create_input_topic("a").pipe_input(b"k", b"v")
    unused = driver.unused_topics()
    assert unused.sources_without_input == ("b",)
    assert unused.outputs_never_read == ("out",)
    with caplog.at_level(logging.WARNING):
        driver.close()
    assert "source topics ['b'] got no input" in caplog.text
    assert "output topics ['out'] were written but never read" in caplog.text


def test_strict_topics_make_close_raise_for_unused_topics() -> None:
    driver = TopologyTestDriver(doubling(), strict_topics=True)
    driver.create_input_topic("in", STR, INT).pipe_input("k", 1)
    with pytest.raises(UnusedTopicsError, match=r"output topics \['out'\]"):
        driver.close()


def test_a_bad_record_fails_the_call_with_the_default_handler(driver) -> None:
    driver.create_output_topic("out")
    with pytest.raises(DeserializationError, match="in-0 offset 0"):
        driver.pipe_raw("in", b"k", b"\xff")


def test_continue_drops_a_bad_record_and_goes_on() -> None:
    config = {"default.deserialization.exception.handler": "streamloop.handlers.LogAndContinueExceptionHandler"}
    with TopologyTestDriver(doubling(), config) as driver:
        source = driver.create_input_topic("in", STR, INT)
        out = driver.create_output_topic("out", STR, INT)
        source.pipe_input("a", 1)
        driver.pipe_raw("in", b"b", b"\xff")
        source.pipe_input("c", 3)
        assert out.read_key_values() == [("a", 2), ("c", 6)]
        assert driver.committed("in") == 3


def test_pause_marks_the_task_paused_and_resume_goes_on_from_the_failed_record() -> None:
    config = {"default.deserialization.exception.handler": "streamloop.handlers.LogAndPauseExceptionHandler"}
    with TopologyTestDriver(doubling(), config) as driver:
        source = driver.create_input_topic("in", STR, INT)
        out = driver.create_output_topic("out", STR, INT)
        source.pipe_input("a", 1)
        driver.pipe_raw("in", b"b", b"\xff")
        source.pipe_input("c", 3)
        assert driver.paused_tasks() == {TaskId(0, 0)}
        assert driver.committed("in") == 1  # the failed record's offset
        assert out.read_key_values() == [("a", 2)]
        assert driver.resume("0_0") is True  # from the failed record: it pauses again
        assert driver.paused_tasks() == {TaskId(0, 0)}
        assert driver.resume(TaskId(0, 0), skip=True) is True
        assert driver.paused_tasks() == set()
        assert out.read_key_values() == [("c", 6)]
        assert driver.resume("0_0") is False


def test_a_failing_processor_goes_to_the_processing_handler() -> None:
    def fails_on_odd(value: int) -> int:
        if value % 2:
            raise ValueError("odd")
        return value

    with TopologyTestDriver(doubling(fn=fails_on_odd)) as driver:
        source = driver.create_input_topic("in", STR, INT)
        driver.create_output_topic("out", STR, INT)
        with pytest.raises(ProcessingError, match="KSTREAM-MAPVALUES-0000000001"):
            source.pipe_input("a", 1)
    config = {"processing.exception.handler": "streamloop.handlers.LogAndContinueProcessingExceptionHandler"}
    with TopologyTestDriver(doubling(fn=fails_on_odd), config) as driver:
        source = driver.create_input_topic("in", STR, INT)
        out = driver.create_output_topic("out", STR, INT)
        source.pipe_records([("a", 1), ("b", 2)])
        assert out.read_key_values() == [("b", 2)]


class Ticker(BaseProcessor):
    """Forwards a tick on every punctuation of ``kind``; passes records on."""

    def __init__(self, kind: PunctuationType) -> None:
        self.kind = kind

    def init(self, context: Any) -> None:
        super().init(context)
        context.schedule(1_000, self.kind, self.tick)

    def tick(self, timestamp: int) -> None:
        self.context.forward(Record("tick", timestamp, timestamp))

    def process(self, record: Record) -> None:
        self.context.forward(record)


def ticking(kind: PunctuationType) -> Topology:
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=INT)
            .process(lambda: Ticker(kind)).to("out", key_serde=STR, value_serde=INT))
    return builder.build()


def test_advancing_the_wall_clock_fires_wall_clock_punctuations() -> None:
    with TopologyTestDriver(ticking(PunctuationType.WALL_CLOCK_TIME), initial_wall_clock_ms=5_000) as driver:
        out = driver.create_output_topic("out", STR, INT)
        driver.advance_wall_clock_time(999)
        assert out.is_empty()
        driver.advance_wall_clock_time(1)
        assert out.read_key_values() == [("tick", 6_000)]
        driver.advance_wall_clock_time(2_500)
        assert out.read_key_values() == [("tick", 8_500)]  # fires once, then aligns after now


def test_stream_time_follows_record_timestamps() -> None:
    with TopologyTestDriver(ticking(PunctuationType.STREAM_TIME)) as driver:
        source = driver.create_input_topic("in", STR, INT)
        out = driver.create_output_topic("out", STR, INT)
        source.pipe_input("a", 1, timestamp=500)
        driver.advance_wall_clock_time(10_000)  # wall-clock time does not move stream time
        source.pipe_input("b", 2, timestamp=400)  # late: stream time stays at 500
        assert [k for k, _ in out.read_key_values()] == ["a", "b"]
        source.pipe_input("c", 3, timestamp=1_200)
        assert out.read_key_values() == [("c", 3), ("tick", 1_200)]


def test_an_injected_timeout_is_retried_in_virtual_time_and_the_record_goes_through_once(driver) -> None:
    source = driver.create_input_topic("in", STR, INT)
    out = driver.create_output_topic("out", STR, INT)
    driver.inject_timeouts("0_0", times=3)
    started = time.monotonic()
    source.pipe_input("a", 1)
    assert time.monotonic() - started < 5
    assert out.read_key_values() == [("a", 2)]


def test_a_task_that_keeps_timing_out_fails_with_task_timeout_after_task_timeout_ms() -> None:
    async def always_times_out(value: int) -> int:
        raise TimeoutError("the service did not answer")

    with TopologyTestDriver(doubling(fn=always_times_out), {"task.timeout.ms": 60_000}) as driver:
        source = driver.create_input_topic("in", STR, INT)
        driver.create_output_topic("out")
        with pytest.raises(TaskTimeoutError, match="within 60000 ms"):
            source.pipe_input("a", 1)


class Counter(BaseProcessor):
    """Counts records per key in memory (no store): a restart loses the counts."""

    instances = 0

    def init(self, context: Any) -> None:
        super().init(context)
        Counter.instances += 1
        self.counts: dict[str, int] = {}

    def process(self, record: Record) -> None:
        self.counts[record.key] = self.counts.get(record.key, 0) + 1
        self.context.forward(record.with_value(self.counts[record.key]))


def counting() -> Topology:
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=INT)
            .process(Counter).to("out", key_serde=STR, value_serde=INT))
    return builder.build()


def test_a_crash_restarts_tasks_from_the_last_commit_and_replays_what_came_after() -> None:
    with TopologyTestDriver(counting(), {"commit.interval.ms": 1_000}) as driver:
        source = driver.create_input_topic("in", STR, INT)
        out = driver.create_output_topic("out", STR, INT)
        source.pipe_input("a", 0)
        driver.advance_wall_clock_time(1_000)  # the commit interval passes: offset 1 committed
        source.pipe_input("a", 0)
        assert driver.committed("in") == 1
        before = Counter.instances
        driver.crash()
        assert Counter.instances == before + 1
        # The second record is processed again by a fresh processor (at-least-once).
        assert out.read_key_values() == [("a", 1), ("a", 2), ("a", 1)]


def test_a_rebalance_commits_and_gives_the_task_new_processors_losing_nothing() -> None:
    with TopologyTestDriver(counting(), {"commit.interval.ms": 60_000}) as driver:
        source = driver.create_input_topic("in", STR, INT)
        out = driver.create_output_topic("out", STR, INT)
        source.pipe_records([("a", 0), ("a", 0)])
        before = Counter.instances
        driver.rebalance("0_0")
        assert Counter.instances == before + 1
        assert driver.committed("in") == 2
        source.pipe_input("a", 0)
        assert out.read_values() == [1, 2, 1]


def test_partitions_make_one_task_each_and_the_key_picks_the_partition_as_kafka_does() -> None:
    with TopologyTestDriver(doubling(), partitions={"in": 3, "out": 3}) as driver:
        assert driver.task_ids == [TaskId(0, 0), TaskId(0, 1), TaskId(0, 2)]
        source = driver.create_input_topic("in", STR, INT)
        out = driver.create_output_topic("out", STR, INT)
        source.pipe_records([(k, 1) for k in "abcdef"])
        records = out.read_records()
        from aiokafka.partitioner import murmur2
        assert [r.partition for r in records] == [(murmur2(k.encode()) & 0x7FFFFFFF) % 3 for k in "abcdef"]


def test_output_to_a_topic_the_topology_reads_goes_through_the_task_that_reads_it() -> None:
    builder = StreamsBuilder()
    builder.stream("in", key_serde=STR, value_serde=INT).map_values(lambda v: v + 1).to(
        "middle", key_serde=STR, value_serde=INT)
    builder.stream("middle", key_serde=STR, value_serde=INT).map_values(lambda v: v * 10).to(
        "out", key_serde=STR, value_serde=INT)
    with TopologyTestDriver(builder.build()) as driver:
        assert driver.task_ids == [TaskId(0, 0), TaskId(1, 0)]
        driver.create_input_topic("in", STR, INT).pipe_records([("a", 1), ("b", 2)])
        assert driver.create_output_topic("out", STR, INT).read_key_values() == [("a", 20), ("b", 30)]


def test_blocking_functions_run_inline_on_the_calling_thread() -> None:
    threads: list[threading.Thread] = []

    def lookup(value: int) -> int:
        threads.append(threading.current_thread())
        return value

    builder = StreamsBuilder()
    builder.stream("in", key_serde=STR, value_serde=INT).map_values(lookup, blocking=True).to(
        "out", key_serde=STR, value_serde=INT)
    with TopologyTestDriver(builder.build()) as driver:
        driver.create_output_topic("out")
        driver.create_input_topic("in", STR, INT).pipe_input("a", 1)
    assert threads == [threading.current_thread()]


@pytest.mark.asyncio
async def test_calling_the_driver_from_a_running_loop_is_a_clear_error_and_changes_nothing() -> None:
    driver = TopologyTestDriver(doubling())
    with pytest.raises(IllegalStateError, match="cannot be made from a coroutine on a running loop"):
        driver.create_input_topic("in", STR, INT)
    source = await asyncio.to_thread(driver.create_input_topic, "in", STR, INT)
    with pytest.raises(IllegalStateError):
        source.pipe_input("a", 1)
    await asyncio.to_thread(source.pipe_input, "b", 2)  # from a worker thread it works
    await asyncio.to_thread(driver.create_output_topic, "out")
    with pytest.raises(IllegalStateError):
        driver.close()
    await asyncio.to_thread(driver.close)
    assert driver.committed("in") == 1


def counting_topology():
    from streamloop.serdes import LongSerde
    builder = StreamsBuilder()
    (builder.stream("words", key_serde=STR, value_serde=STR)
            .group_by_key()
            .count(materialized="counts")
            .to_stream()
            .to("counts", key_serde=STR, value_serde=LongSerde()))
    return builder.build()


def test_stores_are_queryable_and_survive_a_crash_and_a_rebalance() -> None:
    from streamloop.errors import InvalidStateStoreError
    from streamloop.serdes import LongSerde

    with TopologyTestDriver(counting_topology(), {"commit.interval.ms": 1_000_000}) as driver:
        words = driver.create_input_topic("words", STR, STR)
        out = driver.create_output_topic("counts", STR, LongSerde())
        for word in ["a", "b", "a"]:
            words.pipe_input(word, word)
        store = driver.get_key_value_store("counts")
        assert (store.get("a"), store.get("b")) == (2, 1)
        # Nothing is committed yet (long interval): a crash replays the input, the restored
        # store leaves out the first attempt's updates, so the counts stay right.
        driver.crash()
        assert (store.get("a"), store.get("b")) == (2, 1)
        words.pipe_input("a", "a")
        driver.rebalance(driver.task_ids[0])
        assert store.get("a") == 3
        # The output saw the first attempt too (at-least-once); its last word per key is right.
        assert dict(out.read_key_values()) == {"a": 3, "b": 1}
        with pytest.raises(InvalidStateStoreError, match="'nope'"):
            driver.get_key_value_store("nope")
        with pytest.raises(InvalidStateStoreError, match="is a key-value store"):
            driver.get_window_store("counts")


def test_in_memory_session_stores_are_queried_and_restored_after_a_rebalance() -> None:
    from streamloop import Materialized, SessionWindows, Windowed
    from streamloop.errors import InvalidStateStoreError

    builder = StreamsBuilder()
    (builder.stream("words", key_serde=STR, value_serde=STR).group_by_key()
            .windowed_by(SessionWindows.of_inactivity_gap_with_no_grace(10))
            .count(materialized=Materialized("sessions", persistent=False)))
    with TopologyTestDriver(builder.build()) as driver:
        words = driver.create_input_topic("words", STR, STR)
        words.pipe_input("a", "a", 0)
        words.pipe_input("a", "a", 5)
        driver.rebalance(driver.task_ids[0])  # an in-memory store comes back from its changelog only
        words.pipe_input("a", "a", 12)
        assert driver.get_session_store("sessions").fetch("a") == [(Windowed("a", 0, 12), 3)]
        with pytest.raises(InvalidStateStoreError, match="is a session store"):
            driver.get_window_store("sessions")


def test_a_closed_driver_refuses_calls() -> None:
    driver = TopologyTestDriver(doubling())
    source = driver.create_input_topic("in", STR, INT)
    driver.create_output_topic("out")
    driver.close()
    with pytest.raises(IllegalStateError, match="closed"):
        source.pipe_input("a", 1)


def test_json_values_and_default_serdes_from_the_config() -> None:
    builder = StreamsBuilder()
    builder.stream("in").map_values(lambda v: {**v, "seen": True}).to("out")
    config = {"default.key.serde": StringSerde, "default.value.serde": JsonSerde}
    with TopologyTestDriver(builder.build(), config) as driver:
        driver.create_input_topic("in").pipe_input("k", {"n": 1})
        assert driver.create_output_topic("out").read_key_value() == ("k", {"n": 1, "seen": True})


def test_a_topic_chosen_per_record_is_created_on_first_use_and_readable() -> None:
    builder = StreamsBuilder()
    builder.stream("in", key_serde=STR, value_serde=INT).to(lambda key, value, record: f"out-{key}",
                                                              key_serde=STR, value_serde=INT)
    with TopologyTestDriver(builder.build()) as driver:
        driver.create_input_topic("in", STR, INT).pipe_records([("a", 1), ("b", 2), ("a", 3)])
        assert driver.create_output_topic("out-a", STR, INT).read_values() == [1, 3]
        assert driver.create_output_topic("out-b", STR, INT).read_values() == [2]


def test_the_dead_letter_topic_gets_the_bad_record_and_can_be_read() -> None:
    config = {"default.deserialization.exception.handler": "streamloop.handlers.LogAndContinueExceptionHandler",
              "errors.dead.letter.queue.topic.name": "in-dlq"}
    with TopologyTestDriver(doubling(), config) as driver:
        driver.create_output_topic("out")
        driver.pipe_raw("in", b"k", b"\xff")
        letter = driver.create_output_topic("in-dlq").read_record()
        assert (letter.key, letter.value) == (b"k", b"\xff")
        assert dict(letter.headers)["__streams.errors.offset"] == b"0"


def test_a_processor_awaiting_work_on_another_thread_gets_its_result() -> None:
    def lookup(value: int) -> int:
        return value + 100

    async def via_thread(value: int) -> int:
        return await asyncio.to_thread(lookup, value)

    with TopologyTestDriver(doubling(fn=via_thread)) as driver:
        source = driver.create_input_topic("in", STR, INT)
        out = driver.create_output_topic("out", STR, INT)
        source.pipe_records([("a", 1), ("b", 2)])
        assert out.read_key_values() == [("a", 101), ("b", 102)]


def test_a_processor_with_concurrency_runs_one_record_at_a_time_in_input_order() -> None:
    async def slower_for_small(value: int) -> int:
        await asyncio.sleep(10 - value)  # on the engine, later records could finish first
        return value

    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=INT)
            .map_values(slower_for_small, concurrency=8, ordering="unordered")
            .to("out", key_serde=STR, value_serde=INT))
    with TopologyTestDriver(builder.build(), {"num.threads.per.task": 4}) as driver:
        driver.create_input_topic("in", STR, INT).pipe_records([("a", n) for n in range(5)])
        assert driver.create_output_topic("out", STR, INT).read_values() == [0, 1, 2, 3, 4]
        assert driver.committed("in") == 5


def test_a_failed_record_names_the_deserialization_handler_setting_and_its_value(driver) -> None:
    driver.create_output_topic("out")
    with pytest.raises(DeserializationError) as caught:
        driver.pipe_raw("in", b"k", b"\xff")

    message = str(caught.value)
    assert ("default.deserialization.exception.handler is "
            "streamloop.handlers.deserialization.LogAndFailExceptionHandler") in message
    assert "answered FAIL" in message
    assert caught.value.handler_setting == "default.deserialization.exception.handler"


def test_a_failed_processor_names_the_processing_handler_setting_and_its_value() -> None:
    class Fails(Exception):
        pass

    def fail(value: int) -> int:
        raise Fails("no")

    with TopologyTestDriver(doubling(fn=fail)) as driver:
        driver.create_output_topic("out", STR, INT)
        with pytest.raises(ProcessingError) as caught:
            driver.create_input_topic("in", STR, INT).pipe_input("a", 1)

    message = str(caught.value)
    assert ("processing.exception.handler is "
            "streamloop.handlers.processing.LogAndFailProcessingExceptionHandler") in message
    assert "answered FAIL" in message


def test_a_crash_after_a_commit_restores_the_store_from_its_changelog() -> None:
    """The changelog holds every update (no cache) and the input is committed, so after the crash
    the store can only come back from the changelog: the driver's reader must restore it."""
    with TopologyTestDriver(counting_topology(), {"commit.interval.ms": 1_000,
                                                  "cache.max.bytes.buffering": 0}) as driver:
        words = driver.create_input_topic("words", STR, STR)
        for word in "aab":
            words.pipe_input(word, word)
        driver.advance_wall_clock_time(1_000)
        assert driver.committed("words") == 3
        driver.crash()
        store = driver.get_key_value_store("counts")
        assert (store.get("a"), store.get("b")) == (2, 1)


class RemembersRestoredTime(BaseProcessor):
    """Forwards its records; notes the stream time a task restored from a commit gives it."""

    restored: ClassVar[list[int]] = []

    def observe_stream_time(self, time: int) -> None:
        RemembersRestoredTime.restored.append(time)

    def process(self, record: Record) -> None:
        self.context.forward(record)


def test_a_crash_restores_stream_time_from_the_commit_as_a_client_does() -> None:
    """What the driver tests is what a client runs: tasks started again after ``crash()`` start
    from the partition time their last commit carries (sl2 metadata), not from -1."""
    RemembersRestoredTime.restored = []
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=INT).process(RemembersRestoredTime)
            .to("out", key_serde=STR, value_serde=INT))
    with TopologyTestDriver(builder.build()) as driver:
        source = driver.create_input_topic("in", STR, INT)
        driver.create_output_topic("out", STR, INT)
        source.pipe_input("a", 1, timestamp=2_000)
        source.pipe_input("b", 2, timestamp=5_000)
        assert RemembersRestoredTime.restored == []
        driver.crash()
        assert RemembersRestoredTime.restored == [5_000]


@pytest.mark.parametrize("ordering", ["partition", "key", "unordered"])
def test_records_run_in_flight_as_a_client_runs_them(ordering: str) -> None:
    """``num.threads.per.task`` and ``processing.ordering`` apply in the driver too: the records a
    task has buffered overlap (at most 4 in flight at once), and with partition ordering the output
    keeps the input's order although later records finish first. (Each piped record runs to
    completion, so the 8 records come together from a topic the topology writes and reads.)"""
    running: list[int] = []
    most = [0]

    async def slow_for_early(value: int) -> int:
        running.append(value)
        most[0] = max(most[0], len(running))
        await asyncio.sleep(0.01 * (8 - value))  # earlier records take longer
        running.remove(value)
        return value

    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=INT).flat_map(lambda k, v: [(f"k{i}", i) for i in range(v)])
            .to("eight", key_serde=STR, value_serde=INT))
    (builder.stream("eight", key_serde=STR, value_serde=INT).map_values(slow_for_early)
            .to("out", key_serde=STR, value_serde=INT))
    config = {"num.threads.per.task": 4, "processing.ordering": ordering}
    with TopologyTestDriver(builder.build(), config) as driver:
        source = driver.create_input_topic("in", STR, INT)
        out = driver.create_output_topic("out", STR, INT)
        source.pipe_input("go", 8)
        values = [v for _k, v in out.read_key_values()]
    assert most[0] == 4
    assert sorted(values) == list(range(8))
    if ordering == "partition":
        assert values == list(range(8))

