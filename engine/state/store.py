"""The stores processors use: typed key-value and window stores over a bytes store,
with the thread's record cache and the changelog in between.

A write goes into the cache when the store caches and the thread's cache has
room (``cache.max.bytes.buffering`` > 0); otherwise, and when the cache flushes
or evicts it, it goes *down*: into the bytes store, onto the changelog (to the
task's partition, tagged with the input record that caused it), and to the flush
listener, which is how a table forwards its updates downstream.

Reads never change the cache, so interactive queries may read from any thread.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import Any

from streamloop.serdes import BytesSerde, IntegerSerde, JsonSerde, LongSerde, Serde, StringSerde
from streamloop.state.bytes_stores import BytesStore
from streamloop.state.cache import CacheEntry, NamedCache, ThreadCache
from streamloop.state.cache import FlushListener as CacheFlush
from streamloop.state.changelog import Changelogger
from streamloop.state.segments import SegmentedBytesStore
from streamloop.state.uncommitted import UncommittedWrites
from streamloop.state.windows import Windowed

Source = Callable[[], "tuple[str, int] | None"]
# Key types whose serialised form cannot change while the object lives (same object, same bytes).
_IMMUTABLE_KEYS = frozenset({str, bytes, int})
_NO_KEY = object()
_UNSEEN: Any = object()
FlushListener = Callable[[Any, Any, int], None]
# The object classes each built-in serde gives back unchanged from its own bytes (equal value, same
# class): for these, the object written is what decoding its bytes would give, so a table forwards
# the object, as Kafka Streams does, instead of decoding what it just encoded. By exact serde class:
# a subclass may encode differently. orjson writes NaN as null, so floats are left out for JSON.
_EXACT: dict[type, frozenset[type]] = {
    BytesSerde: frozenset({bytes}),
    StringSerde: frozenset({str}),
    IntegerSerde: frozenset({int}),
    LongSerde: frozenset({int}),
    JsonSerde: frozenset({int, str}),
}
_NONE: frozenset[type] = frozenset()


def exact_classes(serde: Serde) -> frozenset[type]:
    """The classes whose objects ``serde`` decodes back to an equal object of the same class."""
    return _EXACT.get(type(serde), _NONE)


class StateStore:
    """The layers every store shares; ``KeyValueStore`` and ``WindowStore`` add the typed API."""

    def __init__(self, name: str, inner: BytesStore, key_serde: Serde, value_serde: Serde,
                 changelog: Changelogger | None, cache: ThreadCache | None, cache_name: str,
                 timestamp: Callable[[], int], source: Source) -> None:
        self.name = name
        self.inner = inner
        self.key_serde = key_serde
        self.value_serde = value_serde
        self.changelog = changelog
        self._cache = cache
        self._ns: NamedCache | None = cache.namespace(cache_name, self._flushed) if cache is not None else None
        self._timestamp = timestamp
        self._source = source
        self._listener: Callable[..., None] | None = None
        # Whether the listener also gets the value each update replaces (``set_flush_listener``).
        self._old_values = False
        # Called after a retried record's update of this store was undone (see ``Journal``): a
        # processor that keeps an index of the store in memory reloads it.
        self.undo_listener: Callable[[], None] | None = None
        self.writes = 0
        self.open = True
        # Set by the task manager while a record runs: the first write of each key records
        # what to put back if the record is retried (see ``Journal``).
        self.journal: Journal | None = None
        # The last key serialised (see ``_key``); a sentinel no key is identical to at first.
        self._last_key: Any = _NO_KEY
        self._last_key_bytes = b""
        self._exact_keys = exact_classes(key_serde)
        values = exact_classes(value_serde)
        # A built-in serde decodes no bytes (a delete) back to None.
        self._exact_values = values | {type(None)} if values else values

    @property
    def persistent(self) -> bool:
        return self.inner.persistent

    @property
    def durable(self) -> BytesStore:
        """The bytes store beneath the writes held until a commit (``streamloop.state.uncommitted``):
        where a restore and a standby write, what a checkpoint describes."""
        inner = self.inner
        return inner.base if isinstance(inner, UncommittedWrites) else inner

    @property
    def uncommitted(self) -> UncommittedWrites | None:
        inner = self.inner
        return inner if isinstance(inner, UncommittedWrites) else None

    @property
    def caching(self) -> bool:
        return self._ns is not None

    def set_flush_listener(self, listener: Callable[..., None], *, old_values: bool = False) -> None:
        """``listener(key, value, timestamp)`` for each update as it goes down (a table forwards it).

        With ``old_values``, ``listener(key, value, timestamp, old)``: ``old`` is the value the update
        replaces in the bytes store, which with a cache is the one forwarded last (Kafka Streams'
        ``sendOldValues``, which a table operation downstream such as a filter or a join needs).
        """
        self._listener = listener
        self._old_values = old_values

    def wrap_cache_flushes(self, wrap: Callable[[CacheFlush], CacheFlush]) -> None:
        """Have ``wrap(send)`` send this store's cached updates down (on a flush or an eviction)
        instead of ``send``; nothing without a cache. Caller: tracing (``streamloop.tasks.tracing``),
        which sends each update down in the context of the record that made it, once per task,
        so that a store without tracing pays nothing for it."""
        if self._ns is not None:
            self._ns.on_flush = wrap(self._ns.on_flush)

    # -- the write path ------------------------------------------------------------
    def _write(self, key: bytes, value: bytes | None, key_object: Any = _NO_KEY,
               value_object: Any = _NO_KEY) -> None:
        """``key_object``/``value_object``: what ``key``/``value`` encode, when the caller has it."""
        journal = self.journal
        if journal is not None and journal.active:
            journal.remember(self, key)
        cache, ns = self._cache, self._ns
        # ``cache.enabled`` inlined (a property call per write otherwise).
        if ns is not None and cache is not None and cache.max_bytes > 0:
            cache.put(ns, key, CacheEntry(value, self._timestamp(), self._source()))
        else:
            self._down(key, value, self._timestamp(), self._source(), key_object, value_object)

    def _down(self, key: bytes, value: bytes | None, timestamp: int, source: tuple[str, int] | None,
              key_object: Any = _NO_KEY, value_object: Any = _NO_KEY) -> None:
        listener = self._listener
        old = self.inner.get(key) if self._old_values else None
        self.inner.put(key, value, source)
        if self.changelog is not None:
            self.changelog.log(key, value, timestamp, source)
        self.writes += 1
        if listener is not None:
            # What goes down is forwarded as the objects written when decoding the bytes would give
            # them back unchanged (see ``_EXACT``); otherwise decoded, as a cache flush always is.
            if key_object.__class__ not in self._exact_keys:
                key_object = self._decode_key(key)
            if value_object.__class__ not in self._exact_values:
                value_object = self._decode_value(value)
            if self._old_values:
                listener(key_object, value_object, timestamp, self._decode_value(old))
            else:
                listener(key_object, value_object, timestamp)

    def _flushed(self, entries: list[tuple[bytes, CacheEntry]]) -> None:
        for key, entry in entries:
            self._down(key, entry.value, entry.timestamp, entry.source)

    def _decode_key(self, key: bytes) -> Any:
        return self.key_serde.deserialize(key)

    def _decode_value(self, value: bytes | None) -> Any:
        """A stored value as the user's object (a store that adds to the bytes strips it here)."""
        return self.value_serde.deserialize(value)

    # -- undo (a record to retry) ----------------------------------------------------
    def _before(self, key: bytes) -> tuple[CacheEntry | None, bytes | None]:
        ns = self._ns
        entry = ThreadCache.peek(ns, key) if ns is not None else None
        if entry is not None:
            entry = CacheEntry(entry.value, entry.timestamp, entry.source, entry.dirty)
        return entry, self.inner.get(key)

    def _undo(self, key: bytes, cached: CacheEntry | None, stored: bytes | None,
              source: tuple[str, int] | None) -> None:
        """Put ``key`` back as it was before the record: the store (with a compensating changelog
        update, tagged with the record, if the value went down meanwhile) and the cache entry."""
        if self.inner.get(key) != stored:
            self.inner.put(key, stored, source)
            if self.changelog is not None:
                self.changelog.log(key, stored, self._timestamp(), source)
        cache, ns = self._cache, self._ns
        if cache is not None and ns is not None:
            if cached is None:
                cache.discard(ns, key)
            else:
                cache.put(ns, key, cached)
        if self.undo_listener is not None:
            self.undo_listener()

    def _key(self, key: Any) -> bytes:
        if key is self._last_key and key.__class__ in _IMMUTABLE_KEYS:
            # An aggregation gets and then puts the record's own key object: serialise it once.
            return self._last_key_bytes
        if key is None:
            raise ValueError(f"State store '{self.name}': keys must not be None")
        data = self.key_serde.serialize(key)
        if data is None:
            raise ValueError(f"State store '{self.name}': key {key!r} serializes to None")
        self._last_key, self._last_key_bytes = key, data
        return data

    # -- the read path -------------------------------------------------------------
    def _get(self, key: bytes) -> bytes | None:
        ns = self._ns
        if ns is not None and ns.entries:  # ``ThreadCache.peek`` inlined; an empty cache holds nothing
            entry = ns.entries.get(key)
            if entry is not None:
                return entry.value
        value = self.inner.get(key)
        journal = self.journal
        if journal is not None and journal.active:
            # Read-modify-write (an aggregation) is the common case: what was just read is what a
            # write of the key must put back on undo, so the journal need not read it again.
            journal.seen(self, key, value)
        return value

    def _range(self, low: bytes | None, high: bytes | None) -> list[tuple[bytes, bytes]]:
        """Store entries overlaid with the cache's, in key order (deleted keys left out)."""
        ns = self._ns
        if ns is None or not ns.entries:
            return list(self.inner.range(low, high))
        merged: dict[bytes, bytes | None] = dict(self.inner.range(low, high))
        for key, entry in list(ns.entries.items()):
            if (low is None or key >= low) and (high is None or key <= high):
                merged[key] = entry.value
        return sorted((k, v) for k, v in merged.items() if v is not None)

    # -- task life cycle -------------------------------------------------------------
    def flush_cache(self) -> int:
        """Send the dirty cached updates down; caller: the task, between records."""
        if self._ns is None or self._cache is None:
            return 0
        return self._cache.flush(self._ns)

    def flush(self) -> None:
        self.inner.flush()

    def expire(self) -> int:
        """Drop entries past the store's retention (windowed stores); caller: the task, at a commit."""
        return 0

    def close(self) -> None:
        if not self.open:
            return
        self.open = False
        if self._ns is not None and self._cache is not None:
            self._cache.close(self._ns)
        self.inner.close()

    def _check_open(self) -> None:
        if not self.open:
            from streamloop.errors import InvalidStateStoreError
            raise InvalidStateStoreError(self.name, "is closed (its task moved or the client stopped)")


