"""RETRY, a processing handler's answer: a task's records waiting to run again, and until when.

A handler that answers ``RETRY`` about a record asks for it to run again, from its source, after
a back-off (``processing.retry.backoff.ms`` doubled per attempt, ±20 % jitter, at most
``processing.retry.backoff.max.ms``: ``exponential_backoff_ms``, the engine's one back-off rule).
The record is not passed meanwhile: its partition's position stays at it, so no commit goes past
it, and its store updates of the failed attempt are undone (its journal), so they apply once.
Once ``processing.retry.max.attempts`` attempts ran, ``processing.retry.exhausted.answer`` applies
instead of another RETRY (the handler is asked every time, with the attempt in ``ErrorContext``).

Who waits is the run loop's to decide, and never by blocking the event loop:

- one record at a time (``SequentialLoop``): the task waits, outside its ``processing`` lock (a
  commit can run meanwhile; it commits the records before the waiting one);
- records in flight (``InFlightWindow``): the record's own slot waits; under
  ``processing.ordering=key`` only its key does, the task's other keys go on.

The waiting records live with the task's KIP-572 timer (``TaskTimer.records``), which a task revived
under exactly-once keeps: there a retry of a record whose output went into the open transaction
aborts the transaction instead (as a timeout does), and the revived task goes on counting.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from streamloop.handlers.responses import Answer
from streamloop.records import ConsumerRecord

if TYPE_CHECKING:
    from .task import StreamTask

# Kafka's clients jitter their retry back-off by ±20 % (CommonClientConfigs.RETRY_BACKOFF_JITTER):
# records retried together spread out instead of hitting a recovering service at once.
JITTER = 0.2

RecordKey = tuple[str, int, int]


def exponential_backoff_ms(base_ms: int, max_ms: int, attempt: int, jitter: float = 0.0,
                           uniform: Callable[[float, float], float] = random.uniform) -> int:
    """The back-off before retry number ``attempt`` (1: the first): ``base_ms`` doubled per retry,
    times a random factor in ``1 ± jitter``, at most ``max_ms`` (Kafka's ``ExponentialBackoff``).
    The one back-off rule of the engine: KIP-572 timeouts (no jitter) and RETRY answers use it."""
    doubling: int = 2 ** min(max(0, attempt - 1), 62)  # int ** int is Any to mypy (a negative power is a float)
    term = base_ms * doubling
    if jitter > 0.0:
        term = int(term * uniform(1.0 - jitter, 1.0 + jitter))
    return max(1, min(max_ms, term))


@dataclass(frozen=True)
class RetryPolicy:
    """The ``processing.retry.*`` settings. Caller: ``ErrorHandling`` (one per stream thread)."""

    backoff_ms: int = 100
    max_backoff_ms: int = 10_000
    max_attempts: int = 5
    exhausted: Answer = Answer.FAIL
    uniform: Callable[[float, float], float] = field(default=random.uniform, compare=False)

    def delay_ms(self, attempt: int) -> int:
        """The back-off after failed attempt ``attempt`` (1: the record's first run)."""
        return exponential_backoff_ms(self.backoff_ms, self.max_backoff_ms, attempt, JITTER, self.uniform)


def key_of(raw: ConsumerRecord) -> RecordKey:
    return (raw.topic, raw.partition, raw.offset)


class RecordRetries:
    """One task's records answered RETRY: attempts that failed so far, and the monotonic ms before
    which each must not run again. ``waiting`` is empty for a task that retries nothing, which is
    all the hot path looks at."""

    __slots__ = ("waiting",)

    def __init__(self) -> None:
        self.waiting: dict[RecordKey, tuple[int, int]] = {}

    def failed_attempts(self, raw: ConsumerRecord) -> int:
        entry = self.waiting.get(key_of(raw))
        return 0 if entry is None else entry[0]

    def schedule(self, raw: ConsumerRecord, attempts: int, not_before_ms: int) -> None:
        self.waiting[key_of(raw)] = (attempts, not_before_ms)

    def forget(self, raw: ConsumerRecord) -> None:
        """``raw`` got an answer other than RETRY, or went through."""
        self.waiting.pop(key_of(raw), None)

    def wait_ms(self, raw: ConsumerRecord, now_ms: int) -> int:
        """How long ``raw`` must still wait before it runs again (0: it may run)."""
        entry = self.waiting.get(key_of(raw))
        return 0 if entry is None else max(0, entry[1] - now_ms)


async def wait_for_retry(task: StreamTask, raw: ConsumerRecord, punctuate: bool = False) -> None:
    """``raw``, answered RETRY, waits out what is left of its back-off (nothing when it has none):
    the caller (the whole task one record at a time, or the record's slot in flight) waits, the
    thread's other tasks and the loop go on, and a close ends the wait. ``punctuate``: the
    wall-clock punctuations due meanwhile run (the caller is the task's only coroutine)."""
    records = task.timer.records
    schedules = task.context.wall_clock_schedules
    while not task.closing:
        wait_ms = records.wait_ms(raw, task.monotonic_ms())
        if wait_ms <= 0:
            return
        due = schedules.next_due() if punctuate else None
        if due is not None:
            wait_ms = min(wait_ms, max(0, due - task.clock_ms()))
        await task.set_aside(wait_ms / 1000.0)
        if punctuate:
            await task.punctuate_wall_clock()
