"""Stores: bytes stores (memory and RocksDB) and the typed layers with cache and changelog."""

from __future__ import annotations

from typing import Any

import pytest

from streamloop.errors import InvalidStateStoreError
from streamloop.records import TopicPartition
from streamloop.serdes import JsonSerde, LongSerde, StringSerde
from streamloop.state import checkpoint
from streamloop.state.bytes_stores import InMemoryBytesStore, RocksDBBytesStore
from streamloop.state.cache import ThreadCache
from streamloop.state.changelog import Changelogger, decode_source
from streamloop.state.store import KeyValueStore, WindowStore

STR, LONG = StringSerde(), LongSerde()


@pytest.fixture(params=["memory", "rocksdb"])
def bytes_store(request, tmp_path) -> Any:
    if request.param == "memory":
        store: Any = InMemoryBytesStore("s")
    else:
        store = RocksDBBytesStore("s", str(tmp_path / "s"))
    store.open()
    yield store
    store.close()


def test_bytes_store_put_get_delete_and_sorted_range(bytes_store: Any) -> None:
    for key in (b"b", b"a", b"d", b"c"):
        bytes_store.put(key, key.upper())
    bytes_store.put(b"c", None)
    assert bytes_store.get(b"a") == b"A"
    assert bytes_store.get(b"c") is None
    assert list(bytes_store.range(b"b", None)) == [(b"b", b"B"), (b"d", b"D")]
    assert list(bytes_store.range(None, b"b")) == [(b"a", b"A"), (b"b", b"B")]
    bytes_store.wipe()
    assert list(bytes_store.range(None, None)) == []


def test_rocksdb_store_keeps_its_data_across_reopen(tmp_path) -> None:
    store = RocksDBBytesStore("s", str(tmp_path / "s"))
    store.open()
    store.put(b"k", b"v")
    store.close()
    again = RocksDBBytesStore("s", str(tmp_path / "s"))
    again.open()
    assert again.get(b"k") == b"v"
    again.close()


class Log:
    def __init__(self) -> None:
        self.records: list[tuple[str, int, bytes, bytes | None, int, Any]] = []

    def __call__(self, topic: str, partition: int, key: bytes, value: bytes | None, ts: int, headers: Any) -> None:
        self.records.append((topic, partition, key, value, ts, headers))


def kv(cache: ThreadCache | None, log: Log, source: tuple[str, int] | None = ("in", 7)) -> KeyValueStore:
    return KeyValueStore("counts", InMemoryBytesStore("counts"), STR, LONG,
                         Changelogger("app-counts-changelog", 3, log),
                         cache, "0_3/counts", lambda: 42, lambda: source)


def test_rocksdb_store_writes_no_write_ahead_log_and_a_flush_persists(tmp_path) -> None:
    """As Kafka Streams: the changelog is the log, so RocksDB keeps no WAL of its own (each put
    would be written twice); what a clean close flushed is there after a reopen."""
    directory = str(tmp_path / "db")
    store = RocksDBBytesStore("counts", directory)
    store.open()
    for i in range(1000):
        store.put(f"k{i}".encode(), b"x" * 100)
    wal = [p for p in (tmp_path / "db").iterdir() if p.suffix == ".log"]
    assert wal and all(p.stat().st_size == 0 for p in wal), [(p.name, p.stat().st_size) for p in wal]
    store.flush()
    store.close()
    store.open()
    assert store.get(b"k999") == b"x" * 100
    store.close()


def test_uncached_writes_go_to_the_changelog_of_the_task_partition_with_their_source() -> None:
    log, down = Log(), []
    store = kv(None, log)
    store.set_flush_listener(lambda k, v, ts: down.append((k, v, ts)))
    store.put("a", 1)
    store.put("a", 2)
    assert store.get("a") == 2
    assert [(t, p, k, LONG.deserialize(v)) for t, p, k, v, _, _ in log.records] == [
        ("app-counts-changelog", 3, b"a", 1), ("app-counts-changelog", 3, b"a", 2)]
    assert decode_source(log.records[0][5]) == ("in", 7)
    assert down == [("a", 1, 42), ("a", 2, 42)]


class UpperSerde:
    """A custom serde whose bytes do not decode back to the object written."""

    def serialize(self, value: str | None) -> bytes | None:
        return None if value is None else value.upper().encode()

    def deserialize(self, data: bytes | None) -> str | None:
        return None if data is None else data.decode()