class Journal:
    """The store updates of the record in progress, to undo when it is retried.

    A record retried after a timeout back-off, or resumed after a PAUSE, runs its
    processors again from its source: updates its first attempt made must not stay,
    or they would be applied twice. Records that end (done, or skipped by CONTINUE)
    keep theirs. Caller: the task, around each record; stores call ``remember``.
    """

    __slots__ = ("_before", "_seen", "_source", "active")

    def __init__(self) -> None:
        self.active = False
        # Keyed by (store, key): a store hashes by identity, as ``id(store)`` would, without the call.
        self._before: dict[tuple[StateStore, bytes], tuple[StateStore, bytes, CacheEntry | None, bytes | None]] = {}
        # Stored values the record read of keys the cache did not hold: a key's pre-image if it
        # is written next (nothing else changes a store's key within a record but its writes).
        self._seen: dict[tuple[StateStore, bytes], bytes | None] = {}
        self._source: Source | None = None

    def begin(self, source: Source) -> None:
        self.active = True
        self._source = source
        if self._before:
            self._before = {}
        if self._seen:
            self._seen = {}

    def end(self) -> None:
        self.active = False
        if self._before:
            self._before = {}
        if self._seen:
            self._seen = {}

    def end_keeping(self) -> None:
        """``end``, keeping the record's pre-images: a record in flight done but not yet released may
        still be undone (a PAUSE below it: ``InFlightWindow``)."""
        self.active = False
        if self._seen:
            self._seen = {}

    def seen(self, store: StateStore, key: bytes, stored: bytes | None) -> None:
        """``stored`` was read from ``store``'s bytes store for ``key``, which its cache does not hold."""
        slot = (store, key)
        if slot not in self._before:  # after a write the store holds this record's value, not the old one
            self._seen[slot] = stored

    def remember_read(self, store: StateStore, key: bytes, stored: bytes | None) -> None:
        """``key`` is about to be written, and ``stored`` is what its bytes store held, just read by
        the caller (no cache holds the key): ``seen`` then ``remember`` in one call."""
        slot = (store, key)
        before = self._before
        if slot not in before:  # an earlier write of this record keeps its own pre-image
            before[slot] = (store, key, None, stored)

    def remember(self, store: StateStore, key: bytes) -> None:
        slot = (store, key)
        before = self._before
        if slot not in before:
            stored = self._seen.pop(slot, _UNSEEN)
            if stored is not _UNSEEN:
                # Not cached when read, and nothing of this record was written to it since.
                before[slot] = (store, key, None, stored)
                return
            cached, stored = store._before(key)
            before[slot] = (store, key, cached, stored)

    def undo(self) -> int:
        """Put every key the record wrote back as it was; returns how many."""
        before, self._before = self._before, {}
        self.active = False
        source = self._source() if self._source is not None else None
        for store, key, cached, stored in reversed(list(before.values())):
            if store.open:
                store._undo(key, cached, stored, source)
        return len(before)


