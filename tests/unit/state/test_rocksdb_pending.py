"""RocksDB store writes wait in a dict and go down in write batches: reads and ranges see them
all the time, and a flush or a clean close leaves everything on disk."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("rocksdict")

from streamloop.state.bytes_stores import InMemoryBytesStore, RocksDBBytesStore


class SmallBatches(RocksDBBytesStore):
    PENDING_ENTRIES = 7  # batches written every few updates, so both layers hold keys
    PENDING_BYTES = 1 << 20


def test_reads_and_ranges_agree_with_a_plain_store_whatever_is_pending(tmp_path) -> None:
    rng = random.Random(22)
    rocks, plain = SmallBatches("s", str(tmp_path / "s")), InMemoryBytesStore("s")
    rocks.open()
    plain.open()
    try:
        keys = [bytes([rng.randrange(256) for _ in range(rng.randrange(1, 3))]) for _ in range(40)]
        for step in range(1500):
            key = rng.choice(keys)
            value = None if rng.random() < 0.3 else f"{step}".encode()
            rocks.put(key, value)
            plain.put(key, value)
            assert rocks.get(key) == value
            if step % 25 == 0:
                low, high = sorted(rng.sample(keys, 2))
                bounds = [(None, None), (low, None), (None, high), (low, high)][step // 25 % 4]
                assert list(rocks.range(*bounds)) == list(plain.range(*bounds)), (step, bounds)
        assert all(rocks.get(k) == plain.get(k) for k in keys)
    finally:
        rocks.close()


def test_writes_are_batched_and_a_clean_close_keeps_the_pending_ones(tmp_path) -> None:
    store = SmallBatches("s", str(tmp_path / "s"))
    store.open()
    for i in range(10):
        store.put(b"k%d" % i, b"v%d" % i)
    store.put(b"k0", None)
    # 7 went down in one batch; the rest wait, yet a read sees them and the deletion.
    assert len(store._pending) == 4
    assert store.get(b"k9") == b"v9" and store.get(b"k0") is None
    assert store.approximate_num_entries() >= 4
    store.close()

    again = RocksDBBytesStore("s", str(tmp_path / "s"))
    again.open()
    try:
        assert list(again.range(None, None)) == [(b"k%d" % i, b"v%d" % i) for i in range(1, 10)]
    finally:
        again.close()


def test_a_flush_writes_what_is_pending_and_a_wipe_forgets_it(tmp_path) -> None:
    store = RocksDBBytesStore("s", str(tmp_path / "s"))
    store.open()
    try:
        store.put(b"a", b"1")
        store.flush()
        assert store._pending == {} and store._db.get(b"a") == b"1"
        store.put(b"b", b"2")
        store.wipe()
        assert list(store.range(None, None)) == [] and store.get(b"b") is None
    finally:
        store.close()
