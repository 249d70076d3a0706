"""``StreamTask`` driven directly on the test's event loop.

Each test builds one task the way ``TaskManager._create`` does (a
``TaskContext``, ``Topology.build_task_graph``, a ``send_buffered`` coroutine
function, a thread's ``LogContext`` and a clock), buffers fetched records into
it, runs its coroutine and waits on conditions with a deadline. The clock is a
``ManualClock``: wall-clock punctuation moves only when a test advances it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from streamloop.clock import ManualClock
from streamloop.errors import DeserializationError, ProcessingError
from streamloop.ids import TaskId
from streamloop.lifecycle import IllegalTransitionError
from streamloop.logcontext import thread_log
from streamloop.processors.api import BaseProcessor, ProcessorContext, PunctuationType
from streamloop.processors.context import TaskContext
from streamloop.processors.nodes import SinkNode
from streamloop.records import FetchedRecord, Headers, Record, TopicPartition
from streamloop.serdes import BytesSerde, IntegerSerde, JsonSerde
from streamloop.tasks.setup import ExactlyOnceTask, TaskSetup
from streamloop.tasks.task import StreamTask, TaskState
from streamloop.testing import eventually_async
from streamloop.topology.builder import StreamsBuilder
from streamloop.topology.topology import Topology
from streamloop.transport.base import OffsetAndMetadata

TASK = TaskId(0, 2)
IN = TopicPartition("in", 2)
A, B = TopicPartition("a", 2), TopicPartition("b", 2)
WAIT = 5.0


@dataclass
class RecordingCollector:
    """Stands in for ``RecordCollector``: keeps what the sinks send, in order."""

    sent: list[tuple[str, Record]] = field(default_factory=list)

    def send(self, topic: str, record: Record, sink: SinkNode) -> None:
        self.sent.append((topic, record))


class TaskRig:
    """One ``StreamTask`` of ``topology``'s sub-topology 0, as ``TaskManager._create`` builds it."""

    def __init__(self, topology: Topology, partitions: Sequence[TopicPartition] = (IN,)) -> None:
        self.clock = ManualClock(1_000)
        self.collector = RecordingCollector()
        self.hand_overs = 0
        self._topology, self._partitions = topology, partitions
        self.task = self._build(TaskSetup())

    def _build(self, setup: TaskSetup) -> StreamTask:
        self.context = TaskContext("app", TASK, self.clock.wall_ms)
        graph = self._topology.build_task_graph(TASK.subtopology, self.context, self.collector,  # type: ignore[arg-type]
                                                BytesSerde(), BytesSerde())
        return StreamTask(TASK, self._partitions, graph, self.context, self._send_buffered,
                          thread_log(__name__, "app-StreamThread-1"), self.clock.wall_ms, setup)

    def rebuild(self, **setup: Any) -> StreamTask:
        """The task built again, as the task manager would, with these ``TaskSetup`` fields (and as
        far along as the one it replaces: a rig made RUNNING stays so)."""
        running = self.task.state.state is TaskState.RUNNING
        self.task = self._build(TaskSetup(**setup))
        if running:
            self.task.state.transition_to(TaskState.RUNNING)
        return self.task

    async def _send_buffered(self) -> None:
        self.hand_overs += 1

    def add(self, tp: TopicPartition, *records: tuple[int, Any, Any, int]) -> None:
        """Buffer ``(offset, key, value, timestamp)`` records of ``tp`` (raw bytes)."""
        self.task.add_records(tp, [FetchedRecord(tp.topic, tp.partition, o, ts, k, v) for o, k, v, ts in records])

    @asynccontextmanager
    async def running(self) -> AsyncIterator[asyncio.Task[None]]:
        """Run the task's coroutine; on exit ask it to close and wait for it."""
        runner = asyncio.get_running_loop().create_task(self.task.run())
        try:
            yield runner
        finally:
            self.task.request_close()
            await asyncio.wait_for(runner, WAIT)
            self.task.close()

    async def processed(self, count: int) -> None:
        await eventually_async(lambda: self.task.processed >= count, timeout=WAIT,
                               what=f"{count} records processed")


def positions_of(offsets: dict[TopicPartition, OffsetAndMetadata]) -> dict[TopicPartition, int]:
    """The offsets alone (the metadata carries the partition time: test_partition_time_metadata.py)."""
    return {tp: om.offset for tp, om in offsets.items()}


