"""Windowed aggregations that emit each window once, when it closes (``EmitStrategy.on_window_close()``).

As Kafka Streams' ``KStreamWindowAggregate``, ``KStreamSlidingWindowAggregate`` and
``KStreamSessionWindowAggregate`` with ``EmitStrategy.onWindowClose()`` (KIP-825):
the store is updated per record as with ``on_window_update``, but nothing goes
downstream on an update. Once the close time (stream time, or the wall clock
after the idle time with a ``WallClockClose``) passes a window's end plus the
grace period (sessions: plus the gap), the window goes out once with its final
aggregate and the largest record timestamp in it (a session: its end), oldest
first and then by key. Records for closed windows are dropped as late, as they
are with ``on_window_update``.

The windows not emitted yet are kept in memory as a heap ordered by their end,
so a record or a wall-clock check costs one look at the heap's top plus the
windows it emits; the heap is built from the store once per task start (after
its restore) and after a retried record's writes were undone. Kafka Streams
range-fetches a time-ordered store at most once per emit interval instead.

The close time of the last emission is kept in a store with a changelog
(``streamloop.processors.window_close.CloseTime``): after a restart the windows
that were emitted are not emitted again, and stay closed.
"""

from __future__ import annotations

import heapq
import struct
from collections.abc import Callable
from typing import Any

from streamloop.processors.api import ProcessorContext
from streamloop.processors.change import ChangeRecord
from streamloop.processors.session_aggregate import SessionWindowAggregateProcessor
from streamloop.processors.sliding_aggregate import SlidingWindowAggregateProcessor, Stamped
from streamloop.processors.stateful import WindowedAggregateProcessor
from streamloop.processors.window_close import CloseTime
from streamloop.records import Headers, Record
from streamloop.state.session_windows import SessionWindows
from streamloop.state.sliding_windows import SlidingWindows, TimestampedWindowStore
from streamloop.state.windows import TimeWindows, Windowed

_LONG = struct.Struct(">q")


class _EmitsOnClose:
    """What both aggregations share: the heap of windows not emitted yet, keyed by the close time
    (stream time - grace) at which each is closed, its load, and the emission.

    The processor it is mixed into keeps ``observed_time`` (its close time with the grace added
    back), ``store``, ``context``, ``send_old_values`` and ``grace_ms``.
    """

    closing: CloseTime
    emitted: int
    observed_time: int
    store: Any
    context: ProcessorContext
    send_old_values: bool
    store_name: str
    observe_stream_time: Callable[[int], None]  # the processor's own (``_WindowedAggregate``)

    @property
    def grace_ms(self) -> int:
        raise NotImplementedError

    def _closed_at(self, start: int) -> int:
        """The close time from which the window starting at ``start`` is closed."""
        raise NotImplementedError

    def _closed_at_raw(self, raw: bytes) -> int:
        """The close time from which the window stored under ``raw`` is closed (window stores end
        their keys with the window's start)."""
        return self._closed_at(_LONG.unpack(raw[-8:])[0])

    def _timestamp(self, window: Windowed, data: bytes) -> int:
        """What a closed window goes out with: its largest record timestamp (kept after its value)."""
        return int(_LONG.unpack(data[-8:])[0])

    def init(self, context: ProcessorContext) -> None:
        # No flush listener: an update goes nowhere, only a closed window does.
        self.context = context
        self.store = context.get_state_store(self.store_name)
        self.store.undo_listener = self._stale
        self.closing.init(context, self._on_wall_clock, self._stale)
        # Loaded at the first record or check: a task restores its stores after its processors' init.
        self._loaded = False

    def _stale(self) -> None:
        self._loaded = False

    def _load(self) -> None:
        """The windows not emitted yet: those not closed at the close time of the last emission."""
        emitted_to = self.closing.restored()
        self.observe_stream_time(emitted_to)
        closed = emitted_to - self.grace_ms
        self._order: list[tuple[int, bytes]] = []
        for raw, _value in self.store._range(None, None):
            closes = self._closed_at_raw(raw)
            if closes > closed:
                self._order.append((closes, raw))
        heapq.heapify(self._order)
        self._loaded = True

    def _before(self) -> None:
        if not self._loaded:
            self._load()
        self.closing.arrived()

    def _push(self, key: Any, start: int) -> None:
        heapq.heappush(self._order, (self._closed_at(start), self.store._composite(key, start)))

    def _on_wall_clock(self, now: int) -> None:
        if not self._loaded:
            self._load()
        self.observe_stream_time(now)
        self._emit_closed(())

    def _emit_closed(self, headers: Headers) -> None:
        """Every window the close time has passed, once; as Kafka Streams, a record's emissions carry
        its headers."""
        order = self._order
        closed = self.observed_time - self.grace_ms
        if not order or order[0][0] > closed:
            return
        store = self.store
        emitted = 0
        last = None
        while order and order[0][0] <= closed:
            entry = heapq.heappop(order)
            if entry == last:
                continue  # a window pushed at each of its updates: equal entries pop one after another
            last = entry
            data = store._get(entry[1])
            if data is None:
                continue  # gone since (a merged session, or a retried record's window, undone)
            window, value = store._decode_key(entry[1]), store._decode_value(data)
            timestamp = self._timestamp(window, data)
            if self.send_old_values:
                self.context.forward(ChangeRecord(window, value, timestamp, headers, None))
            else:
                self.context.forward(Record(window, value, timestamp, headers))
            emitted += 1
        if emitted:
            self.emitted += emitted
            self.closing.save(self.observed_time)


