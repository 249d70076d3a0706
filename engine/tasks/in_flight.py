"""Several records of one task in flight at once (``num.threads.per.task`` > 1).

Each record runs on one of ``num.threads.per.task`` worker coroutines of the task's task group,
by the task's one per-record path (``RecordPath``), with its own forwarding state, output and
store journal (a ``ContextVar`` holds the record's ``RecordSlot``: ``streamloop.tasks.record_slots``),
so an ``async def`` processor waiting on I/O for one record does not hold up the next. The workers live as long as
the window: a record costs a hand-over through a memory stream, not a new task and cancel scope.

Ordering (``processing.ordering``):

- ``partition``: output leaves in input offset order. A record's output waits in its slot until
  every earlier record of its partition is done (a reorder buffer).
- ``key``: at most one record per key in flight, so each key's output is in order; different
  keys go in parallel and their output leaves as it is done.
- ``unordered``: records go in parallel and output leaves as it is done.

Records sharing a key, in a task with state stores: under every ordering, a record waits while one
of its key (the same key bytes, of any of the task's topics) is in flight, and under ``partition``
ordering its partition waits behind it (records are taken in offset order). A record's store updates
are undone by putting back what was there before it (a retry, a PAUSE below it), which is right only
while no later record wrote those keys since. Held in offset order (``partition`` ordering,
exactly-once), a done record may still be undone until it leaves the window, so its key stays busy
until then.

Passing records (the task's position, and stream time with it): commits never pass the lowest
offset still in flight, so a partition's committed position is its contiguous watermark, and a
record is *passed* when the watermark moves past it, in offset order. Stream time moves with the
passed records' timestamps (``RecordPath.passed``) and the stream-time punctuations due run then,
under every ordering. Offsets completed above the watermark are written into the commit metadata
(``streamloop.completed_offsets``), so a restarted task skips them instead of processing them again.

Exactly-once: a transaction must hold exactly the output of the offsets it commits. So every
record's output (sink records, changelog updates, dead letters) is held in its slot until the
watermark passes the record, under every ordering, and released with its position in one step
that a commit cannot split (the task's ``processing`` lock). A record released above one still to
run (taken ahead of it behind a busy key) is listed in the commit metadata, in the transaction that
holds its output, so a restart skips it. While a transaction commits
(the commit holds the lock for its round trips to the broker), records that complete are passed at
once and free their slots, and their output waits for the next transaction (``committing``): the
workers go on instead of each stopping at its first done record.

A record retried (after a timeout, or a processing handler's RETRY: then its slot waits out the
back-off, and under ``processing.ordering=key`` its key stays busy while the others go on) undoes
its own store updates first (its slot's journal), so they are applied once; its held output is
dropped, so under exactly-once the transaction never holds a failed attempt's output. A record
must write only store keys of its own key (records of different keys are in flight at once).

The window is bounded: at most ``num.threads.per.task`` slots exist per task (in flight or
waiting to be passed), so a stuck record stops new ones and, once the task's buffer fills,
fetching of its partitions (back-pressure).
"""

from __future__ import annotations

import bisect
import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from streamloop.completed_offsets import encode_completed
from streamloop.processors.context import CURRENT
from streamloop.records import ConsumerRecord, TopicPartition
from streamloop.stray_cancel import fail_stray

from .processing import Outcome, RecordPath
from .record_slots import HeldCollector, RecordJournals, RecordSlot
from .retries import wait_for_retry

if TYPE_CHECKING:
    from .task import StreamTask

ORDERINGS = ("partition", "key", "unordered")


