"""The processors of a stream-stream windowed join (Kafka Streams' ``KStreamKStreamJoin``).

Each side has a processor: it joins a record with the other side's window store
(the records of the same key within the join window, duplicates included), then
keeps the record in its own side's window store for the other side to find. The
result's timestamp is the larger of the two records'.

A left or outer join must also emit the records that never found a partner, with
None for the missing side; it cannot know that before the window has closed. Such
a record waits in the *shared outer store* (one per join and task, keyed by
timestamp, side and key) until the join's stream time (the largest timestamp
either side has seen, per task) passes its window end plus the grace period. A
partner arriving before then removes it. Waiting records are emitted, oldest
first, by the next record of either side that does not go back in time (Kafka
Streams >= 3.1, the "spurious result fix"). Unlike Kafka Streams there is no
wall-clock throttle on that check (``emit.interval.ms.kstreams.outer.join.spurious.results.fix``):
the store lookup it saves is a key range here, not a RocksDB iterator.
"""

from __future__ import annotations

import logging
import struct
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from streamloop.processors.api import BaseProcessor, ProcessorContext
from streamloop.records import Record
from streamloop.state.join_store import JoinWindowStore
from streamloop.state.join_windows import JoinWindows
from streamloop.state.store import KeyValueStore

log = logging.getLogger(__name__)

_TS = struct.Struct(">q")
_LEN = struct.Struct(">I")
# As Kafka Streams' TimestampedKeyAndJoinSide: at one timestamp the right side sorts first.
_LEFT, _RIGHT = b"\x01", b"\x00"


class TimeTracker:
    """The join's time in one task, shared by its two processors.

    ``min_time`` is at most the oldest timestamp waiting in the outer store, or None when
    unknown (at start, after a restore, after a sweep that found nothing): then the next
    record looks.
    """

    __slots__ = ("min_time", "stream_time")

    def __init__(self) -> None:
        self.stream_time = -1
        self.min_time: int | None = None

    def advance(self, timestamp: int) -> None:
        if timestamp > self.stream_time:
            self.stream_time = timestamp


class SharedTime:
    """One ``TimeTracker`` per task for a join; both sides find it by a store of their task.

    The task's left window store is the anchor: both processors have it, and it lives
    exactly as long as the task's instance of the join (trackers go with it).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # tasks of several stream threads init at once
        self._trackers: weakref.WeakKeyDictionary[object, TimeTracker] = weakref.WeakKeyDictionary()

    def tracker(self, anchor: object) -> TimeTracker:
        with self._lock:
            found = self._trackers.get(anchor)
            if found is None:
                found = self._trackers[anchor] = TimeTracker()
            return found


class OuterStore:
    """The shared outer store over a bytes key-value store: ``timestamp + side + key`` to the
    list of that side's unmatched values (length-prefixed, in arrival order)."""

    def __init__(self, store: KeyValueStore, left: JoinWindowStore, right: JoinWindowStore) -> None:
        self.store = store
        self._key_serde = left.key_serde  # one key encoding for both sides' entries
        self._values = {_LEFT: left.value_serde, _RIGHT: right.value_serde}

    def _raw(self, timestamp: int, side: bytes, key: Any) -> bytes:
        return _TS.pack(timestamp) + side + _bytes(self._key_serde.serialize(key), key)

    def add(self, timestamp: int, side: bytes, key: Any, value: Any) -> None:
        raw = self._raw(timestamp, side, key)
        data = _bytes(self._values[side].serialize(value), value)
        self.store.put(raw, (self.store.get(raw) or b"") + _LEN.pack(len(data)) + data)

    def remove(self, timestamp: int, side: bytes, key: Any) -> None:
        """The entry has found a partner: it will never be emitted with None."""
        raw = self._raw(timestamp, side, key)
        if self.store.get(raw) is not None:
            self.store.put(raw, None)

    def entries(self) -> Iterator[tuple[bytes, int, bytes, Any, list[Any]]]:
        """``(stored key, timestamp, side, key, values)``, oldest first (a snapshot)."""
        for raw, data in list(self.store.all()):
            side = raw[8:9]
            decode = self._values[side].deserialize
            values, at = [], 0
            while at < len(data):
                (size,) = _LEN.unpack_from(data, at)
                values.append(decode(data[at + 4:at + 4 + size]))
                at += 4 + size
            yield raw, _TS.unpack(raw[:8])[0], side, self._key_serde.deserialize(raw[9:]), values

    def delete(self, raw: bytes) -> None:
        self.store.put(raw, None)


def _bytes(data: bytes | None, of: Any) -> bytes:
    if data is None:
        raise ValueError(f"Stream-stream join: {of!r} serializes to None, which the outer store cannot keep")
    return data


