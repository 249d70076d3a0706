"""One record in flight (``num.threads.per.task`` > 1) and what follows it while it runs.

Records of one task run at once on the workers of its ``InFlightWindow``; a ``ContextVar``
(``streamloop.processors.context.CURRENT``) holds the record's ``RecordSlot``, and the task's shared
parts look it up: the forwarder's queue and current node (``ContextualForwarder``), the stores'
journal of the record's updates (``RecordJournals``), and the output the record holds back until its
turn (``HeldCollector``). Outside any record (a punctuation) each of them acts for the task.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from streamloop.processors.context import CURRENT
from streamloop.processors.nodes import Forwarder, Node, SinkNode
from streamloop.records import ConsumerRecord, Headers, Record, TopicPartition
from streamloop.state.store import Journal

if TYPE_CHECKING:
    from streamloop.collector import RecordCollector


class RecordSlot:
    """One record in flight: its forwarding state, its journal and the output it holds back."""

    __slots__ = ("_journal", "done", "node", "outputs", "pending", "raw", "stale", "timestamp", "tp")

    def __init__(self, raw: ConsumerRecord, tp: TopicPartition) -> None:
        self.raw = raw
        self.tp = tp
        # The record's timestamp as its source's extractor gave it (RecordPath sets it; -1 when
        # the record could not be read): the time it passes with.
        self.timestamp = raw.timestamp
        self.pending: deque[Any] = deque()
        self.node: Node | None = None
        self.outputs: list[tuple[Any, ...]] = []
        self._journal: Journal | None = None
        self.done = False
        # Taken before a resume that reads its partition again from at or below it: this attempt is
        # void (its output does not leave, its failure is not asked about, its offset not passed).
        self.stale = False

    @property
    def journal(self) -> Journal:
        """Made on first use: only a task with stores journals (a stateless record never asks)."""
        journal = self._journal
        if journal is None:
            journal = self._journal = Journal()
        return journal


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


class RecordJournals(Journal):
    """The task's stores' journal when records are in flight: the journal of the record in
    flight (``RecordSlot.journal``), or none outside a record (a punctuation journals nothing)."""

    __slots__ = ("keep_ended",)

    def __init__(self) -> None:
        super().__init__()
        # Records released in offset order keep their pre-images until released (``end_keeping``).
        self.keep_ended = False

    @staticmethod
    def _current() -> Journal | None:
        slot = CURRENT.get()
        return None if slot is None else slot.journal

    @property
    def active(self) -> bool:
        journal = self._current()
        return journal is not None and journal.active

    @active.setter
    def active(self, value: bool) -> None:
        pass  # each record's own journal keeps its state

    def begin(self, source: Any) -> None:
        journal = self._current()
        if journal is not None:
            journal.begin(source)

    def end(self) -> None:
        journal = self._current()
        if journal is not None:
            if self.keep_ended:
                journal.end_keeping()
            else:
                journal.end()

    def seen(self, store: Any, key: bytes, stored: bytes | None) -> None:
        journal = self._current()
        if journal is not None:
            journal.seen(store, key, stored)

    def remember(self, store: Any, key: bytes) -> None:
        journal = self._current()
        if journal is not None:
            journal.remember(store, key)

    def remember_read(self, store: Any, key: bytes, stored: bytes | None) -> None:
        journal = self._current()
        if journal is not None:
            journal.remember_read(store, key, stored)

    def undo(self) -> int:
        journal = self._current()
        return 0 if journal is None else journal.undo()


class HeldCollector:
    """Wraps the task's collector: inside a record in flight, sink output is held in its slot, and
    under exactly-once its changelog updates and dead letters too (``hold_all``)."""

    def __init__(self, collector: RecordCollector, hold_all: bool = False) -> None:
        self._collector = collector
        self._hold_all = hold_all

    def send(self, topic: str, record: Record, sink: SinkNode) -> Awaitable[None] | None:
        slot = CURRENT.get()
        if slot is None:
            return self._collector.send(topic, record, sink)
        # Serialised now, while the record runs, so that a serde failure goes to the processing
        # handler as the sink's failure on this record; the bytes wait for the record's turn.
        return self._collector.send(topic, record, sink, slot.outputs)

    async def partition_count(self, topic: str) -> int:
        return await self._collector.partition_count(topic)

    def append_raw(self, topic: str, partition: int, key: bytes, value: bytes | None, timestamp: int,
                   headers: Headers) -> None:
        slot = CURRENT.get() if self._hold_all else None
        if slot is None:
            self._collector.append_raw(topic, partition, key, value, timestamp, headers)
            return
        slot.outputs.append((topic, partition, key, value, timestamp, headers))

    async def send_raw(self, topic: str, key: bytes | None, value: bytes | None, timestamp: int,
                       headers: Headers) -> None:
        slot = CURRENT.get() if self._hold_all else None
        if slot is None:
            await self._collector.send_raw(topic, key, value, timestamp, headers)
            return
        slot.outputs.append((topic, None, key, value, timestamp, headers))

    async def emit(self, slot: RecordSlot) -> None:
        collector = self._collector
        for output in slot.outputs:
            if len(output) == 5:
                pending = collector.send_serialized(*output)
                if pending is not None:
                    await pending
            elif output[1] is None:
                topic, _none, key, value, timestamp, headers = output
                await collector.send_raw(topic, key, value, timestamp, headers)
            else:
                collector.append_raw(*output)
        slot.outputs.clear()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._collector, name)