def values_of(collector: RecordingCollector) -> list[Any]:
    return [record.value for _, record in collector.sent]


def plain(offset: int, value: bytes, timestamp: int = 0, key: bytes | None = b"k") -> tuple[int, Any, Any, int]:
    return (offset, key, value, timestamp)


class Gate(BaseProcessor):
    """An ``async def`` processor that holds each record until the test opens the gate."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()
        self.seen: list[Any] = []

    async def process(self, record: Record) -> None:
        self.seen.append(record.value)
        self.entered.set()
        await self.gate.wait()
        self.context.forward(record)


def gated_topology(gate: Gate) -> Topology:
    builder = StreamsBuilder()
    builder.stream("in").process(lambda: gate, name="gate").to("out")
    return builder.build()


def passing_topology(topics: str | list[str] = "in", **serdes: Any) -> Topology:
    builder = StreamsBuilder()
    builder.stream(topics, **serdes).to("out")
    return builder.build()


# -- order ------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_records_of_a_partition_are_processed_in_offset_order() -> None:
    rig = TaskRig(passing_topology())
    # Timestamps go backwards: within one partition only the offset decides.
    rig.add(IN, *(plain(o, f"v{o}".encode(), timestamp=100 - o) for o in range(5)))

    async with rig.running():
        await rig.processed(5)

    assert values_of(rig.collector) == [b"v0", b"v1", b"v2", b"v3", b"v4"]


@pytest.mark.asyncio
async def test_with_two_source_topics_the_record_with_the_lowest_head_timestamp_goes_first() -> None:
    rig = TaskRig(passing_topology(["a", "b"]), partitions=[A, B])
    rig.add(A, plain(0, b"a@10", 10), plain(1, b"a@30", 30), plain(2, b"a@50", 50))
    rig.add(B, plain(0, b"b@20", 20), plain(1, b"b@40", 40))

    async with rig.running():
        await rig.processed(5)

    assert values_of(rig.collector) == [b"a@10", b"b@20", b"a@30", b"b@40", b"a@50"]


@pytest.mark.asyncio
async def test_output_is_handed_over_after_each_chunk_of_records() -> None:
    rig = TaskRig(passing_topology())
    rig.add(IN, plain(0, b"x"))

    async with rig.running():
        await rig.processed(1)
        await eventually_async(lambda: rig.hand_overs >= 1, timeout=WAIT, what="send_buffered after the chunk")


# -- committable positions -----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_committable_offsets_are_the_last_processed_offset_plus_one_per_partition() -> None:
    rig = TaskRig(passing_topology(["a", "b"]), partitions=[A, B])
    rig.add(A, plain(5, b"1", 1), plain(6, b"2", 2), plain(7, b"3", 3))
    rig.add(B, plain(0, b"4", 4))

    async with rig.running():
        await rig.processed(4)

    assert positions_of(rig.task.committable_offsets()) == {A: 8, B: 1}


def test_a_task_that_processed_nothing_has_nothing_to_commit() -> None:
    rig = TaskRig(passing_topology())
    rig.add(IN, plain(0, b"x"))

    assert rig.task.committable_offsets() == {}


@pytest.mark.asyncio
async def test_committable_offsets_leave_out_partitions_unchanged_since_the_last_commit() -> None:
    rig = TaskRig(passing_topology(["a", "b"]), partitions=[A, B])
    rig.add(A, plain(0, b"1", 1))
    rig.add(B, plain(0, b"2", 2))

    async with rig.running():
        await rig.processed(2)
        rig.task.mark_committed(rig.task.committable_offsets())
        assert rig.task.committable_offsets() == {}
        rig.add(A, plain(1, b"3", 3))
        await rig.processed(3)

    assert positions_of(rig.task.committable_offsets()) == {A: 2}


@pytest.mark.asyncio
async def test_offset_is_committable_only_after_the_async_processor_of_the_record_finished() -> None:
    gate = Gate()
    rig = TaskRig(gated_topology(gate))
    rig.add(IN, plain(0, b"x"))

    async with rig.running():
        await asyncio.wait_for(gate.entered.wait(), WAIT)
        assert rig.task.committable_offsets() == {}
        assert rig.collector.sent == []

        gate.gate.set()
        await eventually_async(lambda: positions_of(rig.task.committable_offsets()) == {IN: 1},
                               timeout=WAIT, what="offset 0 committable")
        assert values_of(rig.collector) == [b"x"]


# -- failures ---------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_undeserializable_key_raises_deserialization_error_naming_task_topic_partition_offset() -> None:
    rig = TaskRig(passing_topology(key_serde=IntegerSerde()))
    rig.add(IN, (3, b"\x00\x00\x00\x01", b"ok", 0), (4, b"abc", b"bad key", 0))

    with pytest.raises(DeserializationError) as info:
        await asyncio.wait_for(rig.task.run(), WAIT)

    error = info.value
    assert (error.task_id, error.topic, error.partition, error.offset, error.what) == (TASK, "in", 2, 4, "key")
    assert isinstance(error.__cause__, ValueError)
    assert str(error).startswith("Task 0_2: Failed to deserialize the key of the record at in-2 offset 4")
    # The record before it was processed; the failing one is not committable.
    assert positions_of(rig.task.committable_offsets()) == {IN: 4}


@pytest.mark.asyncio
async def test_undeserializable_value_raises_deserialization_error_saying_value() -> None:
    rig = TaskRig(passing_topology(value_serde=JsonSerde()))
    rig.add(IN, (0, b"k", b"{not json", 0))

    with pytest.raises(DeserializationError) as info:
        await asyncio.wait_for(rig.task.run(), WAIT)

    assert (info.value.what, info.value.offset) == ("value", 0)
    assert info.value.__cause__ is not None


class Failing(BaseProcessor):
    def __init__(self, error: Exception, is_async: bool) -> None:
        self.error = error
        self.is_async = is_async

    def process(self, record: Record) -> Any:
        if record.value != b"fail":
            self.context.forward(record)
            return None
        if self.is_async:
            return self._fail_later()
        raise self.error

    async def _fail_later(self) -> None:
        await asyncio.sleep(0)
        raise self.error


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.asyncio
async def test_processor_error_becomes_processing_error_naming_node_and_record(is_async: bool) -> None:
    original = ValueError("boom")
    builder = StreamsBuilder()
    builder.stream("in").process(lambda: Failing(original, is_async), name="failing").to("out")
    rig = TaskRig(builder.build())
    rig.add(IN, plain(0, b"ok"), plain(1, b"fail"), plain(2, b"never"))

    with pytest.raises(ProcessingError) as info:
        await asyncio.wait_for(rig.task.run(), WAIT)

    error = info.value
    assert (error.task_id, error.processor, error.topic, error.partition, error.offset) == (
        TASK, "failing", "in", 2, 1)
    assert error.__cause__ is original
    assert "Processor 'failing' failed on the record at in-2 offset 1: ValueError: boom" in str(error)
    assert values_of(rig.collector) == [b"ok"]
    assert positions_of(rig.task.committable_offsets()) == {IN: 1}


@pytest.mark.asyncio
async def test_failing_run_still_sets_finished() -> None:
    builder = StreamsBuilder()
    builder.stream("in").process(lambda: Failing(ValueError("boom"), False), name="failing")
    rig = TaskRig(builder.build())
    rig.add(IN, plain(0, b"fail"))

    with pytest.raises(ProcessingError):
        await asyncio.wait_for(rig.task.run(), WAIT)

    assert rig.task.finished.is_set()


# -- closing and states -------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_request_close_stops_after_the_record_in_flight_and_sets_finished() -> None:
    gate = Gate()
    rig = TaskRig(gated_topology(gate))
    rig.add(IN, plain(0, b"first"), plain(1, b"second"), plain(2, b"third"))

    async with rig.running() as runner:
        await asyncio.wait_for(gate.entered.wait(), WAIT)
        rig.task.request_close()
        assert not rig.task.finished.is_set()

        gate.gate.set()
        await asyncio.wait_for(rig.task.finished.wait(), WAIT)
        await asyncio.wait_for(runner, WAIT)

    assert gate.seen == [b"first"]
    assert values_of(rig.collector) == [b"first"]
    assert positions_of(rig.task.committable_offsets()) == {IN: 1}


@pytest.mark.asyncio
async def test_request_close_ends_an_idle_task() -> None:
    rig = TaskRig(passing_topology())

    async with rig.running() as runner:
        await eventually_async(lambda: rig.task.state.state is TaskState.RUNNING, timeout=WAIT, what="RUNNING")
        rig.task.request_close()
        await asyncio.wait_for(runner, WAIT)

    assert rig.task.finished.is_set()


@pytest.mark.asyncio
async def test_task_goes_from_created_to_running_to_closed() -> None:
    rig = TaskRig(passing_topology())
    seen: list[tuple[TaskState, TaskState]] = []
    rig.task.state.add_listener(lambda old, new: seen.append((old, new)))
    assert rig.task.state.state is TaskState.CREATED

    async with rig.running() as runner:
        await eventually_async(lambda: rig.task.state.state is TaskState.RUNNING, timeout=WAIT, what="RUNNING")
        rig.task.request_close()
        await asyncio.wait_for(runner, WAIT)
    rig.task.close()  # idempotent: the rig closed it already

    assert seen == [(TaskState.CREATED, TaskState.RUNNING), (TaskState.RUNNING, TaskState.CLOSED)]


def test_a_created_task_can_be_closed_without_running() -> None:
    rig = TaskRig(passing_topology())

    rig.task.close()

    assert rig.task.state.state is TaskState.CLOSED


def test_a_created_task_cannot_be_paused() -> None:
    rig = TaskRig(passing_topology())

    with pytest.raises(IllegalTransitionError, match="from CREATED to PAUSED"):
        rig.task.state.transition_to(TaskState.PAUSED)
    assert rig.task.state.state is TaskState.CREATED


@pytest.mark.asyncio
async def test_a_closed_task_cannot_run_again() -> None:
    rig = TaskRig(passing_topology())
    rig.task.close()

    with pytest.raises(IllegalTransitionError, match="from CLOSED to RUNNING"):
        await rig.task.run()


def test_close_closes_every_processor_and_drops_buffered_records() -> None:
    closed: list[str] = []

    class Closing(BaseProcessor):
        def __init__(self, name: str) -> None:
            self.name = name

        def process(self, record: Record) -> None:
            self.context.forward(record)

        def close(self) -> None:
            closed.append(self.name)

    builder = StreamsBuilder()
    builder.stream("in").process(lambda: Closing("first"), name="p1").process(lambda: Closing("second"), name="p2")
    rig = TaskRig(builder.build())
    rig.add(IN, plain(0, b"x"), plain(1, b"y"))

    rig.task.close()
    rig.task.close()

    assert closed == ["first", "second"]
    assert rig.task.buffered() == 0


# -- punctuation -----------------------------------------------------------------------------------------


class Punctuating(BaseProcessor):
    """Schedules one punctuation in ``init``; the punctuator forwards a ``tick`` record."""

    def __init__(self, kind: PunctuationType, interval_ms: int) -> None:
        self.kind = kind
        self.interval_ms = interval_ms
        self.fired: list[int] = []
        self.contexts: list[tuple[Any, ...]] = []

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        context.schedule(self.interval_ms, self.kind, self.punctuate)

    def punctuate(self, timestamp: int) -> None:
        ctx = self.context
        self.fired.append(timestamp)
        self.contexts.append((ctx.topic, ctx.partition, ctx.offset, ctx.timestamp))
        ctx.forward(Record(b"tick", str(timestamp).encode(), timestamp))

    def process(self, record: Record) -> None:
        pass


def punctuating_rig(kind: PunctuationType, interval_ms: int) -> tuple[TaskRig, Punctuating]:
    processor = Punctuating(kind, interval_ms)
    builder = StreamsBuilder()
    builder.stream("in").process(lambda: processor, name="punctuating").to("out")
    return TaskRig(builder.build()), processor


@pytest.mark.asyncio
async def test_stream_time_punctuation_fires_when_record_timestamps_pass_the_interval() -> None:
    rig, processor = punctuating_rig(PunctuationType.STREAM_TIME, 100)
    rig.add(IN, plain(0, b"", 50), plain(1, b"", 100), plain(2, b"", 150), plain(3, b"", 120),
            plain(4, b"", 250), plain(5, b"", 260))

    async with rig.running():
        await rig.processed(6)

    # Due at 100, 200, 300…; the jump to 250 fires once, with the stream time.
    assert processor.fired == [100, 250]


@pytest.mark.asyncio
async def test_stream_time_does_not_move_without_records_so_stream_punctuation_waits() -> None:
    rig, processor = punctuating_rig(PunctuationType.STREAM_TIME, 100)

    async with rig.running():
        rig.clock.advance(10_000)
        rig.add(IN, plain(0, b"", 99))
        await rig.processed(1)

    assert processor.fired == []


@pytest.mark.asyncio
async def test_wall_clock_punctuation_fires_from_the_clock_while_the_task_is_idle() -> None:
    rig, processor = punctuating_rig(PunctuationType.WALL_CLOCK_TIME, 10)

    async with rig.running():
        await eventually_async(lambda: rig.task.state.state is TaskState.RUNNING, timeout=WAIT, what="RUNNING")
        assert processor.fired == []

        rig.clock.advance(10)
        await eventually_async(lambda: processor.fired == [1_010], timeout=WAIT, what="punctuation at 1010")

        rig.clock.advance(25)  # two intervals and a half: fires once, then realigns
        await eventually_async(lambda: processor.fired == [1_010, 1_035], timeout=WAIT,
                               what="punctuation at 1035")


@pytest.mark.asyncio
async def test_punctuator_forwards_reach_the_sink_with_no_source_record_in_the_context() -> None:
    rig, processor = punctuating_rig(PunctuationType.WALL_CLOCK_TIME, 10)

    async with rig.running():
        rig.clock.advance(10)
        await eventually_async(lambda: rig.collector.sent, timeout=WAIT, what="the tick reaches the sink")

    assert rig.collector.sent[0] == ("out", Record(b"tick", b"1010", 1_010))
    assert processor.contexts[0] == (None, None, None, 1_010)


@pytest.mark.asyncio
async def test_punctuator_error_becomes_processing_error_naming_its_node_without_a_record() -> None:
    original = RuntimeError("tick failed")

    class FailingPunctuator(BaseProcessor):
        def init(self, context: ProcessorContext) -> None:
            super().init(context)
            context.schedule(100, PunctuationType.STREAM_TIME, self.punctuate)

        def punctuate(self, timestamp: int) -> None:
            raise original

        def process(self, record: Record) -> None:
            pass

    builder = StreamsBuilder()
    builder.stream("in").process(FailingPunctuator, name="ticking")
    rig = TaskRig(builder.build())
    rig.add(IN, plain(0, b"", 100))

    with pytest.raises(ProcessingError) as info:
        await asyncio.wait_for(rig.task.run(), WAIT)

    error = info.value
    assert (error.task_id, error.processor, error.topic, error.partition, error.offset) == (
        TASK, "ticking", None, None, None)
    assert error.__cause__ is original


@pytest.mark.asyncio
async def test_output_of_a_wall_clock_punctuation_on_an_idle_task_is_handed_over() -> None:
    rig, _ = punctuating_rig(PunctuationType.WALL_CLOCK_TIME, 10)

    async with rig.running():
        await eventually_async(lambda: rig.task.state.state is TaskState.RUNNING, timeout=WAIT, what="RUNNING")
        rig.clock.advance(10)
        await eventually_async(lambda: rig.collector.sent, timeout=WAIT, what="the tick reaches the sink")
        await eventually_async(lambda: rig.hand_overs >= 1, timeout=0.5, what="send_buffered after the tick")


# -- the processor context ------------------------------------------------------------------------------


class Observing(BaseProcessor):
    def __init__(self) -> None:
        self.seen: list[tuple[Any, ...]] = []

    def process(self, record: Record) -> None:
        ctx = self.context
        self.seen.append((ctx.application_id, ctx.task_id, ctx.topic, ctx.partition, ctx.offset,
                          ctx.timestamp, list(ctx.headers)))
        if record.value == b"commit":
            ctx.commit()


def observing_rig() -> tuple[TaskRig, Observing]:
    processor = Observing()
    builder = StreamsBuilder()
    builder.stream(["a", "b"]).process(lambda: processor, name="observing")
    return TaskRig(builder.build(), partitions=[A, B]), processor


@pytest.mark.asyncio
async def test_processor_context_describes_the_record_being_processed() -> None:
    rig, processor = observing_rig()
    headers: Headers = [("trace", b"t1")]
    rig.task.add_records(A, [FetchedRecord("a", 2, 41, 500, b"k", b"v", headers)])
    rig.task.add_records(B, [FetchedRecord("b", 2, 7, 600, b"k", b"w")])

    async with rig.running():
        await rig.processed(2)

    assert processor.seen == [
        ("app", TASK, "a", 2, 41, 500, [("trace", b"t1")]),
        ("app", TASK, "b", 2, 7, 600, []),
    ]


@pytest.mark.asyncio
async def test_context_commit_sets_commit_requested() -> None:
    rig, _ = observing_rig()
    rig.add(A, plain(0, b"no"))

    async with rig.running():
        await rig.processed(1)
        assert not rig.task.commit_needed()
        rig.add(A, plain(1, b"commit"))
        await rig.processed(2)

    assert rig.context.commit_requested
    assert rig.task.commit_needed()


@pytest.mark.asyncio
async def test_buffered_counts_records_waiting_per_partition_and_in_all() -> None:
    rig = TaskRig(passing_topology(["a", "b"]), partitions=[A, B])

    assert rig.task.add_records(A, [FetchedRecord("a", 2, o, 0, None, b"") for o in range(3)]) == 3
    rig.add(B, plain(0, b""))

    assert (rig.task.buffered(A), rig.task.buffered(B), rig.task.buffered()) == (3, 1, 4)
    async with rig.running():
        await rig.processed(4)
    assert rig.task.buffered() == 0



def test_records_failing_together_pause_the_task_at_the_lowest_one() -> None:
    """A Spark batch fails all its records; whichever asks first, the pause ends at the lowest."""
    rig = TaskRig(passing_topology())
    rig.task.state.transition_to(TaskState.RUNNING)
    failed = [FetchedRecord(IN.topic, IN.partition, offset, 0, None, b"{}") for offset in (7, 5, 9)]

    for raw in failed[:2]:
        rig.task.pause(raw)

    assert rig.task.paused_at == (IN, 5)
    assert rig.task.position(IN) == 5
    assert rig.task.paused_below(failed[2])  # asked no more: read again on resume
    assert not rig.task.paused_below(FetchedRecord(IN.topic, IN.partition, 3, 0, None, b"{}"))


@pytest.mark.asyncio
async def test_a_failed_start_under_exactly_once_keeps_its_cause() -> None:
    """A TaskError always has the original exception as ``__cause__`` (engine/errors.py): a fenced
    producer and a timed-out start become TaskMigratedError and TaskCorruptedError from them."""
    from streamloop.errors import ProducerFencedError, TaskCorruptedError, TaskMigratedError, TransportError
    from streamloop.tasks.timeouts import TaskTimer

    builder = StreamsBuilder()
    builder.stream("in").to("out")
    for raised, expected in ((ProducerFencedError("fenced by a newer producer"), TaskMigratedError),
                             (TransportError("initialising timed out"), TaskCorruptedError)):
        raised.retriable = isinstance(raised, TransportError) and not isinstance(raised, ProducerFencedError)
        rig = TaskRig(builder.build())

        async def initialize(raised: BaseException = raised) -> None:
            raise raised

        rig.rebuild(timer=TaskTimer(TASK, 60_000, 100, 1_000, rig.clock.monotonic_ms, rig.task.log),
                    exactly_once=ExactlyOnceTask(rig.collector, initialize, lambda _committed: None,  # type: ignore[arg-type]
                                                 lambda _task: None))
        await asyncio.wait_for(rig.task.run(), WAIT)
        error = rig.task.transaction_error
        assert isinstance(error, expected) and error.task_id == TASK
        assert error.__cause__ is raised


@pytest.mark.asyncio
async def test_a_start_that_meets_a_revoked_partition_waits_for_the_close_that_follows() -> None:
    """A cooperative rebalance installs the new assignment before its revocation callback asks the
    task to close: a restore that reads a position in between fails with IllegalStateError. That is
    the close on its way, not a failure of the thread."""
    from streamloop.errors import IllegalStateError

    builder = StreamsBuilder()
    builder.stream("in").to("out")
    rig = TaskRig(builder.build())

    async def restore(_committed: object) -> None:
        raise IllegalStateError("Partition TopicPartition(topic='in', partition=2) is not assigned")

    rig.rebuild(restore=restore)
    runner = asyncio.get_running_loop().create_task(rig.task.run())
    await eventually_async(lambda: rig.task.state.state is TaskState.RESTORING, WAIT, "the restore started")
    rig.task.request_close()  # the revocation callback, a moment later
    await asyncio.wait_for(runner, WAIT)  # ends cleanly: no IllegalStateError
    assert rig.task.finished.is_set()
