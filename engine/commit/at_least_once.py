"""At-least-once: one commit for every task of the thread, after their output is acknowledged.

A commit takes the positions of fully processed records first, then waits for
the producer to have every output acknowledged, and only then commits those
positions. Output appended after the snapshot may be acknowledged too; it is
just not covered by this commit.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel

from streamloop.errors import CommitFailedError, ProduceError, RebalanceInProgressError
from streamloop.records import TopicPartition
from streamloop.recovery import ProducerLost
from streamloop.transport.base import OffsetAndMetadata
from streamloop.transport.retriable import is_retriable as is_timeout

from .protocol import CommitProtocol, CommitResult, CommitStatus

if TYPE_CHECKING:
    from streamloop.tasks.task import StreamTask


class AtLeastOnce(CommitProtocol):
    async def commit(self, tasks: Iterable[StreamTask]) -> CommitResult:
        """Flush output, then commit the processed positions of ``tasks``."""
        tasks = list(tasks)
        self._last_commit = self._clock_ms()
        for task in tasks:
            # State updates held in the record caches go down first, so that no offset is
            # committed without its updates on the changelog.
            await task.prepare_commit()
        offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        by_task: list[tuple[StreamTask, dict[TopicPartition, OffsetAndMetadata]]] = []
        for task in tasks:
            task_offsets = self.safe_offsets(task)
            if task_offsets:
                offsets.update(task_offsets)
                by_task.append((task, task_offsets))
        started = self._monotonic_ms()
        had_output = self._collector.buffered() > 0
        try:
            await self._collector.flush()
            if self.recovery.output_lost:
                # A task's own send lost output (reported there, so this flush found nothing of it
                # pending): the positions are past records without their output until the thread
                # revives every task from its last commit.
                return CommitResult(CommitStatus.TIMED_OUT)
            if not offsets:
                # Nothing processed since the last commit: only output delivered now is progress
                # (a task just revived after a failed produce has made none yet).
                for task in tasks:
                    task.mark_committed({})  # updates of no record (punctuations) go to disk
                    if had_output:
                        self.clear_commit_timer(task)
                await self.checkpoint_after_commit([t for t in tasks if self.checkpoint_behind(t)])
                return CommitResult(CommitStatus.COMMITTED)
            await self._consumer.commit(offsets)
        except RebalanceInProgressError as exc:
            # Cooperative: the tasks keep running through the rebalance; their offsets go with the
            # first commit after it (retried at the next poll, not at the next interval).
            self._log.debug("%s", exc)
            self._last_commit = self._clock_ms() - self._interval_ms
            return CommitResult(CommitStatus.DEFERRED)
        except CommitFailedError as exc:
            self._log.warning("Commit of %s refused: the group rebalanced; the tasks will be revoked (%s)",
                              sorted(str(tp) for tp in offsets), exc)
            return CommitResult(CommitStatus.REFUSED)
        except Exception as exc:
            if not is_timeout(exc):
                raise
            if isinstance(exc, ProduceError):
                # The output buffered before it is lost: every task starts again from its last commit.
                self.recovery.report(ProducerLost(exc))
            # One call covered every task: each one's timer starts (KIP-572); retry after the back-off.
            backoff = max((task.timer.on_timeout(exc, "Commit", started, cleared_by_processing=False)
                           for task in tasks if not task.is_paused), default=0.0)
            self._last_commit = self._clock_ms() - self._interval_ms + int(backoff * 1000)
            return CommitResult(CommitStatus.TIMED_OUT)
        committed = {task.id for task, _ in by_task}
        for task, task_offsets in by_task:
            self.finish(task, task_offsets)
            # Each task's stores write their batch on the loop: the other tasks' records run between.
            await anyio.lowlevel.checkpoint()
        for task in tasks:
            if task.id not in committed:
                task.mark_committed({})
                self.clear_commit_timer(task)
        self.commits += 1
        await self.checkpoint_after_commit(tasks)
        self._log.debug("Committed %s", {str(tp): om.offset for tp, om in offsets.items()})
        return CommitResult(CommitStatus.COMMITTED, len(offsets))


# The name the engine and its tests have always used for the at-least-once committer.
Committer = AtLeastOnce