class KeyValueStore(StateStore):
    """A task's key-value store (Kafka Streams' ``KeyValueStore``); ``None`` values mean absent."""

    def get(self, key: Any) -> Any:
        if not self.open:
            self._check_open()
        return self.value_serde.deserialize(self._get(self._key(key)))

    def put(self, key: Any, value: Any) -> None:
        """Store ``value`` under ``key``; ``None`` deletes it."""
        self._write(self._key(key), None if value is None else self.value_serde.serialize(value), key, value)

    def aggregate(self, key: Any, value: Any, initializer: Callable[[], Any],
                  aggregator: Callable[[Any, Any, Any], Any]) -> None:
        """An aggregation's update of ``key`` as one call: ``get``, then ``put`` of
        ``aggregator(key, value, old or initializer())``, with the key serialised once.
        Caller: ``AggregateProcessor``, for a store of exactly this class (a subclass's ``get``
        and ``put`` may do more, as a TTL store's do)."""
        if not self.open:
            self._check_open()
        data = self._key(key)
        serde = self.value_serde
        ns, cache = self._ns, self._cache
        if ns is None or (cache is not None and cache.max_bytes <= 0 and not ns.entries):
            # No cache (none for this store, or the thread's is 0 bytes and holds nothing of it):
            # ``_get`` and ``_write`` inlined, as they would run, and the value just read is the
            # journal's pre-image (three calls fewer per record).
            stored = self.inner.get(data)
            old = serde.deserialize(stored)
            new = aggregator(key, value, initializer() if old is None else old)
            journal = self.journal
            if journal is not None and journal.active:
                journal.remember_read(self, data, stored)
            self._down(data, None if new is None else serde.serialize(new), self._timestamp(), self._source(),
                       key, new)
            return
        old = serde.deserialize(self._get(data))
        new = aggregator(key, value, initializer() if old is None else old)
        self._write(data, None if new is None else serde.serialize(new), key, new)

    def put_if_absent(self, key: Any, value: Any) -> Any:
        """Store ``value`` unless the key has one; returns the value it had (None if none)."""
        old = self.get(key)
        if old is None:
            self.put(key, value)
        return old

    def delete(self, key: Any) -> Any:
        """Remove ``key``; returns the value it had."""
        old = self.get(key)
        if old is not None:
            self.put(key, None)
        return old

    def range(self, low: Any, high: Any) -> Iterator[tuple[Any, Any]]:
        """Entries with keys from ``low`` to ``high`` (inclusive; None is open) in serialized-key order."""
        self._check_open()
        lo = None if low is None else self._key(low)
        hi = None if high is None else self._key(high)
        decode_key, decode_value = self.key_serde.deserialize, self.value_serde.deserialize
        for key, value in self._range(lo, hi):
            yield decode_key(key), decode_value(value)

    def all(self) -> Iterator[tuple[Any, Any]]:
        return self.range(None, None)

    def approximate_num_entries(self) -> int:
        return self.inner.approximate_num_entries()

    def raw_items(self) -> list[tuple[bytes, bytes]]:
        return self._range(None, None)