class StreamJoinProcessor(BaseProcessor):
    """One side of the join. ``emit_unmatched``: this side's records without partner are
    emitted with None (the left side of a left join, both sides of an outer join)."""

    def __init__(self, left_side: bool, left_store: str, right_store: str, outer_store: str | None,
                 windows: JoinWindows, joiner: Callable[[Any, Any], Any], emit_unmatched: bool,
                 shared: SharedTime) -> None:
        self.left_side = left_side
        self.store_names = (left_store, right_store)
        self.outer_name = outer_store
        self.windows = windows
        self.joiner = joiner
        self.emit_unmatched = emit_unmatched
        self.shared = shared
        # How far this side's records look at the other's: the windows as seen from this side.
        self.before = windows.before_ms if left_side else windows.after_ms
        self.after = windows.after_ms if left_side else windows.before_ms
        self.side, self.other_side = (_LEFT, _RIGHT) if left_side else (_RIGHT, _LEFT)
        self.dropped = 0

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        left: JoinWindowStore = context.get_state_store(self.store_names[0])
        right: JoinWindowStore = context.get_state_store(self.store_names[1])
        self.own, self.other = (left, right) if self.left_side else (right, left)
        self.outer = None if self.outer_name is None else OuterStore(
            context.get_state_store(self.outer_name), left, right)
        self.time = self.shared.tracker(left)
        if self.outer is not None:
            # A retried record's updates were undone: entries it emitted and deleted are back, older
            # than the ``min_time`` its sweep left, which would skip them on the retry.
            self.outer.store.undo_listener = self._forget_min_time

    def _forget_min_time(self) -> None:
        self.time.min_time = None

    def _join(self, mine: Any, theirs: Any) -> Any:
        return self.joiner(mine, theirs) if self.left_side else self.joiner(theirs, mine)

    def process(self, record: Record) -> None:
        key, value, timestamp = record.key, record.value, record.timestamp
        time = self.time
        time.advance(timestamp)
        if key is None:
            # As Kafka Streams (KIP-962): an outer side's record without a key joins nothing, at once.
            if self.emit_unmatched and value is not None:
                self.context.forward(Record(None, self._join(value, None), timestamp, record.headers))
            else:
                self._drop("it has no key")
            return
        if timestamp < 0:
            self._drop(f"its timestamp {timestamp} is negative")
            return
        if value is not None:
            self._process(record)
        else:
            self._drop("it has no value")
        # After the join, as Kafka Streams puts it after forwarding to the join: a record never joins itself.
        self.own.put(key, value, timestamp)

    def _process(self, record: Record) -> None:
        key, value, timestamp = record.key, record.value, record.timestamp
        time, outer = self.time, self.outer
        if outer is not None and timestamp == time.stream_time:
            self._emit_closed(outer, record)
        time_from = max(0, timestamp - self.before)
        time_to = max(0, timestamp + self.after)
        matched = False
        for other_timestamp, other_value in list(self.other.fetch_range(key, time_from, time_to)):
            matched = True
            if outer is not None:
                outer.remove(other_timestamp, self.other_side, key)
            self.context.forward(Record(key, self._join(value, other_value), max(timestamp, other_timestamp),
                                        record.headers))
        if matched or not self.emit_unmatched:
            return
        if outer is None or time_to < time.stream_time:
            # Its window has closed already (the record is out of order): no partner can come.
            self.context.forward(Record(key, self._join(value, None), timestamp, record.headers))
            return
        if time.min_time is None or timestamp < time.min_time:
            time.min_time = timestamp
        outer.add(timestamp, self.side, key, value)

    def _emit_closed(self, outer: OuterStore, record: Record) -> None:
        """Emit the waiting records whose window plus grace has closed, oldest first."""
        time, grace = self.time, self.windows.grace_ms
        # Kafka Streams' cheap check first; it uses this side's look-ahead, as Kafka Streams does.
        if time.min_time is not None and time.min_time + self.after + grace >= time.stream_time:
            return
        time.min_time = None
        open_sides: set[bytes] = set()
        for raw, timestamp, side, key, values in outer.entries():
            time.min_time = timestamp
            if len(open_sides) == 2:
                break  # both sides' oldest waiting records are still open: nothing later closed
            # A left record waits for right records up to after_ms newer, a right one before_ms.
            look_ahead = self.windows.after_ms if side == _LEFT else self.windows.before_ms
            if timestamp + look_ahead + grace >= time.stream_time:
                open_sides.add(side)
                continue
            for value in values:
                joined = self.joiner(value, None) if side == _LEFT else self.joiner(None, value)
                self.context.forward(Record(key, joined, timestamp, record.headers))
            outer.delete(raw)

    def _drop(self, why: str) -> None:
        self.dropped += 1
        log.warning("Skipping a record of %s-%s offset %s in stream-stream join: %s", self.context.topic,
                    self.context.partition, self.context.offset, why)
