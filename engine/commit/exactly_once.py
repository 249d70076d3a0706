"""Exactly-once (``processing.guarantee = exactly_once_v2``): one transaction per task and commit.

Each task has its own transactional producer and record collector. Its output,
its changelog writes, its dead letters and its input offsets (sent with
``send_offsets_to_transaction`` for the application's group) go into one
transaction, committed at every commit interval: they become visible to
``read_committed`` readers together or not at all.

Why one producer per task (Kafka Streams' first exactly-once design) and not one
per thread: aiokafka (0.12-0.14) sends ``TxnOffsetCommit`` v0, which carries no
generation and no member id, so the group coordinator cannot refuse the offsets
of a member that was kicked out of the group (KIP-447's fencing). The only fence
left is the ``transactional.id``: the new owner of a task initialises the same
id (``<application.id>-<task id>``), which bumps the producer epoch, aborts the
old owner's open transaction and makes every later write of the old owner (a
zombie) fail with ``ProducerFencedError``. With one id per thread a zombie's
tasks would move to a thread with a different id and nothing would stop the
zombie committing them a second time. The cost: a producer (and its
connections) per task, and a commit is one small transaction per task with
progress (committed concurrently).

Failures, as in Kafka Streams:

- a timeout while processing, or a failed send or commit (``TaskCorruptedError``):
  the task's transaction is aborted, the task is closed dirty, its local state
  is wiped and it is revived from its last commit (restoring from the changelog,
  read ``read_committed``). Its KIP-572 timer is kept, so an outage longer than
  ``task.timeout.ms`` still ends in ``TaskTimeoutError``.
- a fenced producer (``TaskMigratedError``): every task of the thread is closed
  dirty and the thread rejoins the group.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import TYPE_CHECKING

import anyio

from streamloop.errors import ProducerFencedError, TaskCorruptedError, TaskMigratedError, TransportError
from streamloop.stray_cancel import fail_stray
from streamloop.transport.base import TransactionalProducer
from streamloop.transport.retriable import is_retriable as is_timeout

from .protocol import CommitProtocol, CommitResult, CommitStatus

if TYPE_CHECKING:
    from streamloop.ids import TaskId
    from streamloop.tasks.task import StreamTask


# Kafka Streams' producer default under exactly-once: the broker aborts a transaction left open this
# long (a crashed instance's) even if no new owner initialises its transactional.id.
EOS_TRANSACTION_TIMEOUT_MS = 10_000


def transactional_id(application_id: str, task_id: TaskId) -> str:
    """Stable per task across instances and restarts: the new owner of a task fences the old one."""
    return f"{application_id}-{task_id}"


class ExactlyOnce(CommitProtocol):
    """Commits each task's transaction with its offsets; a task that cannot commit is marked for revival.

    A task's commit runs between two of its records (holding ``task.processing``):
    a half-processed record's output must never be committed without its offset.
    """

    group_id: str = ""

    async def commit(self, tasks: Iterable[StreamTask]) -> CommitResult:
        tasks = [t for t in tasks if t.transaction_error is None]
        self._last_commit = self._clock_ms()
        results: dict[TaskId, int | Exception] = {}

        async def commit_one(task: StreamTask) -> None:
            # Every task's outcome is kept (none cancels the others), as each decides its own revival.
            try:
                results[task.id] = await self._commit_task(task)
            except Exception as exc:  # classified below, once every task is done
                results[task.id] = exc

        async with anyio.create_task_group() as group:
            for task in tasks:
                group.start_soon(fail_stray, f"the commit of task {task.id}", commit_one, task)
        committed = 0
        checkpointed = []
        for task in tasks:
            result = results[task.id]
            if isinstance(result, Exception):
                if not isinstance(result, (ProducerFencedError, TransportError)) and not is_timeout(result):
                    raise result  # a processor failing in a cache flush, a TaskTimeoutError: the thread fails
                self._failed(task, result)
            else:
                committed += result
                if result or self.checkpoint_behind(task):
                    checkpointed.append(task)
        if committed:
            self.commits += 1
        if checkpointed:
            await self.checkpoint_after_commit(checkpointed)
        # A task that could not commit reported itself for revival (its transaction_error makes it
        # close dirty); the others committed.
        return CommitResult(CommitStatus.COMMITTED, committed)

    async def _commit_task(self, task: StreamTask) -> int:
        collector = task.collector
        if collector is None:
            return 0
        producer: TransactionalProducer = collector.producer  # type: ignore[assignment]  # an exactly-once task has one
        async with task.processing:
            if task.transaction_error is not None or task.closed:
                return 0
            if task.state_manager is not None and task.state_manager.caching:
                await task.flush_state()
            offsets = self.safe_offsets(task)
            if not offsets and not producer.in_transaction and not collector.buffered():
                return 0
            started = self._monotonic_ms()
            # Records in flight that pass while the transaction commits hold their output for the
            # next one (``InFlightWindow.committing``) instead of waiting for this lock.
            committing = getattr(task.loop, "committing", None)
            try:
                with committing() if committing is not None else contextlib.nullcontext():
                    # Flush, send the offsets and commit: one call, inside the task's transaction.
                    await producer.commit_transaction(offsets, self.group_id)
            except Exception as exc:
                if is_timeout(exc) and not task.is_paused:
                    # Charged like any timeout; past task.timeout.ms this raises TaskTimeoutError.
                    task.timer.on_timeout(exc, "Commit", started, cleared_by_processing=False)
                raise
            self.finish(task, offsets)
            if committing is not None:
                await task.loop.release_held()  # type: ignore[union-attr]  # the window that has ``committing``
        self._log.debug("Committed the transaction of task %s: %s", task.id,
                        {str(tp): om.offset for tp, om in offsets.items()})
        return len(offsets)

    def _failed(self, task: StreamTask, exc: BaseException) -> None:
        error: TaskCorruptedError | TaskMigratedError
        if isinstance(exc, ProducerFencedError):
            error = TaskMigratedError(task.id, f"its producer was fenced while committing: {exc}")
        else:
            error = TaskCorruptedError(task.id, f"committing its transaction failed: {exc}")
        error.__cause__ = exc
        self._log.warning("Task %s could not commit its transaction: %s", task.id, exc)
        task.transaction_failed(error)


# The name the stream thread has always used for the exactly-once committer.
TransactionalCommitter = ExactlyOnce
