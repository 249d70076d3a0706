"""KIP-572 task timer on a manual clock: start, reset on progress, final attempt, zero."""

from __future__ import annotations

import logging

import pytest
from aiokafka import errors as kafka_errors

from streamloop.clock import ManualClock
from streamloop.errors import ProduceError, StartupTimeoutError, StreamsTimeoutError, TaskTimeoutError, TransportError
from streamloop.ids import TaskId
from streamloop.logcontext import LogContext
from streamloop.tasks.timeouts import StartupDeadline, TaskTimer, is_timeout
from streamloop.transport.kafka import errors as _kafka_transport_errors  # noqa: F401  # registers aiokafka's batch expiry, as the transport does when it loads

TASK = TaskId(0, 1)
LOG = LogContext(logging.getLogger("test.timeouts"), "task [0_1] ")


def timer(clock: ManualClock, timeout_ms: int = 1_000, backoff_ms: int = 100, max_backoff_ms: int = 400) -> TaskTimer:
    return TaskTimer(TASK, timeout_ms, backoff_ms, max_backoff_ms, clock.monotonic_ms, LOG)


def test_first_timeout_starts_the_timer_at_now_plus_task_timeout() -> None:
    clock = ManualClock(5_000)
    t = timer(clock)
    assert not t.running
    t.on_timeout(TimeoutError("slow"), "Processor 'x'", attempt_started_ms=0)
    assert t.deadline_ms == 6_000


def test_progress_clears_the_timer() -> None:
    clock = ManualClock()
    t = timer(clock)
    t.on_timeout(TimeoutError(), "Processor 'x'", 0)
    t.clear()
    assert not t.running and t.retries == 0
    clock.advance(10_000)
    t.on_timeout(TimeoutError(), "Processor 'x'", clock.monotonic_ms())
    assert t.deadline_ms == 11_000  # a fresh timer, not the old deadline


def test_attempts_started_before_the_deadline_are_retried() -> None:
    clock = ManualClock()
    t = timer(clock)
    t.on_timeout(TimeoutError(), "Processor 'x'", 0)
    started = clock.monotonic_ms() + 999
    clock.advance(5_000)  # the attempt began before the deadline and ended long after it
    t.on_timeout(TimeoutError(), "Processor 'x'", started)
    assert t.running


def test_an_attempt_started_after_the_deadline_is_the_final_one() -> None:
    clock = ManualClock()
    t = timer(clock)
    t.on_timeout(TimeoutError(), "Processor 'x'", 0)
    clock.advance(1_000)
    cause = TimeoutError("still slow")
    with pytest.raises(TaskTimeoutError) as raised:
        t.on_timeout(cause, "Processor 'x'", clock.monotonic_ms())
    assert raised.value.task_id == TASK
    assert raised.value.__cause__ is cause
    assert "1000 ms" in str(raised.value) and "task.timeout.ms" in str(raised.value)


def test_task_timeout_error_is_not_itself_a_timeout() -> None:
    assert not isinstance(TaskTimeoutError(TASK, 10, "x"), TimeoutError)
    assert not is_timeout(TaskTimeoutError(TASK, 10, "x"))


def test_zero_task_timeout_means_no_retry() -> None:
    t = timer(ManualClock(), timeout_ms=0)
    with pytest.raises(TaskTimeoutError, match=r"task.timeout.ms is 0"):
        t.on_timeout(TimeoutError(), "Processor 'x'", 0)


def test_back_off_grows_to_its_cap() -> None:
    clock = ManualClock()
    t = timer(clock, timeout_ms=60_000, backoff_ms=100, max_backoff_ms=400)
    delays = [t.on_timeout(TimeoutError(), "Commit", 0) for _ in range(5)]
    assert delays == [0.1, 0.2, 0.4, 0.4, 0.4]


