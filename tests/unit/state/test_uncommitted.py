"""``UncommittedWrites``: a persistent store's writes held until a commit covers them (KIP-892)."""

from __future__ import annotations

import threading

import pytest

from streamloop.serdes import LongSerde, StringSerde
from streamloop.state.bytes_stores import InMemoryBytesStore, RocksDBBytesStore
from streamloop.state.restore import ProcessedInput
from streamloop.state.store import KeyValueStore, WindowStore
from streamloop.state.uncommitted import UncommittedBudget, UncommittedWrites

pytest.importorskip("rocksdict")

STR, LONG = StringSerde(), LongSerde()


def committed(offset: int) -> dict[str, ProcessedInput]:
    return {"in": ProcessedInput(offset, frozenset())}


def test_a_crash_leaves_the_rocksdb_store_at_the_last_commit(tmp_path) -> None:
    """Matches KIP-892's RocksDBStore behaviour: writes past the commit are not on disk after a crash."""
    store = UncommittedWrites(RocksDBBytesStore("s", str(tmp_path / "s")))
    store.open()
    store.put(b"a", b"1", ("in", 0))
    store.put(b"b", b"1", ("in", 1))
    store.put(b"a", b"2", ("in", 2))  # past the commit below
    assert store.commit(committed(2)) == 2
    assert store.get(b"a") == b"2"  # the task still reads its own uncommitted write
    store.put(b"c", b"1", ("in", 3))
    # A crash: no further commit, the process goes (close drops what is held, as a kill does).
    store.close()
    reopened = RocksDBBytesStore("s", str(tmp_path / "s"))
    reopened.open()
    assert dict(reopened.range(None, None)) == {b"a": b"1", b"b": b"1"}
    reopened.close()


def test_ranges_and_reads_see_held_writes_over_the_disk_deletes_included() -> None:
    store = UncommittedWrites(InMemoryBytesStore("s"))
    for key in (b"a", b"c", b"e"):
        store.put(key, b"disk", None)
    store.commit({})
    store.put(b"b", b"held", ("in", 9))
    store.put(b"c", None, ("in", 9))
    store.put(b"e", b"new", ("in", 9))
    assert list(store.range(None, None)) == [(b"a", b"disk"), (b"b", b"held"), (b"e", b"new")]
    assert list(store.range(b"b", b"d")) == [(b"b", b"held")]
    assert store.get(b"c") is None
    # Another thread (an interactive query) reads the same, from a copy.
    seen: list[object] = []
    reader = threading.Thread(target=lambda: seen.append(list(store.range(None, None))))
    reader.start()
    reader.join()
    assert seen == [[(b"a", b"disk"), (b"b", b"held"), (b"e", b"new")]]
    assert dict(store.base.range(None, None)) == {b"a": b"disk", b"c": b"disk", b"e": b"disk"}


def test_a_key_newest_covered_write_goes_down_and_an_older_uncovered_one_is_dropped() -> None:
    """A punctuation (no record) writes after a record past the commit: the punctuation's write
    goes down at the commit, and the record's older write of that key is gone (a restore of the
    changelog in order would end on the punctuation's value too)."""
    store = UncommittedWrites(InMemoryBytesStore("s"))
    store.put(b"k", b"record", ("in", 5))
    store.put(b"k", b"punctuation", None)
    store.put(b"j", b"record", ("in", 5))
    assert store.commit(committed(5)) == 1
    assert dict(store.base.range(None, None)) == {b"k": b"punctuation"}
    assert store.held == 1  # j's write waits for a commit past offset 5
    assert store.get(b"j") == b"record"


def test_the_checkpoint_waits_until_every_write_appended_before_the_end_was_read_is_on_disk() -> None:
    store = UncommittedWrites(InMemoryBytesStore("s"))
    store.put(b"a", b"1", ("in", 0))
    store.put(b"b", b"1", ("in", 1))  # processed after the commit's snapshot
    store.commit(committed(1))
    # The end read after that commit counts b's changelog record: not safe yet.
    assert store.checkpoint_offset(store.candidate(2)) is None
    assert store.checkpoint_behind
    store.put(b"c", b"1", ("in", 2))
    store.commit(committed(3))
    # Now the first end is safe, and the newer one too (nothing held at all).
    assert store.checkpoint_offset(store.candidate(3)) == 3
    assert not store.checkpoint_behind


def test_of_two_safe_ends_read_with_no_write_between_them_the_later_one_is_checkpointed() -> None:
    """A busy commit's end waits (a write came after it was read); the next commit covers that
    write and, with nothing written since, reads a later end: the checkpoint moves to that one,
    not to the first (it lagged a commit behind, for as long as no further commit came)."""
    store = UncommittedWrites(InMemoryBytesStore("s"))
    store.put(b"a", b"1", ("in", 0))
    store.commit(committed(1))
    store.put(b"b", b"1", ("in", 1))  # processed while the first end was read
    assert store.checkpoint_offset(store.candidate(2)) is None
    store.commit(committed(2))
    assert store.checkpoint_offset(store.candidate(5)) == 5
    assert not store.checkpoint_behind