@pytest.mark.parametrize(("key_serde", "value_serde", "key", "value", "forwarded"), [
    (STR, LONG, "a", 7, ("a", 7)),
    (STR, LONG, "a", None, ("a", None)),
    # JSON gives a tuple back as a list, a float NaN as None: the decoded value goes on, not the object.
    (STR, JsonSerde(), "a", (1, 2), ("a", [1, 2])),
    (STR, JsonSerde(), "a", float("inf"), ("a", None)),
    (STR, JsonSerde(), "a", "x", ("a", "x")),
    (UpperSerde(), UpperSerde(), "a", "b", ("A", "B")),
])
def test_an_uncached_update_goes_to_the_listener_as_its_bytes_decode(key_serde: Any, value_serde: Any, key: Any,
                                                                     value: Any, forwarded: tuple[Any, Any]) -> None:
    """A table forwards what its store holds: the objects written are passed on only where decoding their
    bytes gives them back unchanged (built-in serdes of scalars), else the decoded bytes."""
    down: list[tuple[Any, Any]] = []
    store = KeyValueStore("s", InMemoryBytesStore("s"), key_serde, value_serde, None, None, "0_0/s",
                          lambda: 1, lambda: None)
    store.set_flush_listener(lambda k, v, _ts: down.append((k, v)))
    store.put(key, value)
    assert down == [forwarded]
    assert [type(x) for x in down[0]] == [type(x) for x in forwarded]


def test_cached_writes_go_down_coalesced_on_flush_and_reads_see_them_before() -> None:
    log, down = Log(), []
    store = kv(ThreadCache(1 << 20), log)
    store.set_flush_listener(lambda k, v, ts: down.append((k, v)))
    for i in range(5):
        store.put("a", i)
    store.put("b", 1)
    store.delete("b")
    assert store.get("a") == 4 and store.get("b") is None
    assert list(store.all()) == [("a", 4)]
    assert log.records == [] and down == []
    store.flush_cache()
    assert down == [("a", 4), ("b", None)]
    assert [(k, v) for _, _, k, v, _, _ in log.records] == [(b"a", LONG.serialize(4)), (b"b", None)]


def test_range_merges_cache_and_store() -> None:
    store = kv(ThreadCache(1 << 20), Log())
    for key in ("a", "c", "e"):
        store.put(key, 1)
    store.flush_cache()
    store.put("b", 2)
    store.put("c", None)
    assert list(store.range("a", "d")) == [("a", 1), ("b", 2)]


def test_a_closed_store_is_an_error_to_read() -> None:
    store = kv(None, Log())
    store.close()
    with pytest.raises(InvalidStateStoreError, match="'counts'"):
        store.get("a")


def test_none_keys_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'counts': keys must not be None"):
        kv(None, Log()).put(None, 1)


def test_window_store_fetches_one_keys_windows_in_time_order_and_expires_old_ones() -> None:
    store = WindowStore("w", InMemoryBytesStore("w"), STR, LONG, None, None, "0_0/w", lambda: 0, lambda: None,
                        window_size_ms=10, retention_ms=30)
    store.put("a", 1, 0)
    store.put("a", 2, 10)
    store.put("ab", 9, 10)  # a longer key with the same prefix is not "a"
    store.put("a", 3, 20)
    assert list(store.fetch_range("a", 0, 15)) == [(0, 1), (10, 2)]
    assert store.fetch("ab", 10) == 9
    store.put("a", 4, 50)
    # At time 50 with 30 ms retention, windows ending by 20 go: a@0, a@10 and ab@10.
    assert store.expire() == 3
    assert [(w.key, w.start) for w, _ in store.all()] == [("a", 20), ("a", 50)]


def test_checkpoint_round_trip_and_corrupt_file_reads_as_missing(tmp_path) -> None:
    offsets = {TopicPartition("app-s-changelog", 2): 17}
    checkpoint.write(str(tmp_path), offsets)
    assert checkpoint.read(str(tmp_path)) == offsets
    (tmp_path / checkpoint.FILE_NAME).write_text('{"version": 1, "offsets": [["t", "x"]]}')
    assert checkpoint.read(str(tmp_path)) == {}
    (tmp_path / checkpoint.FILE_NAME).write_bytes(b"\x00\xff")
    assert checkpoint.read(str(tmp_path)) == {}
    checkpoint.remove(str(tmp_path))
    assert checkpoint.read(str(tmp_path)) == {}


def test_restore_applies_updates_of_records_that_will_not_be_processed_again() -> None:
    from streamloop.state.restore import ProcessedInput

    committed = ProcessedInput(10, frozenset({12, 15}))
    assert [o for o in range(8, 17) if committed.covers(o)] == [8, 9, 12, 15]


def test_the_journal_puts_a_records_updates_back_in_store_cache_and_changelog() -> None:
    from streamloop.state.store import Journal

    log = Log()
    cache = ThreadCache(1 << 20)
    store = kv(cache, log)
    journal = Journal()
    store.journal = journal
    store.put("a", 1)
    store.flush_cache()  # a=1 is down (store and changelog)
    store.put("b", 7)    # b=7 only cached
    journal.begin(lambda: ("in", 9))
    store.put("a", 2)
    store.put("b", 8)
    store.put("c", 3)
    store.flush_cache()  # the record's updates went down too
    assert journal.undo() == 3
    assert (store.get("a"), store.get("b"), store.get("c")) == (1, 7, None)
    # The changelog ends with compensations tagged with the record, so a restore agrees.
    changes = [(k, v) for _, _, k, v, _, _ in log.records]
    assert changes[-3:] == [(b"c", None), (b"b", None), (b"a", LONG.serialize(1))]
    assert decode_source(log.records[-1][5]) == ("in", 9)
    store.flush_cache()
    assert store.inner.get(b"b") == LONG.serialize(7)  # the earlier dirty entry is still there to go down


