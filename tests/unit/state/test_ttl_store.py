"""Key-value stores with a time to live (``streamloop.state.ttl``) through the test driver: entries
expire by record time or by wall clock, reads leave expired entries out before the sweep deletes
them, the sweep deletes in bounded steps with changelog tombstones, and a restore agrees.

Kafka Streams has no time to live for its stores (its users delete old entries from a punctuator
of their own), so no case here matches a Kafka Streams test; the window stores' retention is the
nearest thing it has."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from streamloop import StreamsBuilder, ValueAndTimestamp
from streamloop.errors import TopologyError
from streamloop.processors.api import BaseProcessor
from streamloop.records import Record
from streamloop.serdes import LongSerde, StringSerde
from streamloop.state import Materialized, Stores, TimeWindows
from streamloop.state.ttl import ExpiryClock, TimeToLive, TtlKeyValueStore
from streamloop.testing import TopologyTestDriver

STR, LONG = StringSerde(), LongSerde()
CHANGELOG = "topology-test-driver-seen-changelog"


class Remember(BaseProcessor):
    """``key: value`` puts the value (None deletes); ``key: "?"`` forwards what the store holds."""

    def init(self, context: Any) -> None:
        super().init(context)
        self.store = context.get_state_store("seen")

    def process(self, record: Record) -> None:
        if record.value == "?":
            found = self.store.get(record.key)
            self.context.forward(record.with_value("none" if found is None else str(found)))
        else:
            self.store.put(record.key, record.value)


def remember(ttl: Any = 1_000, by: str = "record_time", caching: bool = False, timestamped: bool = False,
             **options: Any) -> Any:
    builder = StreamsBuilder()
    make = Stores.timestamped_key_value_store_builder if timestamped else Stores.key_value_store_builder
    store = make(Stores.in_memory_key_value_store("seen"), STR, STR).with_ttl(ttl, by=by, **options)
    builder.add_state_store(store.with_caching_enabled() if caching else store)
    builder.stream("in", key_serde=STR, value_serde=STR).process(Remember, stores=["seen"]).to(
        "out", key_serde=STR, value_serde=STR)
    return builder.build()


def changelog(driver: TopologyTestDriver) -> list[tuple[str, str | None]]:
    """The changelog as appended (key, value without its 8-byte stamp; None: a tombstone)."""
    return [(STR.deserialize(r.key), None if r.value is None else r.value[8:].decode())
            for r in driver._log(CHANGELOG).appended]


def test_an_entry_expires_by_stream_time_before_the_sweep_deletes_it() -> None:
    """With a sweep that has not run, reads already leave the expired entry out: the record that moves
    stream time past it, the queries, ``all``."""
    topology = remember(1_000, sweep_interval=timedelta(hours=1))
    with TopologyTestDriver(topology) as driver:
        source = driver.create_input_topic("in", STR, STR)
        out = driver.create_output_topic("out", STR, STR)
        source.pipe_input("a", "1", timestamp=10_000)
        source.pipe_input("b", "2", timestamp=10_500)
        source.pipe_input("a", "?", timestamp=10_999)   # 999 ms old: live
        source.pipe_input("a", "?", timestamp=11_000)   # 1000 ms old: expired, read by the record moving time
        assert out.read_values() == ["1", "none"]
        store = driver.get_key_value_store("seen")
        assert store.get("a") is None and store.get("b") == "2"
        assert list(store.all()) == [("b", "2")]
        # Not swept yet (the first sweep was due 1 h of stream time on): the entry is still stored.
        assert store.approximate_num_entries() == 2
        source.pipe_input("x", "?", timestamp=50_000)
        assert list(store.all()) == []
        assert changelog(driver) == [("a", "1"), ("b", "2")]


def test_the_sweep_deletes_expired_entries_with_changelog_tombstones_in_bounded_steps() -> None:
    """Ten expired entries, three looked at per sweep: each stream-time punctuation deletes at most
    three, the cursor going on where the last one stopped, and every delete is a tombstone."""
    topology = remember(100, sweep_interval=10, sweep_entries=3)
    with TopologyTestDriver(topology) as driver:
        source = driver.create_input_topic("in", STR, STR)
        for i in range(10):
            source.pipe_input(f"k{i}", str(i), timestamp=1_000)
        task = driver._manager.tasks[driver.task_ids[0]]
        store = task.state_manager.stores["seen"]  # type: ignore[union-attr]  # the task has stores
        assert isinstance(store, TtlKeyValueStore)
        counts = []
        for step in range(5):
            source.pipe_input("live", "x", timestamp=2_000 + 10 * step)  # one sweep per record
            counts.append(store.expired)
        assert counts == [3, 6, 9, 10, 10]
        assert store.cursor is None or store.cursor > b"k9"
        log = changelog(driver)
        tombstones = sorted(k for k, v in log if v is None)
        assert tombstones == sorted(f"k{i}" for i in range(10))
        assert list(driver.get_key_value_store("seen").all()) == [("live", "x")]


def test_an_entry_expires_by_wall_clock_and_its_sweep_runs_on_the_wall_clock() -> None:
    topology = remember(timedelta(seconds=5), by="wall_clock", sweep_interval=timedelta(seconds=1))
    with TopologyTestDriver(topology, initial_wall_clock_ms=1_000_000) as driver:
        source = driver.create_input_topic("in", STR, STR)
        # Record timestamps far in the future: the wall clock alone decides.
        source.pipe_input("a", "1", timestamp=9_000_000)
        store = driver.get_key_value_store("seen")
        driver.advance_wall_clock_time(4_999)
        assert store.get("a") == "1"
        source.pipe_input("b", "2", timestamp=1)
        driver.advance_wall_clock_time(1)
        assert store.get("a") is None and store.get("b") == "2"
        assert changelog(driver) == [("a", "1"), ("b", "2"), ("a", None)]
        driver.advance_wall_clock_time(5_000)
        assert list(store.all()) == []
        assert changelog(driver)[-1:] == [("b", None)]


def test_a_write_renews_the_entry_and_a_delete_is_a_delete() -> None:
    with TopologyTestDriver(remember(1_000, sweep_interval=timedelta(hours=1))) as driver:
        source = driver.create_input_topic("in", STR, STR)
        out = driver.create_output_topic("out", STR, STR)
        source.pipe_input("a", "1", timestamp=0)
        source.pipe_input("a", "2", timestamp=900)
        source.pipe_input("a", "?", timestamp=1_800)  # 900 ms after the renewal: live
        source.pipe_input("b", "1", timestamp=1_800)
        source.pipe_input("b", None, timestamp=1_801)
        source.pipe_input("b", "?", timestamp=1_802)
        assert out.read_values() == ["2", "none"]


def test_restored_entries_keep_their_expiry_and_one_restored_expired_stays_hidden() -> None:
    """A rebalance (in memory: the store comes back from the changelog alone) and a crash (from the
    last commit, records after it replayed): the restored stamps decide as the first ones did."""
    with TopologyTestDriver(remember(1_000, sweep_interval=timedelta(hours=1))) as driver:
        source = driver.create_input_topic("in", STR, STR)
        out = driver.create_output_topic("out", STR, STR)
        source.pipe_input("a", "1", timestamp=10_000)
        source.pipe_input("b", "2", timestamp=10_600)
        source.pipe_input("c", "3", timestamp=11_200)  # stream time 11.2 s: "a" expired, unswept
        driver.rebalance(driver.task_ids[0])
        store = driver.get_key_value_store("seen")
        assert list(store.all()) == [("b", "2"), ("c", "3")]
        driver.crash()
        assert list(store.all()) == [("b", "2"), ("c", "3")]
        source.pipe_input("b", "?", timestamp=11_599)
        source.pipe_input("b", "?", timestamp=11_600)
        assert out.read_values() == ["2", "none"]


def test_a_cached_store_sweeps_by_the_cached_value_and_sends_its_deletes_down_at_the_flush() -> None:
    """The sweep reads the store under the cache: a newer value cached but not flushed yet keeps the
    entry (the stored one alone has expired), and a delete goes into the cache, down at the flush."""
    topology = remember(100, caching=True, sweep_interval=50)
    with TopologyTestDriver(topology, {"cache.max.bytes.buffering": 1 << 20}) as driver:
        source = driver.create_input_topic("in", STR, STR)
        source.pipe_input("a", "1", timestamp=0)     # flushed at the commit after it
        source.pipe_input("a", "2", timestamp=150)   # cached; the sweep at 150 finds "1" (stamp 0) stored
        store = driver.get_key_value_store("seen")
        assert store.get("a") == "2"
        assert changelog(driver) == [("a", "1"), ("a", "2")]
        source.pipe_input("b", "1", timestamp=300)   # "a" (stamp 150) expired at 250
        assert list(store.all()) == [("b", "1")]
        # Flushed in the order of the last update: the record's "b", then the sweep's tombstone.
        assert changelog(driver) == [("a", "1"), ("a", "2"), ("b", "1"), ("a", None)]


def test_an_update_that_expired_in_the_cache_goes_down_as_a_delete() -> None:
    """Stream time passes an entry's expiry while its update is still cached (no commit since): the
    sweeps find nothing in the store, and the flush sends the delete down instead of the value."""
    topology = remember(100, caching=True, sweep_interval=50)
    config = {"cache.max.bytes.buffering": 1 << 20, "commit.interval.ms": 60_000}
    driver = TopologyTestDriver(topology, config)
    source = driver.create_input_topic("in", STR, STR)
    source.pipe_input("a", "1", timestamp=0)
    source.pipe_input("a", "2", timestamp=60)    # coalesces in the cache with the first
    source.pipe_input("b", "1", timestamp=200)   # "a" (stamp 60) expired at 160, still cached
    assert list(driver.get_key_value_store("seen").all()) == [("b", "1")]
    assert changelog(driver) == []  # nothing flushed yet
    driver.close()
    assert changelog(driver) == [("a", None), ("b", "1")]


def test_a_timestamped_store_with_a_ttl_reads_values_with_timestamps() -> None:
    with TopologyTestDriver(remember(1_000, timestamped=True, sweep_interval=timedelta(hours=1))) as driver:
        source = driver.create_input_topic("in", STR, STR)
        source.pipe_input("a", "1", timestamp=500)
        store = driver.get_key_value_store("seen")
        assert store.get("a") == ValueAndTimestamp("1", 500)
        driver.rebalance(driver.task_ids[0])
        assert list(store.all()) == [("a", ValueAndTimestamp("1", 500))]
        source.pipe_input("b", "2", timestamp=1_500)
        assert store.get("a") is None


def test_a_dsl_count_with_a_ttl_starts_again_and_forwards_the_expiry() -> None:
    """``Materialized.with_ttl``: a key not seen for the TTL counts from 1 again, and the sweep's
    delete flows downstream as a tombstone, as the table's other updates do."""
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=STR).group_by_key()
        .count(materialized=Materialized("counts", caching=False).with_ttl(1_000, sweep_interval=100))
        .to_stream().to("out", key_serde=STR, value_serde=LONG))
    with TopologyTestDriver(builder.build()) as driver:
        source = driver.create_input_topic("in", STR, STR)
        out = driver.create_output_topic("out", STR, LONG)
        source.pipe_input("a", "x", timestamp=0)
        source.pipe_input("a", "x", timestamp=500)
        source.pipe_input("b", "x", timestamp=1_400)  # "a" stamped 500: live until 1500
        source.pipe_input("b", "x", timestamp=1_600)  # "a" expired; the sweep at 1600 deletes it
        source.pipe_input("a", "x", timestamp=1_700)
        assert out.read_key_values() == [("a", 1), ("a", 2), ("b", 1), ("b", 2), ("a", None), ("a", 1)]


