"""Time segments of a window, session or join-window store: expiry drops whole segments.

A windowed store's key ends in a fixed-size suffix that starts with a timestamp (a window's start,
a session's end, a join record's time; see ``WindowStore``, ``SessionStore``, ``JoinWindowStore``).
``SegmentedBytesStore`` keeps each key in the segment of that timestamp (segment id = timestamp //
interval, the interval ``max(retention / 2, 60 s)`` as Kafka Streams' windowed stores pick it), so
that expiry, as stream time moves, drops the segments whose every timestamp is past the
retention instead of reading the store, and a fetch over a key's times reads only the segments
of those times.

Stream time here is the largest timestamp put (restores and standbys included), moved on by the
store above at each expiry (it sees writes still in the record cache). A write to a dropped
segment is ignored: held writes (``streamloop.state.uncommitted``) or cached ones reaching it
after the drop do not bring an expired segment back, and a restore drops what expired as it
goes. A segment may still hold timestamps past the retention until it is dropped as a whole:
the stores above leave out what is past the retention when they read.

Two kinds of segments: in memory, one ``InMemoryBytesStore`` per segment (a drop forgets it); on
RocksDB, one database per store whose keys are the segment id (8 bytes big-endian) followed by
the store's key, so a drop is one ``delete_range`` over the ids below the oldest live segment.
That is a state-directory format change: a RocksDB window, session or join store written before
segments has no ``FORMAT`` marker and is wiped when opened, then restored in full from its
changelog (``TaskStateManager.restore`` sees ``reset``).
"""

from __future__ import annotations

import bisect
import heapq
import struct
from collections.abc import Iterator
from operator import itemgetter
from typing import Protocol

from streamloop.state.bytes_stores import InMemoryBytesStore, RocksDBBytesStore

_TIME = struct.Struct(">q")
_ID = struct.Struct(">q")
MIN_INTERVAL_MS = 60_000
# Kept under the empty key, which no segmented key can be (they are id + key + suffix).
FORMAT_KEY = b""
FORMAT = b"streamloop.segments.v1"
_FIRST = itemgetter(0)


def _marker(observed: int) -> bytes:
    return FORMAT + _TIME.pack(observed)


