"""Segmented bytes stores (``streamloop.state.segments``): which segments a read touches, what a drop
leaves, that writes do not bring a dropped segment back, and the RocksDB layout across reopens."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamloop.state.bytes_stores import RocksDBBytesStore
from streamloop.state.segments import (
    MemorySegments,
    RocksDBSegments,
    SegmentedBytesStore,
    layout_reset,
    segment_interval,
)

pytest.importorskip("rocksdict")

TS = struct.Struct(">q")
INTERVAL = 60_000


def key(name: str, time: int) -> bytes:
    return name.encode() + TS.pack(time)


class CountingSegments(MemorySegments):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.read: list[int] = []

    def range(self, segment: int, low: bytes | None, high: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        self.read.append(segment)
        return super().range(segment, low, high)


def memory_store(span: int = 2 * INTERVAL) -> tuple[SegmentedBytesStore, CountingSegments]:
    segments = CountingSegments("w")
    return SegmentedBytesStore("w", segments, suffix=8, interval_ms=INTERVAL, span_ms=span), segments


def test_the_interval_is_half_the_retention_and_at_least_a_minute() -> None:
    assert segment_interval(3_600_000) == 1_800_000
    assert segment_interval(10_000) == 60_000


def test_a_time_range_of_one_key_reads_only_the_segments_of_those_times() -> None:
    store, segments = memory_store(span=10 * INTERVAL)
    for t in range(0, 5 * INTERVAL, INTERVAL // 2):
        store.put(key("a", t), b"%d" % t)
        store.put(key("b", t), b"b")
    segments.read.clear()
    found = list(store.range(key("a", INTERVAL), key("a", 2 * INTERVAL + 1)))
    assert segments.read == [1, 2]
    assert found == [(key("a", t), b"%d" % t) for t in (INTERVAL, INTERVAL + INTERVAL // 2, 2 * INTERVAL)]
    segments.read.clear()
    # Any other range reads every segment, merged in key order.
    everything = list(store.range(None, None))
    assert segments.read == [0, 1, 2, 3, 4]
    assert [k for k, _ in everything] == sorted(k for k, _ in everything)
    assert len(everything) == 20


def test_stream_time_drops_whole_segments_and_a_late_write_does_not_bring_one_back() -> None:
    store, segments = memory_store(span=2 * INTERVAL)
    store.put(key("a", 10), b"old")
    store.put(key("a", INTERVAL + 10), b"kept")
    assert segments.ids() == [0, 1]
    # Stream time 3 intervals + 20: times from interval + 20 on are live, so only segment 0 goes.
    store.put(key("a", 3 * INTERVAL + 20), b"new")
    assert segments.ids() == [1, 3]
    assert store.get(key("a", 10)) is None
    store.put(key("a", 20), b"late")  # a cached or held write reaching the store after the drop
    store.write_batch([(key("b", 30), b"late too"), (key("a", INTERVAL + 10), b"updated")])
    assert segments.ids() == [1, 3]
    assert [k for k, _ in store.range(None, None)] == [key("a", INTERVAL + 10), key("a", 3 * INTERVAL + 20)]
    assert store.get(key("a", INTERVAL + 10)) == b"updated"
    assert store.advance(5 * INTERVAL) == 1  # segment 1; segment 3 holds times from 3 intervals on
    assert segments.ids() == [3]


def test_a_rocksdb_store_keeps_its_stream_time_and_its_drops_across_a_reopen(tmp_path: Path) -> None:
    def opened() -> SegmentedBytesStore:
        store = SegmentedBytesStore("w", RocksDBSegments(RocksDBBytesStore("w", str(tmp_path / "w"))),
                                    suffix=8, interval_ms=INTERVAL, span_ms=2 * INTERVAL)
        store.open()
        return store

    store = opened()
    store.write_batch([(key("a", 10), b"1"), (key("b", INTERVAL), b"2")])
    store.write_batch([(key("a", 3 * INTERVAL + 5), b"3")])  # drops segment 0 with delete_range
    assert store.observed == 3 * INTERVAL + 5
    store.close()
    store = opened()
    assert not store.reset and not layout_reset(store)
    assert store.observed == 3 * INTERVAL + 5
    assert store.segments.ids() == [1, 3]
    assert list(store.range(None, None)) == [(key("a", 3 * INTERVAL + 5), b"3"), (key("b", INTERVAL), b"2")]
    assert store.get(key("a", 10)) is None
    store.close()


def test_a_rocksdb_store_of_the_layout_before_segments_is_wiped_and_says_so(tmp_path: Path) -> None:
    old = RocksDBBytesStore("w", str(tmp_path / "w"))
    old.open()
    old.write_batch([(key("a", 10), b"1")])
    old.close()
    store = SegmentedBytesStore("w", RocksDBSegments(RocksDBBytesStore("w", str(tmp_path / "w"))),
                                suffix=8, interval_ms=INTERVAL, span_ms=2 * INTERVAL)
    store.open()
    assert layout_reset(store)
    assert list(store.range(None, None)) == []
    store.close()