_START = struct.Struct(">q")


class WindowStore(StateStore):
    """A task's window store: values per (key, window start), kept for ``retention_ms``.

    A stored key is the serialized key followed by the window start as 8 bytes
    big-endian, so one key's windows are adjacent and in time order. A window is kept
    while its end is within the retention of stream time (the newest window start put):
    reads leave out older ones, and expiry drops them, by whole segments when the bytes
    store is segmented (``streamloop.state.segments``; the task's stores are).
    """

    def __init__(self, *args: Any, window_size_ms: int, retention_ms: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.window_size_ms = window_size_ms
        self.retention_ms = retention_ms
        self.observed_time = -1
        self._expired_at = -1
        durable = self.durable
        self._segments = durable if isinstance(durable, SegmentedBytesStore) else None
        self._window_key_classes = exact_classes(self.key_serde)
        self._exact_keys = frozenset({Windowed})

    def _window_time(self) -> int:
        """The newest window start put: through this store, or beneath it (a restore's)."""
        segments = self._segments
        if segments is not None and segments.observed > self.observed_time:
            return segments.observed
        return self.observed_time

    def _live_from(self) -> int:
        """The oldest window start within the retention."""
        return self._window_time() - self.retention_ms - self.window_size_ms + 1

    def put(self, key: Any, value: Any, window_start: int) -> None:
        if window_start > self.observed_time:
            self.observed_time = window_start
        data = None if value is None else self.value_serde.serialize(value)
        if self._listener is not None and key.__class__ in self._window_key_classes:
            # Down as the window written, not decoded from the bytes just encoded (``_down``).
            self._write(self._composite(key, window_start), data, Windowed(key, window_start,
                                                                           window_start + self.window_size_ms), value)
        else:
            self._write(self._composite(key, window_start), data)

    def fetch(self, key: Any, window_start: int) -> Any:
        """The value of ``key`` in the window starting at ``window_start`` (None if none)."""
        self._check_open()
        if window_start < self._live_from():
            return None
        return self._decode_value(self._get(self._composite(key, window_start)))

    def fetch_range(self, key: Any, time_from: int, time_to: int) -> Iterator[tuple[int, Any]]:
        """``(window_start, value)`` of ``key``'s windows starting within ``[time_from, time_to]``."""
        self._check_open()
        raw_key = self._key(key)
        low = raw_key + _START.pack(max(time_from, self._live_from(), 0))
        high = raw_key + _START.pack(max(time_to, 0))
        for stored, value in self._range(low, high):
            if len(stored) == len(raw_key) + 8:
                yield _START.unpack(stored[-8:])[0], self._decode_value(value)

    def fetch_all(self, time_from: int, time_to: int) -> Iterator[tuple[Windowed, Any]]:
        """Every ``(Windowed(key, start, end), value)`` with a start within ``[time_from, time_to]``."""
        self._check_open()
        time_from = max(time_from, self._live_from())
        for stored, value in self._range(None, None):
            start = _START.unpack(stored[-8:])[0]
            if time_from <= start <= time_to:
                yield self._decode_key(stored), self._decode_value(value)

    def all(self) -> Iterator[tuple[Windowed, Any]]:
        return self.fetch_all(0, 2**63 - 1)

    def expire(self) -> int:
        """Drop windows older than the retention (locally; the changelog's retention drops them there).

        Segmented: the segments now wholly past it, without reading the store; returns how many."""
        if self._segments is not None:
            # Persistent: the segments move with what each commit writes (``SegmentedBytesStore.write_batch``):
            # dropping by the time of writes no commit covers yet would leave a disk no commit had.
            return 0 if self.uncommitted is not None else self._segments.advance(self.observed_time)
        horizon = self.observed_time - self.retention_ms
        # A sweep reads the whole store: do it once per window size of stream time, not per commit.
        if horizon <= 0 or self.observed_time - self._expired_at < self.window_size_ms:
            return 0
        self._expired_at = self.observed_time
        stale = [k for k, _ in self._range(None, None) if _START.unpack(k[-8:])[0] + self.window_size_ms <= horizon]
        for key in stale:
            self.inner.put(key, None)
        return len(stale)

    def _decode_key(self, key: bytes) -> Windowed:
        start = _START.unpack(key[-8:])[0]
        return Windowed(self.key_serde.deserialize(key[:-8]), start, start + self.window_size_ms)

    def _composite(self, key: Any, window_start: int) -> bytes:
        if window_start < 0:
            raise ValueError(f"State store '{self.name}': window start must be >= 0, got {window_start}")
        return self._key(key) + _START.pack(window_start)
