"""``KTable.suppress`` through the test driver, on the scenarios of Kafka Streams' ``SuppressScenarioTest``
and ``KTableSuppressProcessorTest``."""

from __future__ import annotations

from typing import Any

import pytest

from streamloop import (
    BufferConfig,
    BufferFullError,
    SessionWindows,
    SlidingWindows,
    StreamsBuilder,
    Suppressed,
    TimeWindows,
    TopologyError,
)
from streamloop.processors.suppress import SuppressProcessor
from streamloop.records import Record
from streamloop.serdes import BytesSerde, LongSerde, StringSerde
from streamloop.state.bytes_stores import InMemoryBytesStore
from streamloop.state.store import KeyValueStore
from streamloop.testing import TopologyTestDriver

STR, LONG = StringSerde(), LongSerde()
NO_CACHE = {"cache.max.bytes.buffering": 0}
FINAL = Suppressed.until_window_closes(BufferConfig.unbounded())


def final_counts(windows: Any) -> StreamsBuilder:
    """Windowed counts to ``raw`` and, suppressed until their windows close, to ``suppressed``."""
    builder = StreamsBuilder()
    counts = builder.stream("in", key_serde=STR, value_serde=STR).group_by_key().windowed_by(windows).count(
        materialized="counts")
    for table, topic in ((counts.suppress(FINAL), "suppressed"), (counts, "raw")):
        (table.to_stream().map(lambda w, n: (f"[{w.key}@{w.start}/{w.end}]", n))
              .to(topic, key_serde=STR, value_serde=LONG))
    return builder


def pipe(driver: TopologyTestDriver, records: list[tuple[str, int]]) -> None:
    source = driver.create_input_topic("in", STR, STR)
    for key, timestamp in records:
        source.pipe_input(key, "v1", timestamp)


def test_final_results_for_time_windows() -> None:
    """``shouldSupportFinalResultsForTimeWindows``: one result per window, when stream time passes
    its end + grace; the record past the grace period is dropped from both."""
    with TopologyTestDriver(final_counts(TimeWindows.of_size_and_grace(2, 1)).build(), NO_CACHE) as driver:
        pipe(driver, [("k1", 0), ("k1", 1), ("k1", 2), ("k1", 1), ("k1", 0), ("k1", 5), ("k1", 0)])
        assert driver.create_output_topic("raw", STR, LONG).read_key_values() == [
            ("[k1@0/2]", 1), ("[k1@0/2]", 2), ("[k1@2/4]", 1), ("[k1@0/2]", 3), ("[k1@0/2]", 4), ("[k1@4/6]", 1)]
        assert driver.create_output_topic("suppressed", STR, LONG).read_key_values() == [
            ("[k1@0/2]", 4), ("[k1@2/4]", 1)]


def test_final_results_for_session_windows() -> None:
    """``shouldSupportFinalResultsForSessionWindows``: a session closes once stream time passes its
    end by the gap (+ grace); the merged-away sessions' tombstones never reach the suppressed side."""
    with TopologyTestDriver(final_counts(SessionWindows.of_inactivity_gap_with_no_grace(5)).build(),
                            NO_CACHE) as driver:
        pipe(driver, [("k1", 0), ("k1", 5), ("k1", 1), ("k2", 11), ("k1", 5), ("k1", 30)])
        assert [(r.key, r.value, r.timestamp) for r in driver.create_output_topic("raw", STR, LONG).read_records()] \
            == [("[k1@0/0]", 1, 0), ("[k1@0/0]", None, 0), ("[k1@0/5]", 2, 5), ("[k1@0/5]", None, 5),
                ("[k1@0/5]", 3, 5), ("[k2@11/11]", 1, 11), ("[k1@30/30]", 1, 30)]
        suppressed = driver.create_output_topic("suppressed", STR, LONG).read_records()
        assert [(r.key, r.value, r.timestamp) for r in suppressed] == [("[k1@0/5]", 3, 5), ("[k2@11/11]", 1, 11)]


def test_final_results_for_sliding_windows() -> None:
    """``shouldSupportFinalResultsForSlidingWindows``."""
    with TopologyTestDriver(final_counts(SlidingWindows.of_time_difference_and_grace(5, 15)).build(),
                            NO_CACHE) as driver:
        pipe(driver, [("k1", 10), ("k1", 11), ("k1", 10), ("k1", 13), ("k1", 10), ("k1", 24), ("k1", 5), ("k1", 7),
                      ("k1", 90)])
        suppressed = driver.create_output_topic("suppressed", STR, LONG).read_records()
        assert [(r.key, r.value, r.timestamp) for r in suppressed] == [
            ("[k1@5/10]", 5, 10), ("[k1@6/11]", 5, 11), ("[k1@8/13]", 5, 13), ("[k1@11/16]", 2, 13),
            ("[k1@12/17]", 1, 13), ("[k1@19/24]", 1, 24)]