def test_past_its_bound_the_budget_asks_for_a_commit_and_a_commit_gives_the_bytes_back() -> None:
    asked: list[int] = []
    budget = UncommittedBudget(300)
    store = UncommittedWrites(InMemoryBytesStore("s"), budget, lambda: asked.append(budget.held))
    store.put(b"a", b"x" * 100, ("in", 0))
    assert asked == []
    store.put(b"b", b"x" * 100, ("in", 1))
    assert len(asked) == 1 and asked[0] > 300
    store.commit(committed(2))
    assert budget.held == 0 == store.bytes


def test_a_window_store_reads_its_held_windows_and_writes_them_at_the_commit() -> None:
    """Every store kind gets it from the layer beneath: a window store over held writes."""
    held = UncommittedWrites(InMemoryBytesStore("w"))
    windows = WindowStore("w", held, STR, LONG, None, None, "0_0/w", lambda: 0, lambda: ("in", 7),
                          window_size_ms=10, retention_ms=100)
    windows.put("k", 1, 0)
    windows.put("k", 2, 10)
    assert list(windows.fetch_range("k", 0, 20)) == [(0, 1), (10, 2)]
    assert list(held.base.range(None, None)) == []
    held.commit(committed(8))
    assert len(list(held.base.range(None, None))) == 2
    kv = KeyValueStore("kv", UncommittedWrites(InMemoryBytesStore("kv")), STR, LONG, None, None, "0_0/kv",
                       lambda: 0, lambda: ("in", 7))
    kv.put("k", 1)
    assert kv.get("k") == 1 and kv.durable.get(b"k") is None


def test_a_task_still_restoring_writes_no_checkpoint_at_a_commit_of_its_thread(tmp_path) -> None:
    """Another task of the thread commits while this one restores: the changelog's end is not where
    this task's disk is yet, and a checkpoint there would make a crash lose the rest of the restore."""
    import logging

    from streamloop.logcontext import LogContext
    from streamloop.records import TopicPartition
    from streamloop.serdes import BytesSerde
    from streamloop.state import Stores, checkpoint
    from streamloop.state.task_state import TaskStateManager

    builder = Stores.key_value_store_builder(Stores.persistent_key_value_store("counts"))
    state = TaskStateManager("0_0", "app", str(tmp_path), 0, [builder], True, BytesSerde(), BytesSerde(),
                             lambda *_: None, None, lambda: 0, lambda: None,
                             LogContext(logging.getLogger(__name__), ""))
    changelog = TopicPartition("app-counts-changelog", 0)
    try:
        state.commit({})
        assert state.checkpoint_commit({changelog: 1_000}) is None
        assert checkpoint.read(str(tmp_path / "app" / "0_0")) == {}
    finally:
        state.close(clean=False)


@pytest.mark.parametrize("kind", ["key-value", "timestamped", "versioned", "window", "sliding", "join", "session"])
def test_every_persistent_store_kind_holds_its_writes_until_a_commit(tmp_path, kind: str) -> None:
    """One layer beneath them all: each kind of persistent store a task opens reads its own write
    at once and finds it on disk only after a commit that covers its record."""
    import logging

    from streamloop.logcontext import LogContext
    from streamloop.serdes import BytesSerde
    from streamloop.state.stores import StoreBuilder, StoreSupplier, StoreType
    from streamloop.state.task_state import TaskStateManager

    suppliers = {
        "key-value": StoreSupplier("s", True),
        "timestamped": StoreSupplier("s", True, timestamped=True),
        "versioned": StoreSupplier("s", True, retention_ms=1000, versioned=True),
        "window": StoreSupplier("s", True, StoreType.WINDOW, 1000, 10),
        "sliding": StoreSupplier("s", True, StoreType.WINDOW, 1000, 10, timestamped=True),
        "join": StoreSupplier("s", True, StoreType.WINDOW, 1000, 10, retain_duplicates=True),
        "session": StoreSupplier("s", True, StoreType.SESSION, 1000),
    }
    state = TaskStateManager("0_0", "app", str(tmp_path), 0, [StoreBuilder(suppliers[kind], STR, LONG)], True,
                             BytesSerde(), BytesSerde(), lambda *_: None, None, lambda: 5, lambda: ("in", 3),
                             LogContext(logging.getLogger(__name__), ""))
    try:
        store = state.store("s")
        store.inner.open()
        state.processed = committed(0)  # as a restore leaves it: the input starts at offset 0
        held = store.uncommitted
        assert held is not None
        if kind == "session":
            from streamloop.state.windows import Windowed
            store.put(Windowed("k", 0, 0), 1)  # type: ignore[attr-defined]
        elif kind in ("window", "sliding", "join"):
            store.put("k", 1, 0)  # type: ignore[attr-defined]
        elif kind == "timestamped":
            from streamloop.state.timestamped import ValueAndTimestamp
            store.put("k", ValueAndTimestamp(1, 5))  # type: ignore[attr-defined]
        elif kind == "versioned":
            store.put("k", 1, 5)  # type: ignore[attr-defined]
        else:
            store.put("k", 1)  # type: ignore[attr-defined]
        assert held.held >= 1 and list(store.durable.range(None, None)) == []
        assert list(held.range(None, None))  # the task reads it
        state.commit({})  # no commit covers input offset 3 yet
        assert list(store.durable.range(None, None)) == []
        from streamloop.records import TopicPartition
        from streamloop.transport.base import OffsetAndMetadata
        state.commit({TopicPartition("in", 0): OffsetAndMetadata(4)})
        assert held.held == 0 and list(store.durable.range(None, None))
    finally:
        state.close(clean=False)