class InFlightWindow:
    """The concurrent run loop of one task. Caller: ``StreamTask.run`` (``streamloop.tasks.loops``)."""

    def __init__(self, task: StreamTask, limit: int, ordering: str, collector: HeldCollector,
                 skips: Mapping[TopicPartition, frozenset[int]]) -> None:
        self._task = task
        self.limit = limit
        self.ordering = ordering
        self._collector = collector
        # Exactly-once: output is released only as the watermark passes its record (see the module's doc).
        self._in_order = ordering == "partition" or task.exactly_once
        self.slots: dict[TopicPartition, list[RecordSlot]] = {tp: [] for tp in task.partitions}
        self.count = 0  # slots alive: in flight or holding output
        # Keys with a record in flight: a record waits while one of its key is (``key`` ordering, and
        # in a task with stores under every ordering, see ``_exclusive``).
        self._busy_keys: set[bytes | None] = set()
        stateful = task.state_manager is not None
        self._exclusive = ordering == "key" or stateful
        # Held in offset order, a record's updates may be undone until it leaves the window (a PAUSE
        # below it): its key stays busy until then, not only until it is done.
        self._busy_until_passed = stateful and self._in_order
        # Done above the watermark (not in order): their offsets, for the commit metadata, and their
        # times, passed once the watermark moves past them.
        self._completed: dict[TopicPartition, dict[int, int]] = {tp: {} for tp in task.partitions}
        # Offsets a previous owner finished above its committed watermark: not redone.
        self._skip = {tp: set(skips.get(tp, ())) for tp in task.partitions}
        self._path = RecordPath(task, journal=True)
        # Exactly-once, while the task's transaction commits: records passed meanwhile, in offset
        # order, whose output and stream time wait for the next transaction (``committing``).
        self._committing = False
        self._held: list[RecordSlot] = []
        # In offset order, a done record above a PAUSE is void once the task pauses below it, and its
        # updates are undone with the other void ones, last first, once none of them is running; until
        # then (after a resume) its partition takes no record, so nothing read again runs before.
        journals = task.state_manager.journal if task.state_manager is not None else None
        if self._in_order and isinstance(journals, RecordJournals):
            journals.keep_ended = True
        self._settling: set[TopicPartition] = set()

    # -- what the task asks of its run loop ---------------------------------------------
    def metadata(self, tp: TopicPartition, watermark: int) -> str:
        return encode_completed(watermark, {o for o in self._completed[tp] if o >= watermark})

    @contextlib.contextmanager
    def committing(self) -> Iterator[None]:
        """Exactly-once: while the task's transaction commits (the commit holds the task's lock for
        its round trips to the broker), a record that completes is passed at once and frees its
        slot, so that the workers go on; its output and its stream time are held for the next
        transaction (``release_held``). The commit took its offsets before: it holds none of theirs."""
        self._committing = True
        try:
            yield
        finally:
            self._committing = False

    async def release_held(self) -> None:
        """What was passed while the transaction committed goes into the next one, in offset order.
        Caller: the commit, still holding the task's lock, once the transaction committed (a failed
        one closes the task dirty, and the held output with it)."""
        held, self._held = self._held, []
        for slot in held:
            await self._collector.emit(slot)
            await self._passed(slot.timestamp)

    def lowest_in_flight(self, tp: TopicPartition) -> int | None:
        """The lowest offset of ``tp`` in flight or holding output (None: none)."""
        slots = self.slots[tp]
        return slots[0].raw.offset if slots else None

    def resumed(self, tp: TopicPartition, start: int, skipped: int | None) -> None:
        if skipped is not None and skipped >= start:
            self._skip[tp].add(skipped)  # read again (records below it were dropped), but not run
        for slot in self.slots[tp]:
            if slot.raw.offset >= start:
                slot.stale = True
        # Done and in the commit metadata (their output left): finished, as for a restart, so the
        # partition read again skips them.
        self._skip[tp].update(offset for offset in self._completed[tp] if offset >= start)
        if self._in_order and not self._settle(tp):
            self._settling.add(tp)

    def _settle(self, tp: TopicPartition) -> bool:
        """Undo the void done records' updates, last first, once none is running; False: not yet."""
        slots = self.slots[tp]
        if any(not slot.done and self._void(slot) for slot in slots):
            return False
        for slot in reversed(slots):
            if slot._journal is not None and self._void(slot):
                slot._journal.undo()  # a no-op for one whose own attempt undid it
        return True

    async def drain(self) -> None:
        """Every buffered record, until none is in flight. Caller: the test driver."""
        await self._serve(until_idle=True)

    # -- the loop -------------------------------------------------------------------
    async def run(self) -> None:
        await self._serve(until_idle=False)

    async def _serve(self, until_idle: bool) -> None:
        task = self._task
        # Never more slots than ``limit`` exist, so the hand-over never has to wait for room.
        send, receive = anyio.create_memory_object_stream[RecordSlot](self.limit)
        async with anyio.create_task_group() as group:
            for _ in range(self.limit):
                group.start_soon(fail_stray, f"a record worker of task {task.id}", self._work, receive.clone())
            receive.close()
            with send:
                while not task.closing:
                    # Cleared before looking, so a wake-up that comes meanwhile is never lost.
                    task.clear_wakeup()
                    started = self._start_ready(send.send_nowait)
                    # Output released since the last turn goes on as one batch per partition, and
                    # partitions paused for back-pressure resume once the buffer drained.
                    await task.flush_output()
                    if until_idle and self.count == 0 and (not task.buffered() or task.pause_point is not None):
                        break
                    if not started:
                        await task.wait_for_wakeup()
                        await task.punctuate_wall_clock()
            # Closed: the workers finish the records handed over already, then end.
        await task.flush_output()

    async def _work(self, slots: MemoryObjectReceiveStream[RecordSlot]) -> None:
        """One worker: runs the records handed to it, one after the other, until the window ends.

        A worker done with a record takes the next ready one itself (``_take_ready``) while there
        is one, and waits on the hand-over only when there is none: with the buffer full, records
        then cost no hand-over at all (a memory stream's wait makes an event per item, which at 256
        in flight per task was a third of the stream thread's CPU)."""
        with slots:
            async for handed in slots:
                slot: RecordSlot | None = handed
                while slot is not None:
                    await self._process(slot)
                    slot = self._take_ready()

    def _start_ready(self, start: Callable[[RecordSlot], None]) -> bool:
        """Start as many buffered records as the window and the ordering allow."""
        started = False
        while (slot := self._take_ready()) is not None:
            start(slot)
            started = True
        return started

    def _take_ready(self) -> RecordSlot | None:
        """The next buffered record the window and the ordering allow, as a slot of the window
        (None: none may start now)."""
        task = self._task
        while self.count < self.limit and task.buffered() and not task.closing and task.pause_point is None:
            picked = self._pick()
            if picked is None:
                return None
            raw, tp = picked
            if raw.offset in self._skip[tp]:
                self._skip[tp].discard(raw.offset)
                if task.positions.advance_past(tp, raw.offset, self._bounds(tp), task.paused_offset(tp)) <= raw.offset:
                    # Still above the watermark: this owner's commits list it done too, or the next
                    # owner would run it again (without its time: a record skipped moves no stream time).
                    self._completed[tp][raw.offset] = -1
                continue
            slot = RecordSlot(raw, tp)
            # Kept in offset order: a key's later record may start before an earlier one of another key.
            bisect.insort(self.slots[tp], slot, key=_offset)
            self.count += 1
            if self._exclusive:
                self._busy_keys.add(raw.key)
            return slot
        return None

    def _pick(self) -> tuple[ConsumerRecord, TopicPartition] | None:
        group = self._task.input
        settling = self._settling
        for tp, queue in group.queues().items():
            if not queue or (settling and tp in settling):
                continue
            if not self._exclusive:
                return group.take(tp), tp
            if self.ordering == "partition":
                # Taken in offset order, so that output leaves in it: a busy key holds up its partition.
                if queue[0].key in self._busy_keys:
                    continue
                return group.take(tp), tp
            blocked: set[bytes | None] = set()
            for index, raw in enumerate(queue):
                if index >= 2 * self.limit:
                    break
                key = raw.key
                if key in self._busy_keys or key in blocked:
                    blocked.add(key)  # a later record of a busy key must wait behind it
                    continue
                return group.take(tp, index), tp
        return None

    async def _process(self, slot: RecordSlot) -> None:
        """One record's whole graph on its own coroutine, by the task's one per-record path."""
        task, path = self._task, self._path
        began = time.perf_counter_ns()
        if self._read_again(slot):
            # Handed over before a PAUSE below it (or a resume) and not begun: read again, not run now.
            slot.outputs.clear()
            await self._complete(slot)
            return
        token = CURRENT.set(slot)
        try:
            while True:
                outcome = path.process(slot.raw)
                if not isinstance(outcome, Outcome):
                    outcome = await outcome
                if outcome is not Outcome.RETRY:
                    break
                slot.outputs.clear()  # this attempt's output was never released: no duplicate
                # A handler's RETRY waits out its back-off in its slot: under processing.ordering=key
                # only its key waits (it stays busy), the task's other keys go on.
                await wait_for_retry(task, slot.raw)
                if task.closing:
                    return  # never completed: the commit stays below it, the next owner runs it
                if self._read_again(slot):
                    # A PAUSE below it or a resume came during the back-off: read again, not run now
                    # (a synchronous graph's attempt would end done, its store updates kept).
                    outcome = Outcome.PAUSED
                    slot.outputs.clear()
                    break
        finally:
            CURRENT.reset(token)
        retries = task.timer.records
        if retries.waiting:
            retries.forget(slot.raw)
        if outcome is Outcome.ABANDONED:
            return
        if outcome is not Outcome.PAUSED:
            task.processed += 1
        if outcome is Outcome.DONE:
            task.meter.add(1, time.perf_counter_ns() - began)
        # SKIPPED and PAUSED complete the slot too: its offset is passed in order (above a
        # pause, its output is dropped and the commit stops at the paused record).
        await self._complete(slot)

    def _read_again(self, slot: RecordSlot) -> bool:
        """Whether ``slot``'s record is read again on resume rather than run now: a PAUSE below it,
        or a resume since it was taken."""
        return slot.stale or self._task.paused_below(slot.raw)

    async def _complete(self, slot: RecordSlot) -> None:
        task, tp = self._task, slot.tp
        slot.done = True
        if self._exclusive and not self._busy_until_passed:
            self._busy_keys.discard(slot.raw.key)
        if self._in_order:
            if self._settling and tp in self._settling and self._settle(tp):
                self._settling.discard(tp)  # the last void record of the resumed partition is done
            if task.exactly_once and self._committing:
                self._pass_done_prefix_holding_output(tp)
            elif task.exactly_once:
                # Output and position go together: a commit (which holds the lock) sees both or neither.
                async with task.processing:
                    await self._release_done_prefix(tp)
            else:
                await self._release_done_prefix(tp)
        else:
            void = self._void(slot)
            if void:
                slot.outputs.clear()
            await self._collector.emit(slot)
            self.slots[tp].remove(slot)
            self.count -= 1
            completed = self._completed[tp]
            if not void:
                completed[slot.raw.offset] = slot.timestamp
            watermark = task.positions.advance_past(tp, -1 if slot.stale else slot.raw.offset, self._bounds(tp),
                                                    task.paused_offset(tp))
            # Passed in offset order, one by one, as one record at a time would pass them: a
            # stream-time punctuation fires at the same times.
            for offset in sorted(o for o in completed if o < watermark):
                await self._passed(completed.pop(offset))
        task.wake()

    async def _release_done_prefix(self, tp: TopicPartition) -> None:
        """Emit the output of the done records at the head of ``tp``, in offset order, and pass them."""
        while (head := self._pass_head(tp)) is not None:
            await self._collector.emit(head)
            await self._passed(head.timestamp)

    def _pass_done_prefix_holding_output(self, tp: TopicPartition) -> None:
        """``_release_done_prefix`` while the transaction commits: pass the done records at the head
        of ``tp`` and free their slots; their output and stream time wait (``committing``)."""
        while (head := self._pass_head(tp)) is not None:
            self._held.append(head)

    def _pass_head(self, tp: TopicPartition) -> RecordSlot | None:
        """Take the done record at the head of ``tp`` out of the window and move the position past
        it (None: the head is running, or void while void records above it still run). A void one's
        output is dropped once the void records' updates are undone (``_settle``); one released at or
        above a record the pause dropped (taken ahead of it under ``key`` ordering) is done though
        the position stays below it, so the commit metadata lists it and the resume skips it."""
        task, slots = self._task, self.slots[tp]
        if not slots or not slots[0].done:
            return None
        head = slots[0]
        cap = task.paused_offset(tp)
        void = self._void(head)
        if void:
            if not self._settle(tp):
                return None
            head.outputs.clear()
        slots.pop(0)
        self.count -= 1
        if self._busy_until_passed:
            self._busy_keys.discard(head.raw.key)
        watermark = task.positions.advance_past(tp, -1 if head.stale else head.raw.offset, self._bounds(tp), cap)
        completed = self._completed[tp]
        if not void and head.raw.offset >= watermark:
            # Released above a record still to run (taken ahead of it behind a busy key, or dropped by
            # a pause): the commit metadata lists it, so that a restart or the resume skips it.
            completed[head.raw.offset] = head.timestamp
        elif completed:
            for offset in [o for o in completed if o < watermark]:
                del completed[offset]  # its time passed when it was released
        return head

    def _void(self, slot: RecordSlot) -> bool:
        """Whether ``slot``'s output must not leave: it is read again on resume (at or after the
        record that paused the task), or was read again by a resume since it was taken."""
        point = self._task.pause_point
        return slot.stale or (point is not None and point.at[0] == slot.tp and slot.raw.offset >= point.at[1])

    async def _passed(self, timestamp: int) -> None:
        punctuating = self._path.passed(timestamp)
        if punctuating is not None:
            await punctuating

    def _bounds(self, tp: TopicPartition) -> list[int]:
        """What the watermark must not pass: the lowest record in flight and the first one buffered."""
        lowest = self.lowest_in_flight(tp)
        first = self._task.input.first_offset(tp)
        return [b for b in (lowest, first) if b is not None]


def _offset(slot: RecordSlot) -> int:
    return slot.raw.offset