def segment_interval(retention_ms: int) -> int:
    """A segment's span of time: half the retention, at least a minute (Kafka Streams' choice:
    about three segments live, so a drop frees about a third of the store)."""
    return max(retention_ms // 2, MIN_INTERVAL_MS)


class Segments(Protocol):
    """Where a segmented store keeps its segments; ids are ``timestamp // interval`` (>= 0)."""

    persistent: bool
    reset: bool

    def open(self) -> None: ...

    def ids(self) -> list[int]:
        """The ids of the segments that may hold entries, ascending (a copy)."""

    def get(self, segment: int, key: bytes) -> bytes | None: ...

    def put(self, segment: int, key: bytes, value: bytes | None) -> None: ...

    def write_batch(self, entries: list[tuple[int, bytes, bytes | None]], observed: int) -> None:
        """Apply ``entries`` at once and durably, and ``observed`` as the stream time they leave."""

    @property
    def observed(self) -> int:
        """The stream time last written (``write_batch``, ``flush``) as of ``open``; -1 if none."""

    def range(self, segment: int, low: bytes | None, high: bytes | None) -> Iterator[tuple[bytes, bytes]]: ...

    def drop_below(self, segment: int) -> int:
        """Forget every segment with an id below ``segment``; returns how many there were."""

    def approximate_num_entries(self) -> int: ...

    def flush(self, observed: int) -> None: ...

    def close(self) -> None: ...

    def wipe(self) -> None: ...


class MemorySegments:
    """One sorted in-memory bytes store per segment."""

    persistent = False
    reset = False

    def __init__(self, name: str) -> None:
        self.name = name
        # Replaced or added to by the writing thread only; a reader on another thread copies it.
        self._segments: dict[int, InMemoryBytesStore] = {}

    def open(self) -> None:
        pass

    def ids(self) -> list[int]:
        return sorted(list(self._segments))

    def get(self, segment: int, key: bytes) -> bytes | None:
        store = self._segments.get(segment)
        return None if store is None else store.get(key)

    def put(self, segment: int, key: bytes, value: bytes | None) -> None:
        store = self._segments.get(segment)
        if store is None:
            if value is None:
                return
            store = self._segments[segment] = InMemoryBytesStore(f"{self.name}.{segment}")
        store.put(key, value)

    def write_batch(self, entries: list[tuple[int, bytes, bytes | None]], observed: int) -> None:
        for segment, key, value in entries:
            self.put(segment, key, value)

    @property
    def observed(self) -> int:
        return -1

    def range(self, segment: int, low: bytes | None, high: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        store = self._segments.get(segment)
        return iter(()) if store is None else store.range(low, high)

    def drop_below(self, segment: int) -> int:
        dead = [s for s in self._segments if s < segment]
        if dead:
            # A new dict, so that a reader on another thread iterating the old one is not disturbed.
            self._segments = {s: store for s, store in self._segments.items() if s >= segment}
        return len(dead)

    def approximate_num_entries(self) -> int:
        return sum(s.approximate_num_entries() for s in list(self._segments.values()))

    def flush(self, observed: int) -> None:
        pass

    def close(self) -> None:
        pass

    def wipe(self) -> None:
        self._segments = {}


class RocksDBSegments:
    """Every segment in one RocksDB database, each under its id as a key prefix."""

    persistent = True

    def __init__(self, db: RocksDBBytesStore) -> None:
        self.db = db
        self.name = db.name
        # The ids that may have entries, ascending: learnt at open, added to by puts.
        self._ids: list[int] = []
        # Whether ``open`` found the layout of before segments and wiped it (restore in full).
        self.reset = False
        self._observed = -1

    def open(self) -> None:
        db = self.db
        db.open()
        marker = db.get(FORMAT_KEY)
        if marker is None or not marker.startswith(FORMAT):
            if next(iter(db.range(None, None)), None) is not None:
                # Keys without segment ids: nothing here can be read as segments.
                db.wipe()
                self.reset = True
            marker = _marker(-1)
            db.write_batch([(FORMAT_KEY, marker)])
        self._observed = _TIME.unpack_from(marker, len(FORMAT))[0]
        self._ids = self._discover()

    @property
    def observed(self) -> int:
        return self._observed

    def _discover(self) -> list[int]:
        """One seek per segment: the first key at or after each next id."""
        found: list[int] = []
        low = _ID.pack(0)
        while True:
            first = next(iter(self.db.range(low, None)), None)
            if first is None or len(first[0]) < _ID.size:
                return found
            segment = _ID.unpack_from(first[0])[0]
            found.append(segment)
            low = _ID.pack(segment + 1)

    def ids(self) -> list[int]:
        return list(self._ids)

    def get(self, segment: int, key: bytes) -> bytes | None:
        return self.db.get(_ID.pack(segment) + key)

    def _known(self, segment: int) -> None:
        ids = self._ids
        if not ids or ids[-1] < segment:
            ids.append(segment)
        elif segment not in ids:
            bisect.insort(ids, segment)

    def put(self, segment: int, key: bytes, value: bytes | None) -> None:
        if value is not None:
            self._known(segment)
        self.db.put(_ID.pack(segment) + key, value)

    def write_batch(self, entries: list[tuple[int, bytes, bytes | None]], observed: int) -> None:
        for segment, _key, value in entries:
            if value is not None:
                self._known(segment)
        # The stream time in the same batch: a store reopened after a crash expires and reads by
        # the time of its last commit, not by a lower bound (which would show expired windows again).
        self.db.write_batch([(FORMAT_KEY, _marker(observed)),
                             *((_ID.pack(segment) + key, value) for segment, key, value in entries)])

    def range(self, segment: int, low: bytes | None, high: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        prefix = _ID.pack(segment)
        # Inclusive bounds: the next id alone is no stored key (every key is longer than an id).
        upper = _ID.pack(segment + 1) if high is None else prefix + high
        for key, value in self.db.range(prefix + (low or b""), upper):
            yield key[_ID.size:], value

    def drop_below(self, segment: int) -> int:
        dead = [s for s in self._ids if s < segment]
        if not dead:
            return 0
        self.db.delete_range(_ID.pack(dead[0]), _ID.pack(segment))
        self._ids = [s for s in self._ids if s >= segment]
        return len(dead)

    def approximate_num_entries(self) -> int:
        return self.db.approximate_num_entries()

    def flush(self, observed: int) -> None:
        # Before a checkpoint (after a restore, a standby's): the time of what the disk now holds.
        self.db.put(FORMAT_KEY, _marker(observed))
        self.db.flush()

    def close(self) -> None:
        self.db.close()

    def wipe(self) -> None:
        self.db.wipe()
        self.db.write_batch([(FORMAT_KEY, _marker(-1))])
        self._ids = []
        self._observed = -1


class SegmentedBytesStore:
    """A bytes store of windowed keys (``suffix`` bytes of timestamp and the rest after the key)
    in time segments; keys whose timestamp is below stream time less ``span_ms`` are expired.

    ``range(low, high)`` with both bounds one key's prefix and a suffix each reads only the
    segments between the two timestamps: it gives that key's entries in that time range, and may
    leave out other keys of other lengths between the bounds (a windowed store reads its own
    key's length only). Any other range reads every live segment, merged in key order.
    """

    def __init__(self, name: str, segments: Segments, *, suffix: int, interval_ms: int, span_ms: int) -> None:
        self.name = name
        self.segments = segments
        self.persistent = segments.persistent
        self.suffix = suffix
        self.interval_ms = interval_ms
        self.span_ms = span_ms
        self.observed = -1
        # Segments below this id are dropped: a write to one is ignored.
        self.live_segment = 0

    @property
    def reset(self) -> bool:
        """Whether opening found an older layout and wiped it (its checkpoint no longer holds)."""
        return self.segments.reset

    def _segment(self, key: bytes) -> int:
        time: int = _TIME.unpack_from(key, len(key) - self.suffix)[0]
        return time // self.interval_ms

    def advance(self, time: int) -> int:
        """Stream time is at least ``time``: drop the segments now past the retention; returns how many."""
        if time <= self.observed:
            return 0
        self.observed = time
        live = max(time - self.span_ms, 0) // self.interval_ms
        if live <= self.live_segment:
            return 0
        self.live_segment = live
        return self.segments.drop_below(live)

    @property
    def live_from(self) -> int:
        """The oldest timestamp still within the retention."""
        return self.observed - self.span_ms

    # -- the bytes store interface ----------------------------------------------------
    def get(self, key: bytes) -> bytes | None:
        segment = self._segment(key)
        return None if segment < self.live_segment else self.segments.get(segment, key)

    def put(self, key: bytes, value: bytes | None, source: tuple[str, int] | None = None) -> None:
        time = _TIME.unpack_from(key, len(key) - self.suffix)[0]
        if time > self.observed:
            self.advance(time)
        segment = time // self.interval_ms
        if segment >= self.live_segment:
            self.segments.put(segment, key, value)

    def write_batch(self, entries: list[tuple[bytes, bytes | None]]) -> None:
        if not entries:
            return
        suffix, unpack = self.suffix, _TIME.unpack_from
        timed = [(unpack(key, len(key) - suffix)[0], key, value) for key, value in entries]
        self.advance(max(t for t, _k, _v in timed))
        interval, live = self.interval_ms, self.live_segment
        self.segments.write_batch([(t // interval, k, v) for t, k, v in timed if t // interval >= live],
                                  self.observed)

    def range(self, low: bytes | None, high: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        ids = self.segments.ids()
        live = self.live_segment
        suffix = self.suffix
        if (low is not None and high is not None and len(low) == len(high) >= suffix
                and low[:-suffix] == high[:-suffix]):
            first = _TIME.unpack_from(low, len(low) - suffix)[0] // self.interval_ms
            last = _TIME.unpack_from(high, len(high) - suffix)[0] // self.interval_ms
            ids = [s for s in ids if max(first, live) <= s <= last]
        else:
            ids = [s for s in ids if s >= live]
        if len(ids) == 1:
            return self.segments.range(ids[0], low, high)
        return heapq.merge(*(self.segments.range(s, low, high) for s in ids), key=_FIRST)

    def approximate_num_entries(self) -> int:
        return self.segments.approximate_num_entries()

    def open(self) -> None:
        self.segments.open()
        self.advance(self.segments.observed)

    def flush(self) -> None:
        self.segments.flush(self.observed)

    def close(self) -> None:
        self.segments.close()

    def wipe(self) -> None:
        self.segments.wipe()
        self.observed = -1
        self.live_segment = 0


def layout_reset(store: object) -> bool:
    """Whether ``store`` (a task store's durable bytes store) was wiped at open for its old layout:
    its checkpoint offset no longer describes it, so it restores from the changelog's start."""
    return isinstance(store, SegmentedBytesStore) and store.reset
