"""The processors behind the DSL's tables: aggregations (plain and windowed), table sources,
and the stream-table join.

A table forwards an update when it goes down from its store: at once without a
cache, or coalesced per key when the cache flushes (before a commit) or evicts.
Records without a key cannot be aggregated or joined; they are dropped and
counted, as in Kafka Streams.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from streamloop.processors.api import BaseProcessor, ProcessorContext
from streamloop.processors.change import ChangeRecord, TableView, close_getter
from streamloop.records import Record
from streamloop.state.store import KeyValueStore, WindowStore
from streamloop.state.windows import TimeWindows

log = logging.getLogger(__name__)


class _TableProcessor(BaseProcessor):
    """Forwards whatever goes down from its store: the table's changelog stream."""

    # Set (before ``init``) when a table operation downstream needs the value each update
    # replaces (see streamloop.processors.change): updates then go on as ``ChangeRecord``s.
    send_old_values = False
    # Never answers with an awaitable: its node calls ``process`` directly (``processor_node``).
    synchronous = True

    def __init__(self, store_name: str) -> None:
        self.store_name = store_name
        self.dropped = 0

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.store: Any = context.get_state_store(self.store_name)
        # The engine's own context forwards an update with one call; any other, through ``forward``.
        bind = getattr(context, "forward_to_children", None)
        self._send: Callable[[Record], None] = bind() if bind is not None else context.forward
        if self.send_old_values:
            self.store.set_flush_listener(self._forward_change, old_values=True)
        else:
            self.store.set_flush_listener(self._forward)

    def _forward(self, key: Any, value: Any, timestamp: int) -> None:
        self._send(Record(key, value, timestamp))

    def _forward_change(self, key: Any, value: Any, timestamp: int, old: Any) -> None:
        self._send(ChangeRecord(key, value, timestamp, old_value=old))

    def _drop(self, record: Record, why: str) -> None:
        self.dropped += 1
        log.warning("Dropping a record of %s-%s offset %s in store '%s': %s", self.context.topic,
                    self.context.partition, self.context.offset, self.store_name, why)


class AggregateProcessor(_TableProcessor):
    def __init__(self, store_name: str, initializer: Callable[[], Any],
                 aggregator: Callable[[Any, Any, Any], Any]) -> None:
        super().__init__(store_name)
        self.initializer = initializer
        self.aggregator = aggregator

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        # A plain key-value store takes the read-modify-write as one call; any other (TTL,
        # timestamped, a test's) through its own get and put.
        self._plain = type(self.store) is KeyValueStore

    def process(self, record: Record) -> None:
        if record.key is None or record.value is None:
            # As in Kafka Streams: aggregations ignore records without a key or a value.
            self._drop(record, "it has no key" if record.key is None else "it has no value")
            return
        store: KeyValueStore = self.store
        if self._plain:
            store.aggregate(record.key, record.value, self.initializer, self.aggregator)
            return
        old = store.get(record.key)
        store.put(record.key, self.aggregator(record.key, record.value, self.initializer() if old is None else old))


class ReduceProcessor(_TableProcessor):
    def __init__(self, store_name: str, reducer: Callable[[Any, Any], Any]) -> None:
        super().__init__(store_name)
        self.reducer = reducer

    def process(self, record: Record) -> None:
        if record.key is None or record.value is None:
            self._drop(record, "it has no key" if record.key is None else "it has no value")
            return
        store: KeyValueStore = self.store
        old = store.get(record.key)
        store.put(record.key, record.value if old is None else self.reducer(old, record.value))


class _WindowedAggregate(_TableProcessor):
    """A windowed aggregation (time, sliding or session windows): the records it cannot place in
    a window are dropped, and it keeps the largest timestamp it saw, its stream time."""

    def __init__(self, store_name: str, initializer: Callable[[], Any],
                 aggregator: Callable[[Any, Any, Any], Any]) -> None:
        super().__init__(store_name)
        self.initializer = initializer
        self.aggregator = aggregator
        self.observed_time = -1

    def _admit(self, record: Record, needs_value: bool = True) -> bool:
        """Whether ``record`` has a key (and a value, if ``needs_value``) and a timestamp of 0 or
        more; if so, stream time moves up to it."""
        if record.key is None or (needs_value and record.value is None):
            self._drop(record, "it has no key" if record.key is None else "it has no value")
            return False
        if record.timestamp < 0:
            self._drop(record, f"its timestamp {record.timestamp} is negative")
            return False
        self.observe_stream_time(record.timestamp)
        return True

    def observe_stream_time(self, time: int) -> None:
        if time > self.observed_time:
            self.observed_time = time


class WindowedAggregateProcessor(_WindowedAggregate):
    """Updates every window a record falls in; records for windows closed by the grace period are late."""

    def __init__(self, store_name: str, windows: TimeWindows, initializer: Callable[[], Any],
                 aggregator: Callable[[Any, Any, Any], Any]) -> None:
        super().__init__(store_name, initializer, aggregator)
        self.windows = windows

    def process(self, record: Record) -> None:
        if not self._admit(record):
            return
        store: WindowStore = self.store
        for start in self._open_windows(record):
            old = store.fetch(record.key, start)
            store.put(record.key, self.aggregator(record.key, record.value,
                                                  self.initializer() if old is None else old), start)

    def _open_windows(self, record: Record) -> list[int]:
        """The starts of the windows of ``record`` still open; each closed one drops it (late) once."""
        windows = self.windows
        closed_before = self.observed_time - windows.size_ms - windows.grace_ms
        starts = windows.windows_for(record.timestamp)
        for start in starts:
            if start <= closed_before:
                self._drop(record, f"late: window [{start}, {start + windows.size_ms}) closed "
                                   f"(stream time {self.observed_time}, grace {windows.grace_ms} ms)")
        return [start for start in starts if start > closed_before]


class TableSourceProcessor(_TableProcessor):
    """Materializes a topic as a table: each record is the key's latest value; a None value deletes it."""

    def process(self, record: Record) -> None:
        if record.key is None:
            self._drop(record, "it has no key")
            return
        self.store.put(record.key, record.value)


class StreamTableJoinProcessor(BaseProcessor):
    """Joins each stream record with the table's current value for its key (inner or left join).

    ``view`` reads a table that keeps no store of its own (an unmaterialized filter or
    ``map_values``) through its parent's; ``store_name`` then names that parent's store.
    """

    def __init__(self, store_name: str, joiner: Callable[[Any, Any], Any], left: bool,
                 view: TableView | None = None) -> None:
        self.store_name = store_name
        self.joiner = joiner
        self.left = left
        self.view = view

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.store: KeyValueStore = context.get_state_store(self.store_name)
        self._get = self.store.get if self.view is None else self.view.make(context)

    def process(self, record: Record) -> None:
        if record.key is None:
            return
        other = self._get(record.key)
        if other is None and not self.left:
            return
        self.context.forward(Record(record.key, self.joiner(record.value, other), record.timestamp,
                                    record.headers))

    def close(self) -> None:
        close_getter(self._get)
