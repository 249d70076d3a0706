"""Time to live for key-value stores: an entry expires ``ttl`` after it was written.

Turn it on with ``StoreBuilder.with_ttl(ttl, by=...)`` (Processor API stores) or
``Materialized(...).with_ttl(...)`` (a DSL table or aggregation). ``by`` picks the clock:

- ``"record_time"``: an entry is stamped with the timestamp of the record that wrote it and
  expires once the task's stream time (the largest record timestamp it has taken, the record in
  progress included) reaches ``stamp + ttl``;
- ``"wall_clock"``: stamped with the wall clock when written, expires once the wall clock
  reaches ``stamp + ttl``.

Reads (``get``, ``range``, ``all``, interactive queries) never return an expired entry, whether
or not it was deleted yet, so what a reader sees does not depend on when the sweep ran. The sweep
deletes expired entries through the store's own write path (the cache, the changelog, a table's
downstream), so a delete goes to the changelog as a tombstone and a table forwards it. It runs as
a punctuation of the task (stream time for record time, wall clock for wall clock) and looks at
``sweep_entries`` entries per firing from a cursor that goes on where the last firing stopped: a
large store costs a bounded step per punctuation, never one pass on the loop.

The stamp is stored with the value (8 big-endian bytes in front of the value's bytes, in the
store and in its changelog alike), so a restored entry keeps its expiry time, and one restored
already expired stays invisible. Turning a TTL on or off for an existing store changes that
format: reset the application (or rename the store) when doing so.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from enum import Enum
from itertools import islice
from typing import Any

from streamloop.errors import TopologyError
from streamloop.state.bytes_stores import BytesStore, InMemoryBytesStore
from streamloop.state.store import KeyValueStore
from streamloop.state.timestamped import TimestampedKeyValueStore

_STAMP = struct.Struct(">q")
_NO_CAUSE = object()
# A store whose clock is not bound (a standby's copy) never finds an entry expired.
NEVER = -(2**63)
DEFAULT_SWEEP_ENTRIES = 1000
# The sweep runs every ``ttl`` of its clock, at most this long apart (and at least 1 ms).
MAX_DEFAULT_SWEEP_INTERVAL_MS = 60_000


class ExpiryClock(Enum):
    """What "now" an entry's time to live is measured on (``with_ttl(..., by=...)``)."""

    RECORD_TIME = "record_time"
    WALL_CLOCK = "wall_clock"


@dataclass(frozen=True)
class TimeToLive:
    """A store's time to live: ``ttl_ms`` on ``clock``; the sweep looks at ``sweep_entries`` entries
    every ``sweep_interval_ms`` of that clock."""

    ttl_ms: int
    clock: ExpiryClock
    sweep_interval_ms: int
    sweep_entries: int

    @classmethod
    def of(cls, store: str, ttl: timedelta | int, by: ExpiryClock | str,
           sweep_interval: timedelta | int | None, sweep_entries: int) -> TimeToLive:
        """Validated; a ``TopologyError`` names the store and the argument to fix."""
        ttl_ms = _millis(ttl, f"with_ttl() of store '{store}': ttl")
        try:
            clock = by if isinstance(by, ExpiryClock) else ExpiryClock(by)
        except ValueError:
            raise TopologyError(f"with_ttl() of store '{store}': by must be 'record_time' or 'wall_clock', "
                                f"got {by!r}") from None
        if sweep_interval is None:
            interval = min(ttl_ms, MAX_DEFAULT_SWEEP_INTERVAL_MS)
        else:
            interval = _millis(sweep_interval, f"with_ttl() of store '{store}': sweep_interval")
        if isinstance(sweep_entries, bool) or not isinstance(sweep_entries, int) or sweep_entries < 1:
            raise TopologyError(f"with_ttl() of store '{store}': sweep_entries must be an int >= 1 "
                                f"(entries the sweep looks at per punctuation), got {sweep_entries!r}")
        return cls(ttl_ms, clock, interval, sweep_entries)


def _millis(value: timedelta | int, what: str) -> int:
    if isinstance(value, timedelta):
        ms = value // timedelta(milliseconds=1)
    elif isinstance(value, int) and not isinstance(value, bool):
        ms = value
    else:
        raise TopologyError(f"{what} must be a timedelta or whole milliseconds (int), got {value!r}")
    if ms < 1:
        raise TopologyError(f"{what} must be at least 1 ms, got {value!r}")
    return ms


