"""The thread's record cache: bounded, coalescing, evicting least recently used first."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streamloop.state.cache import ENTRY_OVERHEAD, CacheEntry, ThreadCache


def entry(value: bytes | None) -> CacheEntry:
    return CacheEntry(value, 0, None)


def test_updates_of_one_key_coalesce_until_flush() -> None:
    flushed: list[tuple[bytes, bytes | None]] = []
    cache = ThreadCache(10_000)
    ns = cache.namespace("0_0/s", lambda entries: flushed.extend((k, e.value) for k, e in entries))
    for i in range(100):
        cache.put(ns, b"k", entry(str(i).encode()))
    cache.put(ns, b"j", entry(b"x"))
    assert flushed == []
    assert cache.flush(ns) == 2
    assert flushed == [(b"k", b"99"), (b"j", b"x")]
    # Flushed entries stay cached but clean: a second flush sends nothing.
    assert cache.flush(ns) == 0
    assert ThreadCache.peek(ns, b"k") is not None


def test_over_its_size_the_cache_evicts_least_recently_used_dirty_entries_down() -> None:
    flushed: list[bytes] = []
    size = 3 * (1 + 1 + ENTRY_OVERHEAD)
    cache = ThreadCache(size)
    ns = cache.namespace("0_0/s", lambda entries: flushed.extend(k for k, _ in entries))
    for key in (b"a", b"b", b"c"):
        cache.put(ns, key, entry(b"1"))
    cache.get(ns, b"a")  # a is now the most recently used
    cache.put(ns, b"d", entry(b"1"))
    assert flushed == [b"b"]
    assert cache.size_bytes <= size
    assert cache.evictions == 1


def test_size_zero_disables_caching() -> None:
    assert not ThreadCache(0).enabled


def test_resize_takes_effect_on_the_next_write() -> None:
    flushed: list[bytes] = []
    cache = ThreadCache(1_000_000)
    ns = cache.namespace("0_0/s", lambda entries: flushed.extend(k for k, _ in entries))
    for i in range(10):
        cache.put(ns, str(i).encode(), entry(b"v"))
    cache.resize(2 * (1 + 1 + ENTRY_OVERHEAD))
    cache.put(ns, b"z", entry(b"v"))
    assert cache.size_bytes <= cache.max_bytes
    assert flushed[:9] == [str(i).encode() for i in range(9)]


def test_closing_a_namespace_returns_its_bytes() -> None:
    cache = ThreadCache(1_000_000)
    one = cache.namespace("0_0/s", lambda _e: None)
    two = cache.namespace("0_1/s", lambda _e: None)
    cache.put(one, b"a", entry(b"12345"))
    cache.put(two, b"b", entry(b"1"))
    cache.close(one)
    assert cache.size_bytes == 1 + 1 + ENTRY_OVERHEAD


@given(st.integers(min_value=0, max_value=2_000),
       st.lists(st.tuples(st.binary(min_size=1, max_size=8), st.binary(max_size=64)), max_size=200))
def test_never_holds_more_than_its_share_and_loses_no_update(max_bytes: int, writes) -> None:
    down: dict[bytes, bytes] = {}
    cache = ThreadCache(max_bytes)
    ns = cache.namespace("t/s", lambda entries: down.update((k, e.value) for k, e in entries))
    for key, value in writes:
        if cache.enabled:
            cache.put(ns, key, entry(value))
        else:
            down[key] = value
        assert cache.size_bytes <= max(max_bytes, 0) or not ns.entries
    cache.flush(ns)
    assert down == dict(writes)