def test_ttl_arguments_are_checked_with_typed_errors() -> None:
    kv = Stores.key_value_store_builder(Stores.in_memory_key_value_store("s"))
    assert kv.with_ttl(timedelta(minutes=2)).ttl == TimeToLive(120_000, ExpiryClock.RECORD_TIME, 60_000, 1000)
    assert kv.with_ttl(500, by="wall_clock").ttl == TimeToLive(500, ExpiryClock.WALL_CLOCK, 500, 1000)
    for bad, match in (({"ttl": 0}, "ttl must be at least 1 ms"), ({"ttl": 1.5}, "timedelta or whole"),
                       ({"ttl": 10, "by": "event"}, "'record_time' or 'wall_clock'"),
                       ({"ttl": 10, "sweep_entries": 0}, "sweep_entries must be an int >= 1"),
                       ({"ttl": 10, "sweep_interval": timedelta(0)}, "sweep_interval must be at least 1 ms")):
        with pytest.raises(TopologyError, match=match):
            kv.with_ttl(**bad)
    window = Stores.window_store_builder(Stores.in_memory_window_store("w", 10, 5))
    with pytest.raises(TopologyError, match="window store: a time to live"):
        window.with_ttl(10)
    versioned = Stores.versioned_key_value_store_builder(Stores.in_memory_versioned_key_value_store("v", 10))
    with pytest.raises(TopologyError, match="versioned store"):
        versioned.with_ttl(10)
    grouped = StreamsBuilder().stream("in", key_serde=STR, value_serde=STR).group_by_key()
    with pytest.raises(TopologyError, match="window store"):
        grouped.windowed_by(TimeWindows.of_size_with_no_grace(10)).count(materialized=Materialized("w").with_ttl(10))
    with pytest.raises(TopologyError, match="of a global table cannot have a time to live"):
        StreamsBuilder().global_table("g", key_serde=STR, value_serde=STR,
                                      materialized=Materialized("g").with_ttl(10))