class TtlKeyValueStore(KeyValueStore):
    """A ``KeyValueStore`` whose entries expire (see the module docstring).

    Stored bytes are ``stamp + value bytes``; everything that reads them for a user strips the
    stamp and leaves out what expired. ``_get`` stays raw: the record journal keeps what it returns
    to put back on undo, stamp and all.
    """

    def __init__(self, *args: Any, ttl: TimeToLive, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ttl = ttl
        self._now: Callable[[], int] = _unbound
        # Where the next sweep step starts (None: at the first key); it wraps around at the end.
        self.cursor: bytes | None = None
        self.expired = 0
        # While the sweep deletes an entry: the source its tombstone is tagged with (see ``sweep``).
        self._cause: Any = _NO_CAUSE
        self._record_source = self._source
        self._source = self._update_source

    def bind_clock(self, now: Callable[[], int]) -> None:
        """``now()``: the current time on the store's clock (the task's stream or wall-clock time)."""
        self._now = now

    def _update_source(self) -> tuple[str, int] | None:
        cause = self._cause
        return self._record_source() if cause is _NO_CAUSE else cause

    def _stamp(self) -> int:
        """The time a write is stamped with: its record's timestamp, or the wall clock now."""
        return self._timestamp() if self.ttl.clock is ExpiryClock.RECORD_TIME else self._now()

    def _live(self, stored: bytes | None, horizon: int) -> bytes | None:
        """The value bytes of ``stored``; None when absent or stamped at or before ``horizon``."""
        if stored is None or _STAMP.unpack_from(stored)[0] <= horizon:
            return None
        return stored[_STAMP.size:]

    def _horizon(self) -> int:
        """Entries stamped at or before this have expired."""
        now = self._now()
        return NEVER if now == NEVER else now - self.ttl.ttl_ms

    # -- the typed API -------------------------------------------------------------------
    def get(self, key: Any) -> Any:
        self._check_open()
        return self.value_serde.deserialize(self._live(self._get(self._key(key)), self._horizon()))

    def put(self, key: Any, value: Any) -> None:
        data = None if value is None else self.value_serde.serialize(value)
        stored = None if data is None else _STAMP.pack(self._stamp()) + data
        self._write(self._key(key), stored, key, value)

    def _decode_value(self, value: bytes | None) -> Any:
        # What goes down to a table's listener: expired or not, it is what the store held.
        return self.value_serde.deserialize(None if value is None else value[_STAMP.size:])

    def _down(self, key: bytes, value: bytes | None, timestamp: int, source: tuple[str, int] | None,
              *objects: Any) -> None:
        """An update that has expired by the time it goes down (one that sat in the cache past its
        expiry, or a late record's) goes down as the delete a read already sees: the sweep walks
        the bytes store only, and would find it only at a later punctuation, if any came."""
        if value is not None and _STAMP.unpack_from(value)[0] <= self._horizon():
            value = None
            objects = (*objects[:1], None) if objects else ()
            self.expired += 1
        super()._down(key, value, timestamp, source, *objects)

    def _range(self, low: bytes | None, high: bytes | None) -> list[tuple[bytes, bytes]]:
        horizon = self._horizon()
        live = self._live
        found = []
        for key, stored in super()._range(low, high):
            value = live(stored, horizon)
            if value is not None:
                found.append((key, value))
        return found

    # -- the sweep -------------------------------------------------------------------------
    def sweep(self, now: int, cause: tuple[str, int] | None) -> int:
        """One bounded step: look at up to ``sweep_entries`` entries from the cursor and delete those
        expired at ``now``; returns how many were deleted. Caller: the task's sweep punctuation.

        Each tombstone is tagged with ``cause`` as its source: under record time, a record taken
        once stream time had reached ``now`` (``streamloop.tasks.expiry``). A restore applies it only
        when the commit covers that record, as every commit after this sweep does; from an earlier
        commit it is left out, and the records replayed from there see the entry as they did the
        first time (present until stream time passes its expiry again, when reads leave it out and
        a sweep deletes it). Covered by the commit after it, the tombstone stands in for every write
        of the key the record cache replaced with it.
        """
        if not self.open:
            return 0
        limit = self.ttl.sweep_entries
        batch = _scan(self.inner, self.cursor, limit)
        # The smallest key after the last one looked at; from the start again once at the end.
        self.cursor = batch[-1][0] + b"\x00" if len(batch) == limit else None
        horizon = now - self.ttl.ttl_ms
        deleted = 0
        for key, _stored in batch:
            # What a read finds, not what the bytes store holds: the cache may hold a newer value
            # (or a delete) that has not gone down yet.
            stored = self._get(key)
            if stored is not None and _STAMP.unpack_from(stored)[0] <= horizon:
                self._cause = cause
                try:
                    self._write(key, None)
                finally:
                    self._cause = _NO_CAUSE
                deleted += 1
        self.expired += deleted
        return deleted


class TtlTimestampedKeyValueStore(TimestampedKeyValueStore, TtlKeyValueStore):
    """A ``TimestampedKeyValueStore`` whose entries expire: ``put`` stamps a plain value as the
    timestamped store does, then the time to live stamps the ``ValueAndTimestamp`` bytes."""


def _scan(inner: BytesStore, low: bytes | None, limit: int) -> list[tuple[bytes, bytes]]:
    """Up to ``limit`` entries from ``low`` on, taken before any is deleted (a store's range may
    read its keys as it goes). RocksDB's range iterates lazily; the in-memory store's copies the
    keys it covers first, so it has a bounded scan of its own."""
    if isinstance(inner, InMemoryBytesStore):
        return inner.scan(low, limit)
    return list(islice(inner.range(low, None), limit))


def _unbound() -> int:
    return NEVER
