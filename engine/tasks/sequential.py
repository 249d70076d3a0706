"""``SequentialLoop``: a task's records one at a time, in chunks: the hot path.

Each record goes the one per-record path (``RecordPath.process``); a record done or dropped by a
handler is passed (the position moves past it, stream time with it: ``RecordPath.passed``). A
chunk runs under the task's ``processing`` lock, so a commit flushes the record caches only
between records, and its output goes to the network together, one batch per partition.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

import anyio.lowlevel

from .processing import Outcome, RecordPath
from .retries import wait_for_retry

if TYPE_CHECKING:
    from streamloop.records import ConsumerRecord, TopicPartition

    from .task import StreamTask

# Records processed before the task yields to the loop's other coroutines.
CHUNK = 512

# Module constants: the hot path compares against them per record, and an Enum's class attribute
# lookup costs several times a global's.
_DONE, _SKIPPED, _ABANDONED, _RETRY = Outcome.DONE, Outcome.SKIPPED, Outcome.ABANDONED, Outcome.RETRY


class SequentialLoop:
    """A task's records one at a time, in chunks of up to ``CHUNK``. Caller: ``StreamTask``."""

    def __init__(self, task: StreamTask, skips: Mapping[TopicPartition, frozenset[int]] | None = None) -> None:
        self._task = task
        self._path = RecordPath(task, journal=True)
        # Offsets a previous owner with records in flight finished above its commit (its metadata
        # lists them): not run again, and listed in this task's commits until passed. Empty but
        # after such an owner, and emptied as they pass.
        self.listed: dict[tuple[str, int], set[int]] = {tp: set(offsets) for tp, offsets in (skips or {}).items()
                                                        if offsets}
        if any(source.timestamp_extractor is not None for source in task.graph.sources.values()):
            # The partition to take from is the one whose head has the lowest extracted timestamp.
            task.input.head_time = self._path.head_timestamp

    async def run(self) -> None:
        """Until the task closes: process what is buffered, or wait for records or a punctuation."""
        task = self._task
        caching = task.state_manager is not None and task.state_manager.caching
        while not task.closing:
            if task.buffered() == 0:
                task.clear_wakeup()
                await task.wait_for_wakeup()
                await task.punctuate_wall_clock()
                # Punctuations may have produced output; hand it on now, not at the next chunk.
                await task.flush_output()
                continue
            if (idle := task.input.ready(task.monotonic_ms())) > 0:
                # A partition is empty and behind (max.task.idle.ms): not processable until its
                # records arrive, it is caught up, or the idle time is over. Punctuations still run.
                task.clear_wakeup()
                await task.wait_for_wakeup(idle)
                await task.punctuate_wall_clock()
                await task.flush_output()
                continue
            async with task.processing:
                waiting = await self._chunk()
                if caching and task.flush_requested:
                    await task.flush_state()
            # Output of this chunk goes to the network together: one batch per partition.
            await task.flush_output()
            if waiting is not None:
                # A record answered RETRY heads its queue: the task waits out its back-off here,
                # outside the lock, so that a commit (of the records before it) can run meanwhile,
                # and so do the wall-clock punctuations due.
                await wait_for_retry(task, waiting, punctuate=True)
            await anyio.lowlevel.checkpoint()

    async def drain(self) -> None:
        """Every buffered record, chunk by chunk, while the task runs. Caller: the test driver."""
        task = self._task
        while task.buffered() and task.is_running and not task.closing:
            async with task.processing:
                waiting = await self._chunk()
            await task.flush_output()
            if waiting is not None:
                await wait_for_retry(task, waiting, punctuate=True)

    def _skipped(self, raw: ConsumerRecord) -> bool:
        """Whether ``raw`` is one a previous owner finished (then it is forgotten: it passes once)."""
        key = (raw.topic, raw.partition)
        offsets = self.listed.get(key)
        if offsets is None:
            return False
        listed = raw.offset in offsets
        offsets -= {o for o in offsets if o <= raw.offset}
        if not offsets:
            del self.listed[key]
        return listed

    def lowest_in_flight(self, _tp: object) -> int | None:
        return None  # a record is never in flight here: it is done before the next one starts

    def resumed(self, tp: TopicPartition, start: int, skipped: int | None) -> None:
        pass  # nothing is taken while the task is paused, nor left running by the record that paused it

    async def _chunk(self) -> ConsumerRecord | None:
        """Up to ``CHUNK`` records; returns the record answered RETRY that stopped it (it heads its
        queue and must wait out its back-off), else None."""
        task = self._task
        path = self._path
        process, passed = path.process, path.passed
        group = task.input
        queue = group.next_queue()
        single = len(group) == 1
        # Keyed by plain tuples: building a TopicPartition per record would cost more than the rest
        # of the bookkeeping (equal tuples hash and compare alike).
        next_offsets: dict[tuple[str, int], int] = task.positions.next  # type: ignore[assignment]  # TopicPartition is a (topic, partition) tuple
        done = 0
        # Taking ``processing`` may have waited (a commit held it), and a close may have come meanwhile.
        stop = task.closing
        # Records answered RETRY (empty but for a task that retries): the hot path tests it for truth.
        retries = task.timer.records
        waiting = retries.waiting
        skip = self.listed
        held: ConsumerRecord | None = None
        began = time.perf_counter_ns()
        while queue and done < CHUNK and not stop:
            raw = queue[0]
            if skip and self._skipped(raw):
                queue.popleft()
                next_offsets[(raw.topic, raw.partition)] = raw.offset + 1
                if not single:  # as after a record run: the next is the head with the lowest time
                    if not queue and group.ready(task.monotonic_ms()) > 0:
                        break
                    queue = group.next_queue()
                continue
            if waiting and retries.wait_ms(raw, task.monotonic_ms()) > 0:
                held = raw  # its back-off is not over (a task revived under exactly-once meets it here)
                break
            outcome = process(raw)
            if outcome is not _DONE and not isinstance(outcome, Outcome):
                outcome = await outcome
                if outcome is _ABANDONED:
                    return None
                # Only an await lets the loop's other coroutines run, so only then can a close
                # have been requested: the check costs the synchronous hot path nothing.
                stop = task.closing
            if outcome is not _DONE and outcome is not _SKIPPED:
                # PAUSED: nothing more runs; RETRY: the record stays at the head of its queue (a
                # handler's RETRY waits out its back-off once the chunk ends; a timeout's is over).
                held = raw if outcome is _RETRY else None
                break
            # Done or dropped by a handler: the position moves past it, stream time with it.
            queue.popleft()
            next_offsets[(raw.topic, raw.partition)] = raw.offset + 1
            done += 1
            if waiting:
                retries.forget(raw)
            # ``passed`` only when stream time moves (it does nothing otherwise): a call fewer per record.
            if task.record_time > group.stream_time:
                punctuating = passed(task.record_time)
                if punctuating is not None:
                    await punctuating
                    stop = task.closing
            if not single:
                # A queue run empty may make the task unprocessable (``PartitionGroup.ready``).
                if not queue and group.ready(task.monotonic_ms()) > 0:
                    break
                queue = group.next_queue()
        task.processed += done
        task.meter.add(done, time.perf_counter_ns() - began)
        await task.punctuate_wall_clock(locked=True)
        return held
