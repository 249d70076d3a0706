"""Bytes stores keep their keys in order as they come and go: a range from the writing thread
(which reads the ordered keys in place) and from another thread (which copies them) both give
exactly the stored entries within the bounds, in key order."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest

from streamloop.state.bytes_stores import InMemoryBytesStore, RocksDBBytesStore


class SmallBatches(RocksDBBytesStore):
    PENDING_ENTRIES = 11  # some keys pending, some written: both layers take part in a range


def stores(tmp_path: Any) -> list[Any]:
    made: list[Any] = [InMemoryBytesStore("s")]
    try:
        import rocksdict  # noqa: F401
    except ImportError:
        return made
    made.append(SmallBatches("s", str(tmp_path / "s")))
    return made


def from_another_thread(store: Any, low: bytes | None, high: bytes | None) -> list[tuple[bytes, bytes]]:
    result: list[tuple[bytes, bytes]] = []
    reader = threading.Thread(target=lambda: result.extend(store.range(low, high)))
    reader.start()
    reader.join(timeout=10)
    assert not reader.is_alive()
    return result


@pytest.mark.parametrize("which", [0, 1], ids=["memory", "rocksdb"])
def test_ranges_from_any_thread_match_the_entries_in_key_order(tmp_path, which: int) -> None:
    available = stores(tmp_path)
    if which >= len(available):
        pytest.skip("rocksdict is not installed")
    store = available[which]
    store.open()
    rng = random.Random(24)
    model: dict[bytes, bytes] = {}
    keys = [bytes([rng.randrange(256) for _ in range(rng.randrange(1, 4))]) for _ in range(60)]
    try:
        for step in range(1200):
            key = rng.choice(keys)
            value = None if rng.random() < 0.3 else f"{step}".encode()
            store.put(key, value)
            if value is None:
                model.pop(key, None)
            else:
                model[key] = value
            if step % 20 == 0:
                low, high = sorted(rng.sample(keys, 2))
                for bounds in [(None, None), (low, None), (None, high), (low, high)]:
                    lo, hi = bounds
                    expected = sorted((k, v) for k, v in model.items()
                                      if (lo is None or k >= lo) and (hi is None or k <= hi))
                    assert list(store.range(lo, hi)) == expected, (step, bounds)
                    assert from_another_thread(store, lo, hi) == expected, (step, bounds)
        store.wipe()
        assert list(store.range(None, None)) == [] == from_another_thread(store, None, None)
    finally:
        store.close()