def table_suppressed(suppressed: Suppressed) -> StreamsBuilder:
    builder = StreamsBuilder()
    (builder.table("in", key_serde=STR, value_serde=STR, materialized="t").suppress(suppressed)
            .to_stream().to("out", key_serde=STR, value_serde=STR))
    return builder


def test_time_limit_emits_the_latest_value_once_stream_time_passes_the_first_update_plus_the_limit() -> None:
    """``shouldSuppressIntermediateEventsWithTimeLimit``: a key keeps the buffer time of its first
    held update (non-resetting), and its latest value goes out; tombstones go out too."""
    with TopologyTestDriver(table_suppressed(Suppressed.until_time_limit(2, BufferConfig.unbounded())).build(),
                            NO_CACHE) as driver:
        source = driver.create_input_topic("in", STR, STR)
        out = driver.create_output_topic("out", STR, STR)
        source.pipe_input("k1", "v1", 0)
        source.pipe_input("k1", "v2", 1)
        assert out.read_records() == []
        source.pipe_input("k2", "v1", 2)   # stream time 2: k1 (held since 0) goes
        assert [(r.key, r.value, r.timestamp) for r in out.read_records()] == [("k1", "v2", 1)]
        source.pipe_input("x", "x1", 3)
        source.pipe_input("k2", None, 3)   # a tombstone replaces k2's value, keeps its time
        source.pipe_input("x", "x2", 4)
        assert out.read_key_values() == [("k2", None)]
        source.pipe_input("x", "x3", 5)
        assert out.read_key_values() == [("x", "x3")]


def test_a_full_buffer_emits_early_or_shuts_down() -> None:
    """``shouldSuppressIntermediateEventsWithRecordLimit`` and ``shouldShutdownWhenRecordConstraintIsViolated``."""
    early = Suppressed.until_time_limit(1000, BufferConfig.max_records(1))
    with TopologyTestDriver(table_suppressed(early).build(), NO_CACHE) as driver:
        source = driver.create_input_topic("in", STR, STR)
        source.pipe_input("k1", "v1", 0)
        source.pipe_input("k1", "v2", 1)
        source.pipe_input("k2", "v1", 2)  # two keys held: the oldest goes
        assert driver.create_output_topic("out", STR, STR).read_key_values() == [("k1", "v2")]
    strict = Suppressed.until_time_limit(1000, BufferConfig.max_records(1).shut_down_when_full())
    with TopologyTestDriver(table_suppressed(strict).build(), NO_CACHE) as driver:
        source = driver.create_input_topic("in", STR, STR)
        source.pipe_input("k1", "v1", 0)
        with pytest.raises(BufferFullError):  # an engine error: it stops the thread, as in Kafka Streams
            source.pipe_input("k2", "v1", 1)


def test_the_buffer_is_restored_from_its_changelog() -> None:
    with TopologyTestDriver(final_counts(TimeWindows.of_size_with_no_grace(10)).build(), NO_CACHE) as driver:
        pipe(driver, [("a", 1), ("a", 2), ("b", 3)])
        driver.rebalance(driver.task_ids[0])
        pipe(driver, [("a", 4), ("c", 10)])
        assert driver.create_output_topic("suppressed", STR, LONG).read_key_values() == [
            ("[a@0/10]", 3), ("[b@0/10]", 1)]


def test_until_window_closes_needs_a_windowed_table_and_a_strict_buffer() -> None:
    with pytest.raises(TopologyError, match="windowed"):
        table_suppressed(FINAL)
    with pytest.raises(TopologyError, match="never emits early"):
        Suppressed.until_window_closes(BufferConfig.max_records(3))
    assert Suppressed.until_window_closes(BufferConfig.max_records(3).shut_down_when_full()).final_results


def test_a_named_suppression_names_its_processor_and_its_changelogged_buffer() -> None:
    """As Kafka Streams: ``Suppressed.with_name(n)`` names the processor ``n`` and the buffer ``n-store``."""
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=STR).group_by_key()
            .windowed_by(SessionWindows.of_inactivity_gap_with_no_grace(5)).count(materialized="s")
            .suppress(FINAL.with_name("final")).to_stream())
    topology = builder.build()
    assert "Processor: final (stores: [s, final-store])" in topology.describe()
    topology.set_application_id("app")
    assert topology.internal_topics({"in": 3})["app-final-store-changelog"] == (3, {"cleanup.policy": "compact"})


