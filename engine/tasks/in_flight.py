"""Several records of one task in flight at once (``num.threads.per.task`` > 1).

Each record runs on one of ``num.threads.per.task`` worker coroutines of the
task's task group, with its own forwarding state (a ``ContextVar`` holds the
record's ``RecordSlot``), so an ``async def`` processor waiting on I/O for one
record does not hold up the next. The workers live as long as the window: a
record costs a hand-over through a memory stream, not a new task and cancel scope.

Ordering (``processing.ordering``):

- ``partition``: output leaves in input offset order. A record's output waits in
  its slot until every earlier record of its partition is done (a reorder buffer).
- ``key``: at most one record per key in flight, so each key's output is in
  order; different keys go in parallel and their output leaves as it is done.
- ``unordered``: records go in parallel and output leaves as it is done.

Commits never pass the lowest offset still in flight: the committed position of a
partition is its contiguous watermark. Offsets completed above it are written
into the commit metadata (``sl1:`` + their distances from the watermark), so a
restarted task skips them instead of processing them again. The window is
bounded: at most ``num.threads.per.task`` slots exist per task (in flight or
waiting to be released), so a stuck record stops new ones and, once the task's
buffer fills, fetching of its partitions (back-pressure).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from engine.completed_offsets import decode_completed, encode_completed
from engine.processors.context import CURRENT
from engine.processors.nodes import Forwarder, Node, SinkNode
from engine.records import ConsumerRecord, Record, TopicPartition

from .processing import Outcome, RecordPath

if TYPE_CHECKING:
    from engine.collector import RecordCollector

    from .task import StreamTask

ORDERINGS = ("partition", "key", "unordered")


class RecordSlot:
    """One record in flight: its forwarding state and the output it holds back."""

    __slots__ = ("done", "node", "outputs", "pending", "raw", "timestamp", "tp")

    def __init__(self, raw: ConsumerRecord, tp: TopicPartition) -> None:
        self.raw = raw
        self.tp = tp
        # The record's timestamp as its source's extractor gave it (RecordPath sets it).
        self.timestamp = raw.timestamp
        self.pending: deque[Any] = deque()
        self.node: Node | None = None
        self.outputs: list[tuple[Any, ...]] = []
        self.done = False


class ContextualForwarder(Forwarder):
    """A ``Forwarder`` whose queue and current node belong to the record in flight."""

    __slots__ = ("_own",)

    def __init__(self) -> None:
        self._own = RecordSlot.__new__(RecordSlot)  # used outside any record (punctuation)
        self._own.pending = deque()
        self._own.node = None

    def _slot(self) -> RecordSlot:
        slot = CURRENT.get()
        return self._own if slot is None else slot

    @property
    def pending(self) -> deque[Any]:
        return self._slot().pending

    @pending.setter
    def pending(self, value: deque[Any]) -> None:
        self._slot().pending = value

    @property
    def node(self) -> Node | None:
        return self._slot().node

    @node.setter
    def node(self, value: Node | None) -> None:
        self._slot().node = value


class HeldCollector:
    """Wraps the thread's collector: inside a record in flight, output is held in its slot."""

    def __init__(self, collector: RecordCollector) -> None:
        self._collector = collector

    def send(self, topic: str, record: Record, sink: SinkNode) -> Awaitable[None] | None:
        slot = CURRENT.get()
        if slot is None:
            return self._collector.send(topic, record, sink)
        # Serialised now, while the record runs, so that a serde failure goes to the processing
        # handler as the sink's failure on this record; the bytes wait for the record's turn.
        key_bytes, value_bytes = self._collector.serialize(topic, record, sink)
        slot.outputs.append((topic, record, sink, key_bytes, value_bytes))
        return None

    async def emit(self, slot: RecordSlot) -> None:
        for output in slot.outputs:
            pending = self._collector.send_serialized(*output)
            if pending is not None:
                await pending
        slot.outputs.clear()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._collector, name)


