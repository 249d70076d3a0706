"""Session-windowed aggregations through the test driver: merging, tombstones, lateness, queries,
restore (Kafka Streams' ``KStreamSessionWindowAggregateProcessorTest``)."""

from __future__ import annotations

from typing import Any

import pytest

from streamloop import Materialized, SessionWindows, StreamsBuilder, TopologyError, Windowed
from streamloop.serdes import JsonSerde, LongSerde, StringSerde
from streamloop.testing import TopologyTestDriver

STR, LONG, JSON = StringSerde(), LongSerde(), JsonSerde()
NO_CACHE = {"cache.max.bytes.buffering": 0}


def session_topology(windows: SessionWindows, how: str = "count") -> StreamsBuilder:
    builder = StreamsBuilder()
    grouped = builder.stream("in", key_serde=STR, value_serde=STR).group_by_key()
    windowed = grouped.windowed_by(windows)
    if how == "count":
        table = windowed.count(materialized="sessions")
        serde: Any = LONG
    elif how == "aggregate":
        table = windowed.aggregate(lambda: "", lambda _k, v, agg: agg + v, lambda _k, a, b: a + b,
                                   materialized=Materialized("sessions", value_serde=STR))
        serde = STR
    else:
        table = windowed.reduce(lambda a, b: a + b, materialized="sessions")
        serde = STR
    (table.to_stream().map(lambda w, v: (f"{w.key}@{w.start}-{w.end}", v))
          .to("out", key_serde=STR, value_serde=serde))
    return builder


def test_sessions_merge_and_merged_away_sessions_go_downstream_as_tombstones() -> None:
    """As ``shouldRemoveMergedSessionsFromStateStore``/``shouldHandleMultipleSessionsAndMerging``: a
    record within the gap of sessions merges them; each merged session is deleted (a tombstone)
    before the merged session is forwarded, with the session end as the record timestamp."""
    with TopologyTestDriver(session_topology(SessionWindows.of_inactivity_gap_with_no_grace(50)).build(),
                            NO_CACHE) as driver:
        source = driver.create_input_topic("in", STR, STR)
        out = driver.create_output_topic("out", STR, LONG)
        source.pipe_input("a", "x", 0)
        source.pipe_input("a", "x", 30)
        source.pipe_input("a", "x", 100)
        assert [(r.key, r.value, r.timestamp) for r in out.read_records()] == [
            ("a@0-0", 1, 0), ("a@0-0", None, 0), ("a@0-30", 2, 30), ("a@100-100", 1, 100)]
        source.pipe_input("a", "x", 70)  # out of order: bridges [0, 30] and [100, 100]
        assert out.read_key_values() == [("a@0-30", None), ("a@100-100", None), ("a@0-100", 4)]
        store = driver.get_session_store("sessions")
        assert store.fetch("a") == [(Windowed("a", 0, 100), 4)]
        assert store.fetch_session("a", 0, 100) == 4
        assert store.fetch("b") == []


def test_aggregate_merges_with_the_merger_and_reduce_with_the_reducer() -> None:
    """``shouldMergeSessions``: the merged session's aggregate is the merger over the merged ones,
    then the aggregator with the new record."""
    for how in ("aggregate", "reduce"):
        with TopologyTestDriver(session_topology(SessionWindows.of_inactivity_gap_with_no_grace(10), how).build(),
                                NO_CACHE) as driver:
            source = driver.create_input_topic("in", STR, STR)
            for value, timestamp in [("a", 0), ("c", 20), ("b", 10)]:
                source.pipe_input("k", value, timestamp)
            assert driver.get_session_store("sessions").fetch("k") == [(Windowed("k", 0, 20), "acb")], how


def test_a_record_whose_session_closed_is_dropped() -> None:
    """``shouldLogAndMeterWhenSkippingLateRecordWithNonzeroGrace``: late when the merged session ends
    before stream time - gap - grace; with grace, a record that late still merges."""
    windows = SessionWindows.of_inactivity_gap_and_grace(10, 20)
    with TopologyTestDriver(session_topology(windows).build(), NO_CACHE) as driver:
        source = driver.create_input_topic("in", STR, STR)
        out = driver.create_output_topic("out", STR, LONG)
        source.pipe_input("a", "x", 100)
        source.pipe_input("b", "x", 70)   # close time 100 - 30 = 70: [70, 70] still open
        source.pipe_input("b", "x", 69)   # merges with [70, 70]: ends at 70, still open
        source.pipe_input("c", "x", 69)   # alone, [69, 69] ends before 70: late
        assert out.read_key_values() == [("a@100-100", 1), ("b@70-70", 1), ("b@70-70", None), ("b@69-70", 2)]
        assert driver.get_session_store("sessions").fetch("c") == []


def test_sessions_are_restored_from_their_changelog_and_keep_merging() -> None:
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=STR).group_by_key()
            .windowed_by(SessionWindows.of_inactivity_gap_with_no_grace(50))
            .count(materialized=Materialized("sessions", persistent=False)))  # in memory: restored in full
    with TopologyTestDriver(builder.build(), NO_CACHE) as driver:
        source = driver.create_input_topic("in", STR, STR)
        source.pipe_input("a", "x", 0)
        source.pipe_input("a", "x", 10)
        driver.rebalance(driver.task_ids[0])
        source.pipe_input("a", "x", 40)
        assert driver.get_session_store("sessions").fetch("a") == [(Windowed("a", 0, 40), 3)]
        assert sum(t.state_manager.restored for t in driver._manager.tasks.values() if t.state_manager) == 3