class FinalWindowAggregateProcessor(_EmitsOnClose, WindowedAggregateProcessor):
    """Time windows: a window ``[start, start + size)`` is closed once its end is at most the close time."""

    def __init__(self, store_name: str, windows: TimeWindows, initializer: Callable[[], Any],
                 aggregator: Callable[[Any, Any, Any], Any], closing: CloseTime) -> None:
        super().__init__(store_name, windows, initializer, aggregator)
        self.closing = closing
        self.emitted = 0

    @property
    def grace_ms(self) -> int:
        return self.windows.grace_ms

    def _closed_at(self, start: int) -> int:
        return start + self.windows.size_ms

    def process(self, record: Record) -> None:
        self._before()
        if not self._admit(record):
            return
        store: TimestampedWindowStore = self.store
        key = record.key
        for start in self._open_windows(record):
            found = store.fetch_with_timestamp(key, start, start)
            if found:
                _, old, stamp = found[0]
                stamp = max(stamp, record.timestamp)
            else:
                old, stamp = self.initializer(), record.timestamp
                self._push(key, start)
            store.put_with_timestamp(key, self.aggregator(key, record.value, old), start, stamp)
        self._emit_closed(record.headers)


class FinalSlidingWindowAggregateProcessor(_EmitsOnClose, SlidingWindowAggregateProcessor):
    """Sliding windows: ``[start, start + diff]`` (both ends inclusive) is closed once its end is
    before the close time, as the aggregation's own lateness says."""

    def __init__(self, store_name: str, windows: SlidingWindows, initializer: Callable[[], Any],
                 aggregator: Callable[[Any, Any, Any], Any], closing: CloseTime) -> None:
        super().__init__(store_name, windows, initializer, aggregator)
        self.closing = closing
        self.emitted = 0

    @property
    def grace_ms(self) -> int:
        return self.windows.grace_ms

    def _closed_at(self, start: int) -> int:
        return start + self.windows.time_difference_ms + 1

    def process(self, record: Record) -> None:
        self._before()
        super().process(record)
        self._emit_closed(record.headers)

    def _update(self, record: Record, start: int, stamped: Stamped, close_time: int) -> None:
        super()._update(record, start, stamped, close_time)
        if start + self.windows.time_difference_ms >= close_time:  # updated, not dropped as late
            self._push(record.key, start)

    def _create_right(self, record: Record, stamped: Stamped) -> None:
        super()._create_right(record, stamped)
        self._push(record.key, record.timestamp + 1)


class FinalSessionWindowAggregateProcessor(_EmitsOnClose, SessionWindowAggregateProcessor):
    """Sessions: ``[start, end]`` (both inclusive) is closed once its end is before stream time - gap -
    grace, as the aggregation's own lateness says; it goes out with its end as its timestamp. A
    session merged away is gone from the store, so its heap entry is passed over."""

    def __init__(self, store_name: str, windows: SessionWindows, initializer: Callable[[], Any],
                 aggregator: Callable[[Any, Any, Any], Any], merger: Callable[[Any, Any, Any], Any],
                 closing: CloseTime) -> None:
        super().__init__(store_name, windows, initializer, aggregator, merger)
        self.closing = closing
        self.emitted = 0

    @property
    def grace_ms(self) -> int:
        return self.windows.close_after_ms

    def _closed_at_raw(self, raw: bytes) -> int:
        return int(_LONG.unpack(raw[-16:-8])[0]) + 1  # a session store's key ends with (end, start)

    def _timestamp(self, window: Windowed, data: bytes) -> int:
        return window.end

    def process(self, record: Record) -> None:
        self._before()
        super().process(record)
        self._emit_closed(record.headers)

    def _store_session(self, session: Windowed, aggregate: Any) -> None:
        super()._store_session(session, aggregate)
        heapq.heappush(self._order, (session.end + 1, self.store._composite(session)))
