"""The one per-record path (``RecordPath``): each outcome once, and the same rules in both run loops."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from streamloop import StreamsBuilder
from streamloop.errors import ProcessingError, StreamsError
from streamloop.handlers.responses import Answer
from streamloop.logcontext import thread_log
from streamloop.processors.api import BaseProcessor
from streamloop.records import FetchedRecord, Record
from streamloop.serdes import IntegerSerde, JsonSerde
from streamloop.tasks.processing import Outcome, RecordPath
from streamloop.tasks.task import TaskState
from streamloop.tasks.timeouts import TaskTimer
from streamloop.transport import open_transport
from tests.support.apps import make_streams
from tests.support.cluster import Cluster
from tests.unit.tasks.test_task import IN, TASK, TaskRig, passing_topology, values_of

INT, JSON = IntegerSerde(), JsonSerde()


class Answering:
    """Stands in for ``ErrorHandling``: every handler gives ``action``."""

    def __init__(self, action: Answer) -> None:
        self.action = action
        self.asked = 0

    async def on_deserialization_error(self, *_: Any) -> Answer:
        self.asked += 1
        return self.action

    async def on_processing_error(self, *_: Any) -> Answer:
        self.asked += 1
        return self.action


class Raising(BaseProcessor):
    """Raises ``errors`` one per record, in turn, then forwards (sync or ``async def``)."""

    def __init__(self, errors: list[BaseException], is_async: bool = False) -> None:
        self.errors = errors
        self.is_async = is_async

    def process(self, record: Record) -> Any:
        if self.is_async:
            return self._later(record)
        self._now(record)
        return None

    async def _later(self, record: Record) -> None:
        await asyncio.sleep(0)
        self._now(record)

    def _now(self, record: Record) -> None:
        if self.errors:
            raise self.errors.pop(0)
        self.context.forward(record)


def raising_rig(errors: list[BaseException], is_async: bool = False) -> TaskRig:
    builder = StreamsBuilder()
    builder.stream("in").process(lambda: Raising(errors, is_async), name="raising").to("out")
    rig = TaskRig(builder.build())
    rig.task.state.transition_to(TaskState.RUNNING)
    return rig


def raw(offset: int, value: bytes = b"v") -> FetchedRecord:
    return FetchedRecord(IN.topic, IN.partition, offset, 0, b"k", value)


async def outcome_of(path: RecordPath, record: FetchedRecord) -> Outcome:
    result = path.process(record)
    return result if isinstance(result, Outcome) else await result


def test_a_record_through_a_synchronous_graph_is_done_without_anything_to_await() -> None:
    rig = TaskRig(passing_topology())

    assert RecordPath(rig.task, journal=True).process(raw(0)) is Outcome.DONE  # the hot path: no coroutine
    assert values_of(rig.collector) == [b"v"]


@pytest.mark.asyncio
async def test_a_record_through_an_async_processor_is_done_once_awaited() -> None:
    rig = raising_rig([], is_async=True)

    result = RecordPath(rig.task, journal=True).process(raw(0))

    assert not isinstance(result, Outcome)
    assert await result == Outcome.DONE
    assert values_of(rig.collector) == [b"v"]


@pytest.mark.asyncio
async def test_an_undeserializable_record_a_handler_continues_past_is_skipped_and_counted() -> None:
    rig = TaskRig(passing_topology(value_serde=JSON))
    rig.rebuild(errors=Answering(Answer.CONTINUE))

    assert await outcome_of(RecordPath(rig.task, journal=True), raw(0, b"{not json")) is Outcome.SKIPPED
    assert rig.task.dropped == 1 and values_of(rig.collector) == []


@pytest.mark.parametrize("is_async", [False, True])
@pytest.mark.asyncio
async def test_a_failing_record_a_handler_pauses_at_pauses_the_task_there(is_async: bool) -> None:
    rig = raising_rig([ValueError("boom")], is_async)
    rig.rebuild(errors=Answering(Answer.PAUSE))

    assert await outcome_of(RecordPath(rig.task, journal=True), raw(4)) is Outcome.PAUSED
    assert rig.task.is_paused and rig.task.paused_at == (IN, 4)
    assert rig.task.position(IN) == 4  # the commit stops at the paused record


@pytest.mark.asyncio
async def test_a_failing_record_a_handler_fails_on_raises_a_processing_error() -> None:
    rig = raising_rig([ValueError("boom")])
    rig.rebuild(errors=Answering(Answer.FAIL))

    with pytest.raises(ProcessingError, match="boom"):
        await outcome_of(RecordPath(rig.task, journal=True), raw(0))


@pytest.mark.asyncio
async def test_a_timeout_is_retried_after_a_back_off_and_the_next_success_clears_the_timer() -> None:
    rig = raising_rig([TimeoutError("slow broker")], is_async=True)
    rig.rebuild(timer=TaskTimer(TASK, 60_000, 1, 1, rig.clock.wall_ms, thread_log(__name__, "t")))
    path = RecordPath(rig.task, journal=True)

    assert await outcome_of(path, raw(0)) is Outcome.RETRY
    assert rig.task.timer.running and rig.task.timeouts == 1 and values_of(rig.collector) == []

    assert await outcome_of(path, raw(0)) is Outcome.DONE
    assert not rig.task.timer.running and values_of(rig.collector) == [b"v"]


@pytest.mark.asyncio
async def test_a_streams_error_that_is_no_timeout_is_raised_without_asking_a_handler() -> None:
    rig = raising_rig([StreamsError("broken")])
    answering = Answering(Answer.CONTINUE)
    rig.rebuild(errors=answering)

    with pytest.raises(StreamsError, match="broken"):
        await outcome_of(RecordPath(rig.task, journal=True), raw(0))
    assert answering.asked == 0


@pytest.mark.parametrize("threads_per_task", [1, 4])
@pytest.mark.asyncio
async def test_both_run_loops_retry_a_timed_out_record_and_output_each_record_once_in_order(
        threads_per_task: int) -> None:
    bootstrap = f"memory://processing-{uuid.uuid4().hex[:8]}"
    cluster = Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)
    await cluster.create_topics({"in": 1, "out": 1})
    await cluster.produce("in", [(i, {"i": i}) for i in range(20)], INT, JSON, partitions=1)
    timed_out: set[int] = set()

    async def flaky(value: dict[str, int]) -> dict[str, int]:
        await asyncio.sleep(0)
        if value["i"] in (3, 11) and value["i"] not in timed_out:
            timed_out.add(value["i"])
            raise TimeoutError(f"record {value['i']} timed out")
        return value

    builder = StreamsBuilder()
    builder.stream("in", key_serde=INT, value_serde=JSON).map_values(flaky).to("out", key_serde=INT, value_serde=JSON)
    streams = make_streams(builder.build(), bootstrap, "processing-app", num_threads_per_task=threads_per_task,
                           task_timeout_ms=60_000, retry_backoff_ms=1, retry_backoff_max_ms=1)
    async with streams:
        await cluster.read("out", 20, timeout=30)
    output = sorted(await cluster.read_all("out"), key=lambda r: r.offset)

    assert timed_out == {3, 11}
    assert [JSON.deserialize(r.value)["i"] for r in output] == list(range(20))