class ReadsAtInit(Remember):
    """Reads its store in ``init``, before the task that runs it exists."""

    def init(self, context: Any) -> None:
        super().init(context)
        self.at_init = self.store.get("a")


def test_a_processor_may_read_a_ttl_store_in_init() -> None:
    builder = StreamsBuilder()
    builder.add_state_store(Stores.key_value_store_builder(Stores.in_memory_key_value_store("seen"), STR, STR)
                            .with_ttl(1_000))
    builder.stream("in", key_serde=STR, value_serde=STR).process(ReadsAtInit, stores=["seen"]).to(
        "out", key_serde=STR, value_serde=STR)
    with TopologyTestDriver(builder.build()) as driver:
        source = driver.create_input_topic("in", STR, STR)
        source.pipe_input("a", "1", timestamp=5)
        driver.rebalance(driver.task_ids[0])  # new processors, their init reading the restored store
        source.pipe_input("a", "?", timestamp=6)
        assert driver.create_output_topic("out", STR, STR).read_values() == ["1"]


def test_the_wall_clock_may_move_before_the_first_record_with_a_persistent_ttl_store() -> None:
    """The driver fires a task's wall-clock punctuations before it has started (restored, opened its
    stores) when its clock moves before any record: the sweep waits for the task to run."""
    builder = StreamsBuilder()
    builder.add_state_store(Stores.key_value_store_builder(Stores.persistent_key_value_store("seen"), STR, STR)
                            .with_ttl(100, by="wall_clock", sweep_interval=1))
    builder.stream("in", key_serde=STR, value_serde=STR).process(Remember, stores=["seen"]).to(
        "out", key_serde=STR, value_serde=STR)
    with TopologyTestDriver(builder.build()) as driver:
        driver.advance_wall_clock_time(5)
        driver.create_input_topic("in", STR, STR).pipe_input("a", "1")
        driver.advance_wall_clock_time(99)
        assert driver.get_key_value_store("seen").get("a") == "1"
        driver.advance_wall_clock_time(1)
        assert driver.get_key_value_store("seen").get("a") is None
        assert changelog(driver) == [("a", "1"), ("a", None)]