def test_an_emitted_update_keeps_its_headers() -> None:
    """``KTableSuppressProcessor`` forwards the buffered record with its own context: headers too
    (the DSL's tables forward none yet, so the processor is driven directly here)."""
    def kv_store(name: str, key_serde: Any, value_serde: Any) -> KeyValueStore:
        return KeyValueStore(name, InMemoryBytesStore(name), key_serde, value_serde, None, None, name,
                             lambda: 0, lambda: None)

    stores = {"buffer": kv_store("buffer", BytesSerde(), BytesSerde()), "table": kv_store("table", STR, STR)}
    forwarded: list[Record] = []

    class Context:
        def get_state_store(self, name: str) -> Any:
            return stores[name]

        def forward(self, record: Record, to: str | None = None) -> None:
            forwarded.append(record)

    processor = SuppressProcessor("buffer", "table", False, 1, None, None, False)
    processor.init(Context())  # type: ignore[arg-type]  # the two calls the processor makes
    headers = (("trace", b"t-1"), ("empty", b""), ("none", None))
    processor.process(Record("k1", "v1", 0, headers))  # type: ignore[arg-type]  # Kafka allows a null header
    processor.process(Record("k2", "v2", 1))
    assert forwarded == [Record("k1", "v1", 0, headers)]  # type: ignore[arg-type]  # as above


def test_suppressing_a_table_without_a_store_names_the_fix() -> None:
    """The buffer keeps the upstream store's bytes: a filter without ``materialized=`` has none."""
    builder = StreamsBuilder()
    filtered = builder.table("in", key_serde=StringSerde(), value_serde=LongSerde()).filter(lambda _k, v: v > 0)
    with pytest.raises(TopologyError, match="materialized="):
        filtered.suppress(Suppressed.until_time_limit(100, BufferConfig.unbounded()))


def counts_held_back(limit_ms: int) -> tuple[StreamsBuilder, Any]:
    builder = StreamsBuilder()
    counts = builder.stream("in", key_serde=STR, value_serde=STR).group_by_key().count(materialized="counts")
    return builder, counts.suppress(Suppressed.until_time_limit(limit_ms, BufferConfig.unbounded()))


def test_a_join_reads_a_suppressed_table_as_it_was_emitted() -> None:
    """``KTableSuppressProcessorSupplier.view()``: a key held back reads as its value before the held
    update (what the suppression last let through), a key not held back as the parent's value."""
    builder, held = counts_held_back(10)
    (builder.stream("s", key_serde=STR, value_serde=STR)
            .left_join(held, lambda v, n: f"{v}/{n}").to("out", key_serde=STR, value_serde=STR))
    with TopologyTestDriver(builder.build(), NO_CACHE) as driver:
        counts, lookups = driver.create_input_topic("in", STR, STR), driver.create_input_topic("s", STR, STR)
        out = driver.create_output_topic("out", STR, STR)
        counts.pipe_input("k", "x", 0)   # count 1, held back
        lookups.pipe_input("k", "a", 1)
        counts.pipe_input("k", "x", 20)  # count 2, emitted (stream time 20 >= 0 + 10)
        lookups.pipe_input("k", "b", 21)
        counts.pipe_input("k", "x", 25)  # count 3, held back
        lookups.pipe_input("k", "c", 26)
        assert out.read_key_values() == [("k", "a/None"), ("k", "b/2"), ("k", "c/2")]


def test_a_suppressed_table_can_be_filtered() -> None:
    """A table operation after ``suppress`` (``KTable.suppress(...).filter(...)``) sees the emitted
    updates, with the values they replace (what the suppression let through before)."""
    builder, held = counts_held_back(10)
    held.filter(lambda _k, n: n % 2 == 1).to_stream().to("odd", key_serde=STR, value_serde=LONG)
    with TopologyTestDriver(builder.build(), NO_CACHE) as driver:
        # k: 1 goes through when j's record moves stream time to 10; 2 (replacing 1) is held at 11
        # and goes through at 30, after j's 2: the filter deletes k, which it had let through.
        pipe(driver, [("k", 0), ("j", 10), ("k", 11), ("j", 30)])
        assert driver.create_output_topic("odd", STR, LONG).read_key_values() == [("k", 1), ("k", None)]
