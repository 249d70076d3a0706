"""The commit protocol: when a stream thread commits, and the steps every commit takes.

A commit, whatever the guarantee:

1. **what is safe to commit**: each task's positions of *finished* records
   (``StreamTask.offsets_to_commit``), taken between two records, after the task's
   record caches sent their updates down (no offset is committed without its state
   updates on the changelog);
2. **flush**: the output of those records is acknowledged (or, exactly-once, sent
   into the open transaction);
3. **send the offsets**: to the group (at-least-once: ``Consumer.commit``), or into
   the transaction, which then commits (exactly-once: ``commit_transaction``);
4. **finish**: each task learns what was committed (``mark_committed``: its persistent
   stores write the updates the commit covers to disk) and the KIP-572 timers of commit
   and produce timeouts stop;
5. **checkpoint**: the changelogs' ends are read, and each task's checkpoint moves to the
   newest end its disk is known to hold (``checkpoint``), so a crash restores only the tail.

``AtLeastOnce`` (``at_least_once.py``) and ``ExactlyOnce`` (``exactly_once.py``) are
the two implementations. The protocol reads tasks only through what they expose.

A commit answers one way, a ``CommitResult``: committed (how many partitions; none when there was
nothing to commit), deferred (the group is rebalancing: retried at the next poll), timed out
(retried after the back-off, under the tasks' ``task.timeout.ms``) or refused (the group moved
the partitions on). What needs recovery beyond the commit (output lost to a producer timeout, a
task's transaction that cannot commit) goes to the thread's ``RecoveryInbox``; a failure of the
engine itself (a processor failing in a cache flush, ``TaskTimeoutError``) is raised.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from streamloop.collector import RecordCollector
from streamloop.logcontext import LogContext
from streamloop.records import TopicPartition
from streamloop.recovery import RecoveryInbox
from streamloop.transport.base import Consumer, OffsetAndMetadata

if TYPE_CHECKING:
    from streamloop.tasks.task import StreamTask


class CommitStatus(Enum):
    COMMITTED = "committed"
    """Everything the tasks finished is committed (``partitions``: how many moved; 0: none had to)."""
    DEFERRED = "deferred"
    """The group is rebalancing (cooperative): nothing was sent; retried at the next poll."""
    TIMED_OUT = "timed out"
    """Not committed; retried after the back-off, under the tasks' ``task.timeout.ms``."""
    REFUSED = "refused"
    """The group moved the partitions on: not committed, and never will be by this member."""


@dataclass(frozen=True, slots=True)
class CommitResult:
    status: CommitStatus
    partitions: int = 0

    @property
    def done(self) -> bool:
        """Whether the tasks' finished positions are committed (a task closes cleanly only then)."""
        return self.status is CommitStatus.COMMITTED


NOT_DUE = CommitResult(CommitStatus.COMMITTED)


class CommitProtocol(ABC):
    """Caller: the task manager (at its interval, on a processor's request, when closing tasks)."""

    def __init__(
        self,
        consumer: Consumer,
        collector: RecordCollector,
        interval_ms: int,
        clock_ms: Callable[[], int],
        logger: LogContext,
        recovery: RecoveryInbox | None = None,
    ) -> None:
        self._monotonic_ms = clock_ms
        # Where a commit reports what the thread must recover from (output lost, a failed transaction).
        self.recovery = recovery if recovery is not None else RecoveryInbox()  # an empty inbox is falsy
        self._consumer = consumer
        self._collector = collector
        self._interval_ms = interval_ms
        self._clock_ms = clock_ms
        self._log = logger
        self._last_commit = clock_ms()
        self.commits = 0

    # -- when --------------------------------------------------------------------------
    def due(self, tasks: Iterable[StreamTask]) -> bool:
        if self._clock_ms() - self._last_commit >= self._interval_ms:
            return True
        return any(t.commit_needed() for t in tasks)

    async def maybe_commit(self, tasks: Iterable[StreamTask]) -> CommitResult:
        """Commit if the interval passed or a processor asked."""
        tasks = list(tasks)
        if not self.due(tasks):
            return NOT_DUE
        return await self.commit(tasks)

    # -- the commit --------------------------------------------------------------------
    @abstractmethod
    async def commit(self, tasks: Iterable[StreamTask]) -> CommitResult:
        """Commit what ``tasks`` finished."""

    @staticmethod
    def safe_offsets(task: StreamTask) -> dict[TopicPartition, OffsetAndMetadata]:
        """Step 1, once the task's caches are flushed and no record of it is running."""
        return task.offsets_to_commit()

    @staticmethod
    def finish(task: StreamTask, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        """Step 4: the task's positions are committed; the timeouts of commits and produces are over."""
        task.mark_committed(offsets)
        CommitProtocol.clear_commit_timer(task)

    @staticmethod
    def clear_commit_timer(task: StreamTask) -> None:
        """Output acknowledged (and offsets committed): a timer started by a commit or a produce stops."""
        if task.timer.running and not task.timer.cleared_by_processing:
            task.timer.clear()

    # -- after a commit --------------------------------------------------------------------
    async def checkpoint(self, tasks: Iterable[StreamTask]) -> None:
        """Step 5: move the checkpoint files of tasks with persistent stores (after their commit)
        to the offset after each changelog's last record their producer had acknowledged, as Kafka
        Streams does (its record collector's offsets).

        Not to an end offset read from the broker: under exactly-once the broker writes a
        transaction's markers after the commit returns, so the last stable offset read at once
        can lag the transaction just committed, and a read that lagged or failed was not made
        again while the task stayed idle (its checkpoint stayed behind for good)."""
        chosen = []
        # Nothing awaits until every store's checkpoint is chosen: every write the stores hold now
        # had its changelog record appended before these offsets, or has it acknowledged later.
        for task in tasks:
            manager = task.state_manager
            if manager is None or not manager.persistent or not manager.changelogs or task.closed:
                continue
            # Exactly-once: the task's own producer; at-least-once: the thread's.
            collector = task.collector or self._collector
            offsets = manager.checkpoint_commit(collector.producer.acked_ends())
            if offsets is not None:
                chosen.append((manager, offsets))
        for manager, offsets in chosen:
            await manager.write_checkpoint_file(offsets)

    @staticmethod
    def checkpoint_behind(task: StreamTask) -> bool:
        """Whether a commit with nothing to commit for ``task`` should still move its checkpoint: one
        that lagged behind a busy commit catches up once the task is idle."""
        return task.state_manager is not None and task.state_manager.checkpoint_behind

    async def checkpoint_after_commit(self, tasks: Iterable[StreamTask]) -> None:
        """``checkpoint`` after a commit while the tasks run: a checkpoint file that cannot be
        written stays where it is (still right, only older), never fails the commit."""
        try:
            await self.checkpoint(tasks)
        except OSError as exc:  # the disk; nothing else here can fail
            self._log.warning("Checkpoints not moved after the commit: %r", exc)