def test_a_sweep_delete_that_replaced_a_cached_write_counts_at_the_commit_after_it() -> None:
    """Found by the TTL property (``test_ttl_properties``): a late write, expired when it was made,
    sits in the cache over a committed value; the sweep at the next record caches its delete in its
    place. The commit after that sweep (a clean rebalance) must count the delete in a restore: the
    cache replaced the late write with it, so a restore that left the delete out would go back to
    the committed value and bring an expired key back. The delete is tagged with the record whose
    stream time the sweep ran at, which that commit covers (it was tagged with the next record,
    which no commit covered until a later record came)."""
    topology = remember(100, caching=True, sweep_interval=1)
    config = {"cache.max.bytes.buffering": 1 << 20, "commit.interval.ms": 1_000}
    with TopologyTestDriver(topology, config) as driver:
        source = driver.create_input_topic("in", STR, STR)
        source.pipe_input("a", "0", timestamp=1_000)
        driver.advance_wall_clock_time(1_000)         # a commit: "a" = "0" flushed and committed
        source.pipe_input("a", "late", timestamp=900)  # stamped 900: expired at stream time 1000
        source.pipe_input("b", "?", timestamp=1_001)   # the sweep at 1001 deletes "a" in the cache
        store = driver.get_key_value_store("seen")
        assert dict(store.all()) == {}
        driver.rebalance(driver.task_ids[0])           # committed, closed, restored from the changelog
        assert dict(store.all()) == {}, f"restored {dict(store.all())}, changelog {changelog(driver)}"


def test_a_restore_leaves_out_a_sweep_delete_from_after_the_commit_it_restores_to() -> None:
    """A read replayed after a crash answers what it answered the first time: the sweep's delete came
    from a stream time its record reached after the last commit, so a restore from that commit must
    leave the delete out (it is tagged with that record, which the commit does not cover). Planted
    untagged, the replayed read found nothing where it had found "0"."""
    with TopologyTestDriver(remember(100, sweep_interval=1), {"commit.interval.ms": 1_000}) as driver:
        source = driver.create_input_topic("in", STR, STR)
        out = driver.create_output_topic("out", STR, STR)
        source.pipe_input("a", "0", timestamp=1_000)
        driver.advance_wall_clock_time(1_000)        # a commit after "a" = "0"
        source.pipe_input("a", "?", timestamp=1_000)  # reads "0"
        source.pipe_input("b", "1", timestamp=1_100)  # stream time 1100: "a" expired, the sweep deletes it
        assert changelog(driver)[-1] == ("a", None)
        driver.crash()                                # restored from the commit, both records again
        assert out.read_values() == ["0", "0"]
