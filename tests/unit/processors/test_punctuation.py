"""``PunctuationQueue``: when schedules are due, how they re-arm, and cancelling them."""

from __future__ import annotations

from typing import Any

import pytest

from streamloop.clock import ManualClock
from streamloop.ids import TaskId
from streamloop.processors.api import BaseProcessor, PunctuationType
from streamloop.processors.context import TaskContext
from streamloop.processors.punctuation import PunctuationQueue, Schedule
from streamloop.records import Record
from streamloop.serdes import BytesSerde
from streamloop.topology.builder import StreamsBuilder


def noop(_timestamp: int) -> None:
    return None


@pytest.fixture
def queue() -> PunctuationQueue:
    return PunctuationQueue(PunctuationType.STREAM_TIME)


def names(fired: list[Schedule]) -> list[str]:
    return [s.node_name for s in fired]


def test_schedule_is_first_due_one_interval_after_now(queue: PunctuationQueue) -> None:
    entry = queue.schedule(100, 10, noop, "p")

    assert entry.due == 110
    assert queue.next_due() == 110


def test_schedule_carries_its_kind_and_node(queue: PunctuationQueue) -> None:
    entry = queue.schedule(0, 10, noop, "p")

    assert entry.kind is PunctuationType.STREAM_TIME
    assert entry.node_name == "p"
    assert entry.callback is noop


def test_nothing_fires_before_the_due_time(queue: PunctuationQueue) -> None:
    queue.schedule(0, 10, noop, "p")

    assert queue.due(9) == []
    assert queue.next_due() == 10


def test_schedule_fires_at_its_due_time(queue: PunctuationQueue) -> None:
    entry = queue.schedule(0, 10, noop, "p")

    assert queue.due(10) == [entry]


def test_fired_schedule_is_re_armed_one_interval_later(queue: PunctuationQueue) -> None:
    queue.schedule(0, 10, noop, "p")

    queue.due(10)

    assert queue.next_due() == 20
    assert len(queue) == 1


def test_schedule_fires_once_per_call_even_when_intervals_were_missed(queue: PunctuationQueue) -> None:
    entry = queue.schedule(0, 10, noop, "p")

    assert queue.due(45) == [entry]


def test_missed_intervals_are_skipped_to_the_first_due_time_after_now(queue: PunctuationQueue) -> None:
    queue.schedule(0, 10, noop, "p")

    queue.due(45)

    assert queue.next_due() == 50


def test_firing_exactly_on_an_interval_re_arms_for_the_next_one(queue: PunctuationQueue) -> None:
    queue.schedule(0, 10, noop, "p")

    queue.due(40)

    assert queue.next_due() == 50
    assert queue.due(49) == []


def test_due_schedules_fire_in_due_time_order(queue: PunctuationQueue) -> None:
    queue.schedule(0, 30, noop, "slow")
    queue.schedule(0, 10, noop, "fast")
    queue.schedule(0, 20, noop, "middle")

    assert names(queue.due(30)) == ["fast", "middle", "slow"]


def test_schedules_due_at_the_same_time_fire_in_the_order_they_were_made(queue: PunctuationQueue) -> None:
    queue.schedule(0, 10, noop, "first")
    queue.schedule(0, 10, noop, "second")

    assert names(queue.due(10)) == ["first", "second"]
    assert names(queue.due(20)) == ["first", "second"]


def test_cancelled_schedule_never_fires(queue: PunctuationQueue) -> None:
    entry = queue.schedule(0, 10, noop, "p")

    entry.cancel()

    assert queue.due(100) == []


def test_cancelled_schedule_is_not_counted_or_due(queue: PunctuationQueue) -> None:
    cancelled = queue.schedule(0, 5, noop, "cancelled")
    queue.schedule(0, 10, noop, "kept")

    cancelled.cancel()

    assert len(queue) == 1
    assert queue.next_due() == 10


def test_cancelling_after_a_firing_stops_later_firings(queue: PunctuationQueue) -> None:
    entry = queue.schedule(0, 10, noop, "p")
    queue.due(10)

    entry.cancel()

    assert queue.due(20) == []
    assert queue.next_due() is None


def test_empty_queue_has_no_due_time(queue: PunctuationQueue) -> None:
    assert queue.next_due() is None
    assert len(queue) == 0


@pytest.mark.parametrize("interval", [0, -10])
def test_interval_below_one_ms_raises_value_error(queue: PunctuationQueue, interval: int) -> None:
    with pytest.raises(ValueError, match=f"at least 1 ms, got {interval}"):
        queue.schedule(0, interval, noop, "p")


# -- scheduling from a processor ------------------------------------------------------------


class Scheduling(BaseProcessor):
    def __init__(self, kind: PunctuationType, interval: int) -> None:
        self.kind = kind
        self.interval = interval

    def init(self, context: Any) -> None:
        super().init(context)
        self.schedule = context.schedule(self.interval, self.kind, noop)

    def process(self, record: Record) -> None:
        pass


def task_context_with(processor: Scheduling, wall_clock_ms: int = 5_000) -> TaskContext:
    builder = StreamsBuilder()
    builder.stream("in").process(lambda: processor, name="scheduler")
    context = TaskContext("app", TaskId(0, 0), ManualClock(wall_clock_ms).wall_ms)
    builder.build().build_task_graph(0, context, object(), BytesSerde(), BytesSerde())  # type: ignore[arg-type]
    return context


def test_wall_clock_schedule_from_a_processor_counts_from_the_clock() -> None:
    processor = Scheduling(PunctuationType.WALL_CLOCK_TIME, 1_000)

    context = task_context_with(processor, wall_clock_ms=5_000)

    assert context.wall_clock_schedules.next_due() == 6_000
    assert context.stream_time_schedules.next_due() is None
    assert processor.schedule.node_name == "scheduler"


def test_stream_time_schedule_made_before_any_record_counts_from_zero() -> None:
    processor = Scheduling(PunctuationType.STREAM_TIME, 100)

    context = task_context_with(processor)

    assert context.stream_time_schedules.next_due() == 100
    assert context.wall_clock_schedules.next_due() is None
