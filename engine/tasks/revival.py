"""``TaskRevival``: a thread's tasks started again from their last commit after output was lost.

Two failures leave a task's state and position ahead of what the broker holds, so the task
cannot go on from where it is: a producer timeout (at-least-once: the records it buffered are
lost, for every task of the thread since they share the producer) and a failed transaction
(exactly-once: one task's producer). Either way the tasks are closed dirty and created again,
each partition rewound to its last commit. A fenced transactional producer means another member
owns the task now: every task is closed dirty and the thread rejoins the group (Kafka Streams'
TaskMigratedException). Kept apart from ``TaskManager`` because it is a recovery policy on top
of the manager's open/close primitives: it decides when and from where tasks reopen, and how the
KIP-572 timers (``task.timeout.ms``) carry over so an outage still ends in ``TaskTimeoutError``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import anyio

from streamloop.ids import TaskId
from streamloop.records import TopicPartition
from streamloop.recovery import ProducerLost, Recovery, TaskCorrupted, TaskMigrated
from streamloop.transport.base import Consumer, OffsetAndMetadata

from .timeouts import TaskTimer, is_timeout

if TYPE_CHECKING:
    from streamloop.logcontext import LogContext

    from .manager import TaskManager


class TaskRevival:
    """Caller: the stream thread's poll loop (through ``TaskManager.revival``), between polls."""

    def __init__(
        self,
        manager: TaskManager,
        consumer: Consumer,
        logger: LogContext,
        monotonic_ms: Callable[[], int] | None,
        on_tasks_changed: Callable[[], None],
    ) -> None:
        self._manager = manager
        self._consumer = consumer
        self._log = logger
        self._monotonic_ms = monotonic_ms
        self._on_tasks_changed = on_tasks_changed
        # When _revive_all last reopened the tasks (monotonic ms): the start of their next produce attempt.
        self._revived_at_ms = 0

    async def recover(self, events: list[Recovery], replace_producer: Callable[[], Awaitable[None]],
                      timeout: float) -> None:  # noqa: ASYNC109
        """Act on what the thread's ``RecoveryInbox`` collected since the last poll (a shutdown request
        is the poll loop's to act on)."""
        failed = [e for e in events if isinstance(e, (TaskCorrupted, TaskMigrated))]
        if failed:
            await self._failed_transactions(failed, timeout)
        lost = next((e for e in events if isinstance(e, ProducerLost)), None)
        if lost is not None and not await self._revive_all(lost.cause, replace_producer, timeout):
            self._manager.recovery.report(lost)  # the broker is still out of reach: again after the next poll

    async def _failed_transactions(self, events: list[TaskCorrupted | TaskMigrated], timeout: float) -> None:  # noqa: ASYNC109
        """Exactly-once: revive corrupted tasks from their last commit; after a fence, close every task
        dirty and rejoin (Kafka Streams' TaskMigratedException)."""
        manager = self._manager
        # A task closed since it failed (revoked, revived by an earlier event) is not this one's to revive.
        current = [e for e in events if manager.tasks.get(e.task.id) is e.task]
        failed = list({id(e.task): e.task for e in current}.values())
        if not failed:
            return
        if any(isinstance(e, TaskMigrated) for e in current):
            self._log.warning("Producer of tasks %s fenced: closing every task dirty and rejoining the group",
                              [str(t.id) for t in failed])
            tasks = list(manager.tasks.values())
            await manager.close_tasks(tasks, clean=False, timeout=timeout)
            await self._hold_at_commit([tp for task in tasks for tp in task.partitions])
            self._consumer.request_rejoin()
            self._on_tasks_changed()
            return
        timers = {task.id: task.timer for task in failed}
        partitions = [tp for task in failed for tp in task.partitions]
        await manager.close_tasks(failed, clean=False, timeout=timeout)
        await self._reopen_from_commit(partitions, timers)
        self._log.warning("Revived tasks %s from their last commit: %s", [str(t.id) for t in failed],
                          "; ".join(str(e.error) for e in current))
        self._on_tasks_changed()

    async def _revive_all(self, cause: BaseException, replace_producer: Callable[[], Awaitable[None]],
                          timeout: float) -> bool:  # noqa: ASYNC109
        """After output was lost to a producer timeout: close every task dirty, take a new
        producer, rewind each partition to its last commit and start the tasks again. False when
        no new producer could be had yet (the broker is still away).

        The records since the last commit are processed again (at-least-once); each
        task keeps its KIP-572 timer, so an outage longer than ``task.timeout.ms``
        still ends in ``TaskTimeoutError``.
        """
        tasks = list(self._manager.tasks.values())
        timers = {task.id: task.timer for task in tasks}
        partitions = [tp for task in tasks for tp in task.partitions]
        for task in tasks:
            if not task.is_paused:
                # The failed produce started after the last revival: once that revival is past
                # task.timeout.ms, this was the final attempt (a sink topic that stays unknown, a
                # broker that keeps failing), and TaskTimeoutError ends the revivals.
                task.timer.on_timeout(cause, "Produce", self._revived_at_ms, cleared_by_processing=False)
        started = self._monotonic_ms() if self._monotonic_ms is not None else 0
        try:
            await replace_producer()
        except Exception as exc:
            if not is_timeout(exc):
                raise
            # The broker is still out of reach: charge the timers and try again on the next loop.
            backoff = max((t.timer.on_timeout(exc, "Starting a new producer", started, cleared_by_processing=False)
                           for t in tasks if not t.is_paused), default=0.1)
            await anyio.sleep(backoff)
            return False
        await self._manager.close_tasks(tasks, clean=False, timeout=timeout)
        self._revived_at_ms = started
        await self._reopen_from_commit(partitions, timers)
        self._log.warning("Revived tasks %s from their last commit after a producer timeout",
                          [str(t.id) for t in tasks])
        self._on_tasks_changed()
        return True

    async def _reopen_from_commit(self, partitions: list[TopicPartition], timers: dict[TaskId, TaskTimer]) -> None:
        """Rewind each partition to its last commit and create its tasks again, keeping their
        KIP-572 timers. Nothing committed yet: from the start (an offset no longer in the log is
        reset by auto.offset.reset)."""
        for tp in partitions:
            committed = await self._committed_of_reopened(tp, timers)
            self._consumer.seek(tp, committed.offset if committed is not None else 0)
        self._manager.handle_assignment(partitions, timers)

    async def _hold_at_commit(self, partitions: list[TopicPartition]) -> None:
        """Partitions whose tasks were closed dirty until the rejoin: rewound to their last commit and
        paused. A cooperative member keeps them through the rebalance, with their positions; the
        task created for one of them again starts from its commit (``handle_assignment`` resumes it)."""
        for tp in partitions:
            committed = await self._committed_of_reopened(tp, {})
            self._consumer.seek(tp, committed.offset if committed is not None else 0)
        self._consumer.pause(*partitions)

    async def _committed_of_reopened(self, tp: TopicPartition,
                                     timers: dict[TaskId, TaskTimer]) -> OffsetAndMetadata | None:
        """The committed offset of a partition being reopened. The broker may still be away (a task
        revived during an outage): retriable errors are retried under the reopened tasks' timers, so
        past task.timeout.ms this ends in ``TaskTimeoutError``, not in the transport's error."""
        clock = self._monotonic_ms or (lambda: int(time.monotonic() * 1000))
        while True:
            started = clock()
            try:
                return await self._consumer.committed(tp)
            except Exception as exc:
                if not is_timeout(exc) or not timers:
                    raise
                backoff = max(timer.on_timeout(exc, f"Reading the committed offset of {tp}", started,
                                               cleared_by_processing=False) for timer in timers.values())
                await anyio.sleep(backoff)