def test_the_session_changelog_is_compacted_and_deleted_after_the_retention() -> None:
    topology = session_topology(SessionWindows.of_inactivity_gap_and_grace(50, 5)).build()
    topology.set_application_id("app")
    partitions, config = topology.internal_topics({"in": 2})["app-sessions-changelog"]
    assert partitions == 2
    assert config["cleanup.policy"] == "compact,delete"
    assert int(config["retention.ms"]) > 105


def test_session_windows_check_their_arguments() -> None:
    with pytest.raises(TopologyError):
        SessionWindows.of_inactivity_gap_with_no_grace(0)
    with pytest.raises(TopologyError):
        SessionWindows.of_inactivity_gap_and_grace(10, -1)


@pytest.mark.parametrize("persistent", [False, True], ids=["memory", "rocksdb"])
def test_a_lookup_reads_its_own_key_not_the_keys_that_start_with_its_bytes(
        persistent: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys ``a``, ``a1``, ``a10``: each merges only its own sessions, and finding ``a``'s sessions
    reads no entry of the others (their bytes sort between ``a``'s and ``a`` + the largest time),
    also after a restore, whose sessions only the store beneath has seen."""
    if persistent:
        pytest.importorskip("rocksdict")
    from streamloop.state.segments import SegmentedBytesStore
    from streamloop.state.uncommitted import UncommittedWrites

    read: list[bytes] = []
    for layer in (SegmentedBytesStore, UncommittedWrites):
        def counting(self: Any, low: bytes | None, high: bytes | None, _inner: Any = layer.range) -> Any:
            for entry in _inner(self, low, high):
                read.append(entry[0])
                yield entry
        monkeypatch.setattr(layer, "range", counting)
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=STR).group_by_key()
            .windowed_by(SessionWindows.of_inactivity_gap_with_no_grace(50))
            .count(materialized=Materialized("sessions", persistent=persistent)))
    with TopologyTestDriver(builder.build(), NO_CACHE) as driver:
        source = driver.create_input_topic("in", STR, STR)
        for time in range(0, 200, 20):
            for key in ("a1", "a10", "a"):
                source.pipe_input(key, "x", time)
        driver.rebalance(driver.task_ids[0])
        read.clear()
        source.pipe_input("a", "x", 210)
        assert read and all(len(k) == len(b"a") + 16 for k in read)  # a's session only
        store = driver.get_session_store("sessions")
        assert store.fetch("a") == [(Windowed("a", 0, 210), 11)]
        assert store.fetch("a1") == [(Windowed("a1", 0, 180), 10)]
        assert store.fetch("a10") == [(Windowed("a10", 0, 180), 10)]


class _Retry:
    def configure(self, config: Any) -> None:
        """Nothing to configure."""

    def handle(self, context: Any, record: Any, exception: BaseException) -> Any:
        from streamloop.handlers import Answer

        return Answer.RETRY


def test_a_retried_record_that_merged_sessions_puts_them_back_before_it_runs_again() -> None:
    """A call after the aggregation fails once per update and is retried: each record's merge (the
    sessions it removed, the one it stored) is undone before it runs again, so the store is that of
    a run without failures."""
    windows = SessionWindows.of_inactivity_gap_with_no_grace(50)
    inputs = [("a", "x", 0), ("a", "x", 100), ("b", "x", 120), ("a", "x", 60), ("a", "x", 200), ("b", "x", 150),
              ("a", "x", 130)]

    def run(failing: bool) -> tuple[list[Any], list[Any]]:
        failed: set[int] = set()

        def call(key: str, value: int) -> tuple[str, int]:
            if failing and value is not None and (key, value) not in failed:
                failed.add((key, value))  # type: ignore[arg-type]
                raise RuntimeError("service down")
            return key, value

        builder = StreamsBuilder()
        (builder.stream("in", key_serde=STR, value_serde=STR).group_by_key()
                .windowed_by(windows).count(materialized="sessions")
                .to_stream().map(lambda w, v: (f"{w.key}@{w.start}-{w.end}", v))
                .map(call, name="call-service")
                .to("out", key_serde=STR, value_serde=LONG))
        config = {**NO_CACHE, "processing.exception.handler": _Retry(), "processing.retry.backoff.ms": 1,
                  "processing.retry.backoff.max.ms": 2, "processing.retry.max.attempts": 3}
        with TopologyTestDriver(builder.build(), config) as driver:
            source = driver.create_input_topic("in", STR, STR)
            out = driver.create_output_topic("out", STR, LONG)
            for key, value, at in inputs:
                source.pipe_input(key, value, at)
            store = driver.get_session_store("sessions")
            return out.read_key_values(), [*store.fetch("a"), *store.fetch("b")]

    retried_output, retried_sessions = run(failing=True)
    output, sessions = run(failing=False)
    assert retried_sessions == sessions
    # [0, 0] is past its retention at stream time 200; 130 came after [60, 100] closed.
    assert sessions == [(Windowed("a", 60, 100), 2), (Windowed("a", 200, 200), 1), (Windowed("b", 120, 150), 2)]
    # What a failed attempt sent before its failure (a merged-away session's tombstone) goes again.
    assert [kv for i, kv in enumerate(retried_output) if i == 0 or kv != retried_output[i - 1]] == output
