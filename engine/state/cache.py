"""``ThreadCache``: the record cache a stream thread's tasks share (``cache.max.bytes.buffering``).

A store with caching writes into its own namespace of the thread's cache instead
of straight to the store and its changelog. Updates of one key coalesce in the
cache; the dirty entries go down (store, changelog, downstream) when the task
flushes, which happens before each commit, or one at a time when the cache is
over its size and evicts its least recently used entry. The cache's size is the
thread's share of the client total and changes when threads are added or
removed; a size of 0 turns caching off (every update goes down at once).

Caller: the thread's own loop for writes and flushes. Interactive queries read
with ``peek`` from other threads: it never reorders or changes anything.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

# Bookkeeping per entry beyond key and value bytes (the entry object, the dict slot).
ENTRY_OVERHEAD = 64


@dataclass(slots=True)
class CacheEntry:
    value: bytes | None
    timestamp: int
    # The input record that caused the update, as ``(topic, offset)``; None from a punctuation.
    source: tuple[str, int] | None
    dirty: bool = True

    def size(self, key: bytes) -> int:
        return len(key) + (len(self.value) if self.value is not None else 0) + ENTRY_OVERHEAD


FlushListener = Callable[[list[tuple[bytes, CacheEntry]]], None]


class NamedCache:
    """One store's part of the cache (one store of one task)."""

    __slots__ = ("name", "entries", "bytes", "on_flush")

    def __init__(self, name: str, on_flush: FlushListener) -> None:
        self.name = name
        self.entries: OrderedDict[bytes, CacheEntry] = OrderedDict()
        self.bytes = 0
        self.on_flush = on_flush


class ThreadCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.size_bytes = 0
        self.evictions = 0
        self.flushes = 0
        self._caches: dict[str, NamedCache] = {}

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def resize(self, max_bytes: int) -> None:
        """A new share; entries over it are evicted by the next writes (on the thread's loop)."""
        self.max_bytes = max_bytes

    def namespace(self, name: str, on_flush: FlushListener) -> NamedCache:
        if name in self._caches:
            raise ValueError(f"cache namespace '{name}' is already in use")
        cache = self._caches[name] = NamedCache(name, on_flush)
        return cache

    def get(self, cache: NamedCache, key: bytes) -> CacheEntry | None:
        entry = cache.entries.get(key)
        if entry is not None:
            cache.entries.move_to_end(key)
        return entry

    @staticmethod
    def peek(cache: NamedCache, key: bytes) -> CacheEntry | None:
        return cache.entries.get(key)

    def put(self, cache: NamedCache, key: bytes, entry: CacheEntry) -> None:
        old = cache.entries.pop(key, None)
        delta = entry.size(key) - old.size(key) if old is not None else entry.size(key)
        cache.entries[key] = entry
        cache.bytes += delta
        self.size_bytes += delta
        # Only the namespace being written evicts (as Kafka Streams does): an eviction
        # forwards records downstream, which must happen inside the task that owns them.
        while self.size_bytes > self.max_bytes and cache.entries:
            self._evict(cache)

    def _evict(self, cache: NamedCache) -> None:
        key, entry = cache.entries.popitem(last=False)
        size = entry.size(key)
        cache.bytes -= size
        self.size_bytes -= size
        self.evictions += 1
        if entry.dirty:
            cache.on_flush([(key, entry)])

    def flush(self, cache: NamedCache) -> int:
        """Send every dirty entry down in the order of last update; they stay cached, clean."""
        dirty = [(k, e) for k, e in cache.entries.items() if e.dirty]
        if not dirty:
            return 0
        for _key, entry in dirty:
            entry.dirty = False
        self.flushes += 1
        cache.on_flush(dirty)
        return len(dirty)

    def discard(self, cache: NamedCache, key: bytes) -> None:
        """Drop ``key``'s entry without sending it down (undoing an update of a record to retry)."""
        entry = cache.entries.pop(key, None)
        if entry is not None:
            size = entry.size(key)
            cache.bytes -= size
            self.size_bytes -= size

    def close(self, cache: NamedCache) -> None:
        """Drop a namespace and its entries, dirty or not (the caller flushed first if it had to)."""
        if self._caches.pop(cache.name, None) is None:
            return
        self.size_bytes -= cache.bytes
        cache.entries.clear()
        cache.bytes = 0
