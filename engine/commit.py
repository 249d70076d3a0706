"""``Committer``: when a stream thread commits, and the at-least-once order of a commit.

A commit takes the positions of fully processed records first, then waits for
the producer to have every output acknowledged, and only then commits those
positions. Output appended after the snapshot may be acknowledged too; it is
just not covered by this commit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from engine.collector import RecordCollector
from engine.errors import CommitFailedError, ProduceError
from engine.logcontext import LogContext
from engine.records import TopicPartition
from engine.tasks.timeouts import is_timeout
from engine.transport.base import Consumer, OffsetAndMetadata

if TYPE_CHECKING:
    from engine.tasks.task import StreamTask


class Committer:
    def __init__(
        self,
        consumer: Consumer,
        collector: RecordCollector,
        interval_ms: int,
        clock_ms: Callable[[], int],
        logger: LogContext,
    ) -> None:
        self._monotonic_ms = clock_ms
        self._consumer = consumer
        self._collector = collector
        self._interval_ms = interval_ms
        self._clock_ms = clock_ms
        self._log = logger
        self._last_commit = clock_ms()
        self.commits = 0
        # Set when the last commit timed out (and will be retried): a closing task is then dirty.
        self.timed_out = False
        # Set when output was lost to a producer timeout: the thread must revive its tasks.
        self.producer_failed: BaseException | None = None

    def due(self, tasks: Iterable[StreamTask]) -> bool:
        if self._clock_ms() - self._last_commit >= self._interval_ms:
            return True
        return any(t.commit_needed() for t in tasks)

    async def maybe_commit(self, tasks: Iterable[StreamTask]) -> int:
        """Commit if the interval passed or a processor asked; returns partitions committed."""
        tasks = list(tasks)
        if not self.due(tasks):
            return 0
        return await self.commit(tasks)

    async def commit(self, tasks: Iterable[StreamTask]) -> int:
        """Flush output, then commit the processed positions of ``tasks``.

        Raises ``CommitFailedError`` when the group has moved the partitions on.
        """
        tasks = list(tasks)
        self._last_commit = self._clock_ms()
        self.timed_out = False
        for task in tasks:
            # State updates held in the record caches go down first, so that no offset is
            # committed without its updates on the changelog.
            await task.prepare_commit()
        offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        by_task: list[tuple[StreamTask, dict[TopicPartition, OffsetAndMetadata]]] = []
        for task in tasks:
            task_offsets = task.committable_offsets()
            task.context.commit_requested = False
            if task_offsets:
                offsets.update(task_offsets)
                by_task.append((task, task_offsets))
        started = self._monotonic_ms()
        had_output = self._collector.buffered() > 0
        try:
            await self._collector.flush()
            if not offsets:
                # Nothing processed since the last commit: only output delivered now is progress
                # (a task just revived after a failed produce has made none yet).
                if had_output:
                    self._clear_commit_timers(tasks)
                return 0
            await self._consumer.commit(offsets)
        except CommitFailedError:
            self._log.warning("Commit of %s failed: the group rebalanced; the tasks will be revoked",
                              sorted(str(tp) for tp in offsets))
            raise
        except Exception as exc:
            if not is_timeout(exc):
                raise
            self.timed_out = True
            if isinstance(exc, ProduceError):
                self.producer_failed = exc
            # One call covered every task: each one's timer starts (KIP-572); retry after the back-off.
            backoff = max((task.timer.on_timeout(exc, "Commit", started, cleared_by_processing=False)
                           for task in tasks if not task.is_paused), default=0.0)
            self._last_commit = self._clock_ms() - self._interval_ms + int(backoff * 1000)
            return 0
        for task, task_offsets in by_task:
            task.mark_committed(task_offsets)
        self._clear_commit_timers(tasks)
        self.commits += 1
        self._log.debug("Committed %s", {str(tp): om.offset for tp, om in offsets.items()})
        return len(offsets)

    async def checkpoint(self, tasks: Iterable[StreamTask]) -> None:
        """Write the checkpoint files of tasks with persistent stores (after their commit)."""
        managers = [t.state_manager for t in tasks if t.state_manager is not None and t.state_manager.persistent
                    and t.state_manager.changelogs]
        if not managers:
            return
        partitions = [tp for m in managers for tp in m.changelogs.values()]
        ends = await self._consumer.end_offsets(partitions)
        for manager in managers:
            await manager.write_checkpoint(ends)

    @staticmethod
    def _clear_commit_timers(tasks: list[StreamTask]) -> None:
        """Output acknowledged (and offsets committed): timeouts of commits and produces are over."""
        for task in tasks:
            if task.timer.running and not task.timer.cleared_by_processing:
                task.timer.clear()