def test_each_timeout_logs_a_warning_with_what_and_time_left(caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    t = timer(clock)
    with caplog.at_level(logging.WARNING):
        t.on_timeout(TimeoutError(), "Processor 'enrich' on orders-0 offset 7", 0)
    message = caplog.records[-1].getMessage()
    assert "task [0_1]" in message and "Processor 'enrich' on orders-0 offset 7" in message
    assert "1000 ms left" in message


@pytest.mark.parametrize("exc", [
    TimeoutError(),
    TimeoutError(),
    kafka_errors.KafkaTimeoutError(),
    kafka_errors.RequestTimedOutError(),
    kafka_errors.NodeNotReadyError(),
    kafka_errors.KafkaConnectionError(),
    # A broker restart: the new leader or coordinator is not known yet when the request times out.
    kafka_errors.LeaderNotAvailableError(),
    kafka_errors.NotLeaderForPartitionError(),
    kafka_errors.NotCoordinatorForGroupError(),
    kafka_errors.CoordinatorNotAvailableError(),
    kafka_errors.CoordinatorLoadInProgressError(),
    kafka_errors.UnknownTopicOrPartitionError(),
], ids=lambda e: type(e).__name__)
def test_client_timeouts_count_as_timeouts(exc: BaseException) -> None:
    assert is_timeout(exc)


@pytest.mark.parametrize("exc", [
    kafka_errors.TopicAuthorizationFailedError(),
    kafka_errors.InvalidTopicError(),
    kafka_errors.MessageSizeTooLargeError(),
    kafka_errors.ProducerFenced(),
], ids=lambda e: type(e).__name__)
def test_client_errors_that_a_retry_cannot_fix_are_not_timeouts(exc: BaseException) -> None:
    assert not is_timeout(exc)


def test_a_produce_error_from_a_leader_change_counts() -> None:
    try:
        try:
            raise kafka_errors.LeaderNotAvailableError()
        except kafka_errors.LeaderNotAvailableError as inner:
            raise ProduceError("out", 0, inner) from inner
    except ProduceError as outer:
        assert is_timeout(outer)


def test_a_transport_error_marked_retriable_counts_without_a_cause() -> None:
    error = TransportError("the coordinator moved")
    error.retriable = True
    assert is_timeout(error)


def test_there_is_one_classification() -> None:
    from streamloop.transport.kafka import is_retriable

    assert is_timeout is is_retriable


def test_a_transport_error_caused_by_a_timeout_counts() -> None:
    try:
        try:
            raise kafka_errors.KafkaTimeoutError()
        except kafka_errors.KafkaTimeoutError as inner:
            raise ProduceError("out", 0, inner) from inner
    except ProduceError as outer:
        assert is_timeout(outer)


@pytest.mark.parametrize("exc", [ValueError("x"), TransportError("broker says no"),
                                 StreamsTimeoutError("close took too long")], ids=repr)
def test_other_errors_are_not_timeouts(exc: BaseException) -> None:
    assert not is_timeout(exc)


def test_a_timeout_merely_seen_while_handling_another_error_does_not_count() -> None:
    try:
        try:
            raise TimeoutError()
        except TimeoutError:
            raise ValueError("a bug while handling it")  # noqa: B904 - the point of the test
    except ValueError as exc:
        assert not is_timeout(exc)


@pytest.mark.asyncio
async def test_start_up_steps_are_retried_on_retriable_errors_within_the_deadline() -> None:
    calls = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise kafka_errors.LeaderNotAvailableError()
        return "metadata"

    startup = StartupDeadline("t-1", 5_000, 1, 2, LOG)
    assert await startup.run(flaky, "Fetching metadata") == "metadata"
    assert len(calls) == 3


@pytest.mark.asyncio
async def test_start_up_gives_up_at_the_deadline_with_a_typed_error_naming_it() -> None:
    cause = kafka_errors.KafkaConnectionError("Unable to bootstrap")

    async def unreachable() -> None:
        raise TransportError("starting the admin client failed") from cause

    startup = StartupDeadline("app-StreamThread-2", 50, 1, 10, LOG)
    with pytest.raises(StartupTimeoutError) as raised:
        await startup.run(unreachable, "Starting the admin client")
    message = str(raised.value)
    assert "app-StreamThread-2" in message and "Starting the admin client" in message
    assert "50 ms" in message and "task.timeout.ms" in message
    assert raised.value.__cause__.__cause__ is cause  # type: ignore[union-attr]
    assert not isinstance(raised.value, TimeoutError)
    assert not is_timeout(raised.value)


@pytest.mark.asyncio
async def test_one_deadline_covers_every_start_up_step() -> None:
    clock = ManualClock()
    startup = StartupDeadline("t-1", 1_000, 100, 100, LOG, clock_s=lambda: clock.monotonic_ms() / 1000)

    async def slow_step() -> None:
        clock.advance(600)

    await startup.run(slow_step, "Starting the admin client")
    await startup.run(slow_step, "Starting the producer")

    async def unreachable() -> None:
        raise kafka_errors.NodeNotReadyError()

    with pytest.raises(StartupTimeoutError, match="Starting the consumer"):
        await startup.run(unreachable, "Starting the consumer")  # 1 200 ms passed: no retry left


@pytest.mark.asyncio
async def test_start_up_does_not_retry_other_errors() -> None:
    calls = []

    async def broken() -> None:
        calls.append(1)
        raise ValueError("not retriable")

    with pytest.raises(ValueError):
        await StartupDeadline("t-1", 5_000, 1, 10, LOG).run(broken, "Fetching metadata")
    assert len(calls) == 1