class InFlightWindow:
    """The concurrent run loop of one task. Caller: ``StreamTask.run``."""

    def __init__(self, task: StreamTask, limit: int, ordering: str, collector: HeldCollector,
                 committed: Callable[[TopicPartition], Awaitable[Any]] | None) -> None:
        self._task = task
        self.limit = limit
        self.ordering = ordering
        self._collector = collector
        self._committed = committed
        self.slots: dict[TopicPartition, deque[RecordSlot]] = {tp: deque() for tp in task.partitions}
        self.count = 0  # slots alive: in flight or holding output
        self.max_seen = 0
        self._busy_keys: set[Any] = set()
        self._completed: dict[TopicPartition, set[int]] = {tp: set() for tp in task.partitions}
        self._skip: dict[TopicPartition, set[int]] = {tp: set() for tp in task.partitions}
        self._path: RecordPath | None = None

    # -- commit ---------------------------------------------------------------------
    def metadata(self, tp: TopicPartition, watermark: int) -> str:
        return encode_completed(watermark, {o for o in self._completed[tp] if o >= watermark})

    async def load_skips(self) -> None:
        """Offsets a previous owner finished above its committed watermark are not redone."""
        if self._committed is None:
            return
        for tp in self.slots:
            committed = await self._committed(tp)
            if committed is not None and committed.metadata:
                self._skip[tp] = decode_completed(committed.offset, committed.metadata)

    # -- the loop -------------------------------------------------------------------
    async def run(self) -> None:
        task = self._task
        # Records run concurrently: the store journal (one per task) cannot follow them.
        self._path = RecordPath(task, journal=False)
        await self.load_skips()
        # Never more slots than ``limit`` exist, so the hand-over never has to wait for room.
        send, receive = anyio.create_memory_object_stream[RecordSlot](self.limit)
        async with anyio.create_task_group() as group:
            for _ in range(self.limit):
                group.start_soon(self._work, receive.clone())
            receive.close()
            with send:
                while not task.closing:
                    # Cleared before looking, so a wake-up that comes meanwhile is never lost.
                    task.clear_wakeup()
                    started = self._start_ready(send.send_nowait)
                    # Output released since the last turn goes on as one batch per partition, and
                    # partitions paused for back-pressure resume once the buffer drained.
                    await task.flush_output()
                    if not started:
                        await task.wait_for_wakeup()
                        await task.maybe_punctuate_wall_clock()
            # Closed: the workers finish the records handed over already, then end.
        await task.flush_output()

    async def _work(self, slots: MemoryObjectReceiveStream[RecordSlot]) -> None:
        """One worker: runs the records handed to it, one after the other, until the window ends."""
        with slots:
            async for slot in slots:
                await self._process(slot)

    def _start_ready(self, start: Callable[[RecordSlot], None]) -> bool:
        """Start as many buffered records as the window and the ordering allow."""
        task = self._task
        started = False
        while self.count < self.limit and task.buffered() and not task.closing and task.paused_at is None:
            picked = self._pick()
            if picked is None:
                break
            raw, tp = picked
            if raw.offset in self._skip[tp]:
                self._skip[tp].discard(raw.offset)
                task.advance_past(tp, raw.offset, self._lowest_in_flight(tp))
                continue
            slot = RecordSlot(raw, tp)
            self.slots[tp].append(slot)
            self.count += 1
            self.max_seen = max(self.max_seen, self.count)
            if self.ordering == "key":
                self._busy_keys.add((tp.topic, raw.key))
            start(slot)
            started = True
        return started

    def _pick(self) -> tuple[ConsumerRecord, TopicPartition] | None:
        task = self._task
        for tp, queue in task.queues().items():
            if not queue:
                continue
            if self.ordering != "key":
                return task.take(tp, 0), tp
            blocked: set[Any] = set()
            for index, raw in enumerate(queue):
                if index >= 2 * self.limit:
                    break
                key = (tp.topic, raw.key)
                if key in self._busy_keys or key in blocked:
                    blocked.add(key)  # a later record of a busy key must wait behind it
                    continue
                return task.take(tp, index), tp
        return None

    async def _process(self, slot: RecordSlot) -> None:
        """One record's whole graph on its own coroutine, by the task's one per-record path."""
        task, path = self._task, self._path
        assert path is not None
        began = time.perf_counter_ns()
        token = CURRENT.set(slot)
        try:
            while True:
                outcome = path.process(slot.raw)
                if not isinstance(outcome, Outcome):
                    outcome = await outcome
                if outcome is not Outcome.RETRY:
                    break
                slot.outputs.clear()  # this attempt's output was never released: no duplicate
                if task.closing:
                    return  # never completed: the commit stays below it, the next owner runs it
        finally:
            CURRENT.reset(token)
        if outcome is Outcome.ABANDONED:
            return
        if outcome is Outcome.DONE:
            task.meter.add(1, time.perf_counter_ns() - began)
        # SKIPPED and PAUSED complete the slot too: its offset is released in order (above a
        # pause, its output is dropped and the commit stops at the paused record).
        await self._complete(slot)

    async def _complete(self, slot: RecordSlot) -> None:
        task, tp = self._task, slot.tp
        slot.done = True
        if self.ordering == "key":
            self._busy_keys.discard((tp.topic, slot.raw.key))
        queue = self.slots[tp]
        if self.ordering == "partition":
            # Release the done prefix, in offset order.
            while queue and queue[0].done:
                head = queue.popleft()
                if task.paused_at is not None and head.raw.offset >= task.paused_at[1]:
                    head.outputs.clear()  # after the record that paused the task: read again on resume
                await self._collector.emit(head)
                self.count -= 1
                task.advance_past(tp, head.raw.offset, queue[0].raw.offset if queue else None)
        else:
            await self._collector.emit(slot)
            queue.remove(slot)
            self.count -= 1
            watermark = task.advance_past(tp, slot.raw.offset, self._lowest_in_flight(tp))
            # Done above the watermark (a lower record still in flight or waiting behind a busy
            # key): remembered for the commit metadata so a new owner does not redo it.
            completed = self._completed[tp]
            completed.add(slot.raw.offset)
            self._completed[tp] = {o for o in completed if o >= watermark}
        task.wake()

    def lowest_in_flight(self, tp: TopicPartition) -> int | None:
        """The lowest offset of ``tp`` in flight or holding output (None: none)."""
        return self._lowest_in_flight(tp)

    def _lowest_in_flight(self, tp: TopicPartition) -> int | None:
        queue = self.slots[tp]
        return min((s.raw.offset for s in queue), default=None)
