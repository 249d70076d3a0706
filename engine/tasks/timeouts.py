"""``task.timeout.ms`` (KIP-572): a timeout sets one task aside instead of failing its thread.

A ``TaskTimer`` starts at a task's first timeout and is cleared by any progress.
While it runs, the task retries after a growing back-off and the thread's other
tasks go on. An attempt that *starts* after the deadline is the final one: if it
times out too, ``TaskTimeoutError`` goes to the uncaught-exception handler.
``task.timeout.ms = 0`` means no retry at all.

Timeouts are: the builtin ``TimeoutError`` (so ``asyncio`` timeouts too),
aiokafka's ``KafkaTimeoutError``, ``RequestTimedOutError``, ``NodeNotReadyError``,
``KafkaConnectionError`` and ``UnknownTopicOrPartitionError`` (a metadata wait that
ran out), and a ``TransportError`` caused by any of them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiokafka import errors as kafka_errors

from engine.errors import StreamsTimeoutError, TaskTimeoutError
from engine.logcontext import LogContext

from .task_id import TaskId

_CLIENT_TIMEOUTS: tuple[type[BaseException], ...] = (
    TimeoutError,
    kafka_errors.KafkaTimeoutError,
    kafka_errors.RequestTimedOutError,
    kafka_errors.NodeNotReadyError,
    kafka_errors.KafkaConnectionError,
    # aiokafka's producer reports "no metadata for the topic within request.timeout.ms" so;
    # the Java producer raises a TimeoutException for the same wait (max.block.ms).
    kafka_errors.UnknownTopicOrPartitionError,
)


def is_timeout(exc: BaseException) -> bool:
    """Whether ``exc``, or an error it was raised from, is a client timeout.

    Our own ``StreamsTimeoutError`` (a client call such as ``close`` ran out of
    time) and ``TaskTimeoutError`` (the end of the retries) are not.
    """
    current: BaseException | None = exc
    for _ in range(6):
        if current is None:
            return False
        if isinstance(current, (StreamsTimeoutError, TaskTimeoutError)):
            return False
        if isinstance(current, _CLIENT_TIMEOUTS):
            return True
        current = current.__cause__
    return False


class TaskTimer:
    """One task's KIP-572 deadline. Caller: the task's coroutine and the committer."""

    def __init__(
        self,
        task_id: TaskId,
        timeout_ms: int,
        backoff_ms: int,
        max_backoff_ms: int,
        clock_ms: Callable[[], int],
        log: LogContext,
    ) -> None:
        self.task_id = task_id
        self._timeout_ms = timeout_ms
        self._backoff_ms = max(1, backoff_ms)
        self._max_backoff_ms = max(self._backoff_ms, max_backoff_ms)
        self._clock_ms = clock_ms
        self._log = log
        self.deadline_ms: int | None = None
        self.retries = 0
        # A timeout of a commit or a produce is over only when a commit succeeds; one of
        # the task's own processing is over when a record gets through.
        self.cleared_by_processing = True

    @property
    def running(self) -> bool:
        return self.deadline_ms is not None

    def clear(self) -> None:
        """The task made progress: the timer stops (cheap when it is not running)."""
        if self.deadline_ms is not None:
            self._log.info("Made progress after %d retries; the task timeout is cleared", self.retries)
            self.deadline_ms = None
            self.retries = 0

    def on_timeout(self, cause: BaseException, what: str, attempt_started_ms: int,
                   *, cleared_by_processing: bool = True) -> float:
        """Record a timeout of ``what``; returns the back-off in seconds before the retry.

        Raises ``TaskTimeoutError`` (from ``cause``) when ``task.timeout.ms`` is 0 or
        when the attempt that timed out started after the deadline.
        """
        now = self._clock_ms()
        if self._timeout_ms == 0:
            raise TaskTimeoutError(self.task_id, 0, what) from cause
        if self.deadline_ms is None:
            self.deadline_ms = now + self._timeout_ms
            self.cleared_by_processing = cleared_by_processing
        elif attempt_started_ms >= self.deadline_ms:
            raise TaskTimeoutError(self.task_id, self._timeout_ms, what) from cause
        self.cleared_by_processing = self.cleared_by_processing and cleared_by_processing
        self.retries += 1
        backoff = min(self._max_backoff_ms, self._backoff_ms * 2 ** (self.retries - 1))
        left = self.deadline_ms - now
        if left > 0:
            self._log.warning("%s timed out (%s); will retry in %d ms, %d ms left of task.timeout.ms",
                              what, _describe(cause), backoff, left)
        else:
            self._log.warning("%s timed out (%s); task.timeout.ms has passed, making a final attempt "
                              "in %d ms", what, _describe(cause), backoff)
        return backoff / 1000.0


T = TypeVar("T")


async def retry_on_timeout(
    call: Callable[[], Awaitable[T]], what: str, budget_s: float, backoff_s: float, max_backoff_s: float,
    log: LogContext,
) -> T:
    """Run ``call`` again after each client timeout until ``budget_s`` is used up (start-up
    metadata calls: there is no task yet to set aside). The last timeout is raised as is."""
    deadline = time.monotonic() + budget_s
    delay = max(backoff_s, 0.001)
    while True:
        try:
            return await call()
        except Exception as exc:
            if not is_timeout(exc) or time.monotonic() + delay >= deadline:
                raise
            log.warning("%s timed out (%s); retrying in %.0f ms", what, _describe(exc), delay * 1000)
            await asyncio.sleep(delay)
            delay = min(max_backoff_s, delay * 2)


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