class CountingReads(InMemoryBytesStore):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.reads = 0

    def get(self, key: bytes) -> bytes | None:
        self.reads += 1
        return super().get(key)


@pytest.mark.parametrize("cached", [False, True])
def test_a_read_then_written_key_is_read_from_the_store_once_and_its_update_undone_exactly(cached: bool) -> None:
    # An aggregation reads each key and writes it back: the journal takes the read value as the
    # pre-image instead of reading the store again.
    from streamloop.state.store import Journal

    log = Log()
    inner = CountingReads("counts")
    store = KeyValueStore("counts", inner, STR, LONG, Changelogger("app-counts-changelog", 3, log),
                          ThreadCache(1 << 20) if cached else None, "0_3/counts", lambda: 42, lambda: ("in", 7))
    journal = Journal()
    store.journal = journal
    store.put("a", 1)
    store.flush_cache()
    if cached:
        inner.put(b"b", LONG.serialize(5))  # down before (a restore), not in the cache
    store.put("x", 0)
    store.flush_cache()
    reads = inner.reads

    journal.begin(lambda: ("in", 9))
    for key in ("a", "b", "c"):
        old = store.get(key)
        store.put(key, 1 if old is None else old + 1)
    store.put("a", 100)                   # a second write keeps the first pre-image
    assert store.get("x") == 0            # read, never written: nothing to undo
    store.flush_cache()                   # the record's updates went down too
    # Uncached: one read per key, none again for the journal. Cached: "b" and "c" read once; "a"
    # and "x" come from the cache, and the journal reads what lies under "a"'s entry.
    assert inner.reads - reads == (3 if cached else 4)

    assert journal.undo() == 3
    assert (store.get("a"), store.get("b"), store.get("c"), store.get("x")) == (1, 5 if cached else None, None, 0)
    store.flush_cache()
    assert inner.get(b"a") == LONG.serialize(1) and inner.get(b"c") is None


@pytest.mark.parametrize("cache", ["none", "zero bytes", "10 KiB"])
def test_an_aggregation_is_read_once_journaled_and_undone_exactly_with_or_without_a_cache(cache: str) -> None:
    # ``aggregate`` takes its own path when no cache holds the store's writes (none, or a thread
    # cache of 0 bytes, as cache.max.bytes.buffering=0 gives): the same reads, writes, changelog
    # updates and undo as ``get`` + ``put`` through the cache layers.
    from streamloop.state.store import Journal

    log, inner = Log(), CountingReads("counts")
    caches = {"none": None, "zero bytes": ThreadCache(0), "10 KiB": ThreadCache(10 << 10)}
    store = KeyValueStore("counts", inner, STR, LONG, Changelogger("app-counts-changelog", 3, log),
                          caches[cache], "0_3/counts", lambda: 42, lambda: ("in", 7))
    journal = Journal()
    store.journal = journal
    store.put("a", 1)
    store.flush_cache()
    before, reads = len(log.records), inner.reads

    def add(key: str, value: int) -> None:
        store.aggregate(key, value, lambda: 0, lambda _k, v, total: total + v)

    journal.begin(lambda: ("in", 9))
    add("a", 2)
    add("b", 5)
    add("a", 10)                          # the second write of "a" keeps the first pre-image
    aggregated = inner.reads - reads
    assert (store.get("a"), store.get("b")) == (13, 5)
    store.flush_cache()
    if cache != "10 KiB":
        # Each update went down at once: one read per aggregation ("a" again: the store holds the
        # record's own update), none for the journal, an update on the changelog per aggregation.
        assert aggregated == 3
        assert [(r[2], LONG.deserialize(r[3])) for r in log.records[before:]] == [(b"a", 3), (b"b", 5), (b"a", 13)]
        assert all(decode_source(r[5]) == ("in", 7) for r in log.records[before:])

    assert journal.undo() == 2
    journal.end()
    assert (store.get("a"), store.get("b")) == (1, None)
    store.flush_cache()
    assert inner.get(b"a") == LONG.serialize(1) and inner.get(b"b") is None


def test_the_records_key_is_serialised_once_for_a_get_and_a_put_and_other_keys_as_usual() -> None:
    calls: list[Any] = []

    class CountingStr(StringSerde):
        def serialize(self, value: Any) -> bytes | None:
            calls.append(value)
            return super().serialize(value)

    store = KeyValueStore("counts", InMemoryBytesStore("counts"), CountingStr(), LONG, None, None, "0_3/c",
                          lambda: 42, lambda: ("in", 7))
    key = "".join(["cust", "omer-1"])  # a key object of its own, as a deserialised record key
    old = store.get(key)
    store.put(key, 1 if old is None else old + 1)
    assert calls == [key]
    store.put("other", 5)
    assert store.get("".join(["oth", "er"])) == 5 and store.get(key) == 1
    assert calls == [key, "other", "other", key]
