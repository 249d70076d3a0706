"""``task.timeout.ms`` (KIP-572): a timeout sets one task aside instead of failing its thread.

A ``TaskTimer`` starts at a task's first timeout and is cleared by any progress.
While it runs, the task retries after a growing back-off and the thread's other
tasks go on. An attempt that *starts* after the deadline is the final one: if it
times out too, ``TaskTimeoutError`` goes to the uncaught-exception handler.
``task.timeout.ms = 0`` means no retry at all.

What counts as a timeout is every retriable client error (Kafka's ``RetriableException``
family, plus the builtin ``TimeoutError``): ``is_timeout`` is the transport's one
classification, :func:`streamloop.transport.retriable.is_retriable`. A leader change or a
coordinator move during a broker restart is retried here just like a request timeout;
the Java clients retry those inside a call and report a ``TimeoutException`` when
``delivery.timeout.ms`` / ``max.block.ms`` runs out, which Kafka Streams then retries
under ``task.timeout.ms`` the same way.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from streamloop.errors import StartupTimeoutError, TaskTimeoutError
from streamloop.ids import TaskId
from streamloop.logcontext import LogContext
from streamloop.transport.retriable import is_retriable

from .retries import RecordRetries, exponential_backoff_ms

# Re-exported under the name the task machinery reads; the one list of errors is the transport's.
is_timeout = is_retriable



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
        # The task's records answered RETRY: kept with the timer, so that a task revived under
        # exactly-once (which keeps its timer) goes on counting their attempts.
        self.records = RecordRetries()

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
        backoff = exponential_backoff_ms(self._backoff_ms, self._max_backoff_ms, self.retries)
        left = self.deadline_ms - now
        if left > 0:
            self._log.warning("%s timed out (%s); will retry in %d ms, %d ms left of task.timeout.ms",
                              what, _describe(cause), backoff, left)
        else:
            self._log.warning("%s timed out (%s); task.timeout.ms has passed, making a final attempt "
                              "in %d ms", what, _describe(cause), backoff)
        return backoff / 1000.0


T = TypeVar("T")


class StartupDeadline:
    """One deadline for a stream thread's whole start-up: starting its admin client, producer and
    consumer and checking its topics. There is no task yet to set aside, so each step is retried
    in place after a retriable error (growing back-off) until ``task.timeout.ms`` from the start
    has passed; then ``StartupTimeoutError`` (from the last error) goes to the uncaught-exception
    handler. Other errors are raised at once. ``task.timeout.ms = 0`` means no retry.

    Caller: the stream thread's loop, before its poll loop.
    """

    def __init__(self, thread: str, timeout_ms: int, backoff_ms: int, max_backoff_ms: int, log: LogContext,
                 clock_s: Callable[[], float] = time.monotonic) -> None:
        self._thread = thread
        self._timeout_ms = timeout_ms
        self._backoff_s = max(1, backoff_ms) / 1000
        self._max_backoff_s = max(self._backoff_s, max_backoff_ms / 1000)
        self._log = log
        self._clock_s = clock_s
        self._deadline_s = clock_s() + timeout_ms / 1000

    async def run(self, call: Callable[[], Awaitable[T]], what: str) -> T:
        """``call()``, retried after each retriable error until the deadline."""
        delay = self._backoff_s
        while True:
            try:
                return await call()
            except Exception as exc:
                if not is_retriable(exc):
                    raise
                left = self._deadline_s - self._clock_s()
                if left <= delay:
                    raise StartupTimeoutError(self._thread, what, self._timeout_ms) from exc
                self._log.warning("%s failed (%s); retrying in %.0f ms, %.0f ms left of task.timeout.ms",
                                  what, _describe(exc), delay * 1000, left * 1000)
                await anyio.sleep(delay)
                delay = min(self._max_backoff_s, delay * 2)


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
