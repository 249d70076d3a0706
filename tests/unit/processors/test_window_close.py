"""Windows that close when the input goes quiet: ``EmitStrategy.on_window_close()`` for time-windowed
aggregations (Kafka Streams' KIP-825, on the scenarios of ``KStreamWindowAggregateTest``) and the
opt-in wall-clock close of it and of ``suppress(until_window_closes)``, through the test driver."""

from __future__ import annotations

from typing import Any

import pytest

from streamloop import (
    BufferConfig,
    EmitStrategy,
    Materialized,
    SessionWindows,
    SlidingWindows,
    StreamsBuilder,
    Suppressed,
    TimeWindows,
    TopologyError,
)
from streamloop.processors.emit_final import FinalSessionWindowAggregateProcessor, FinalWindowAggregateProcessor
from streamloop.processors.suppress import SuppressProcessor
from streamloop.serdes import LongSerde, StringSerde
from streamloop.testing import TopologyTestDriver

STR, LONG = StringSerde(), LongSerde()
NO_CACHE = {"cache.max.bytes.buffering": 0}
CACHES = [pytest.param(NO_CACHE, id="no-cache"), pytest.param({}, id="cache")]
# KStreamWindowAggregateTest's windows: size 10, advance 5, grace 5.
HOPPING = TimeWindows.of_size_and_grace(10, 5).advance_by(5)


def final_aggregate(windows: TimeWindows, strategy: EmitStrategy) -> StreamsBuilder:
    """``KStreamWindowAggregateTest``'s string-adding aggregation (``"0" + "+v"`` per record) to ``out``."""
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=STR).group_by_key()
            .windowed_by(windows).emit_strategy(strategy)
            .aggregate(lambda: "0", lambda _k, v, agg: f"{agg}+{v}", materialized=Materialized("agg", value_serde=STR))
            .to_stream().map(lambda w, v: (f"{w.key}@{w.start}/{w.end}", v))
            .to("out", key_serde=STR, value_serde=STR))
    return builder


def pipe(driver: TopologyTestDriver, records: list[tuple[str, str, int]]) -> None:
    source = driver.create_input_topic("in", STR, STR)
    for key, value, timestamp in records:
        source.pipe_input(key, value, timestamp)


_OUTPUTS: dict[int, Any] = {}


def out(driver: TopologyTestDriver) -> list[tuple[str, str, int]]:
    """What went to ``out`` since the last call (one reader per driver)."""
    reader = _OUTPUTS.get(id(driver))
    if reader is None or reader[0] is not driver:
        reader = _OUTPUTS[id(driver)] = (driver, driver.create_output_topic("out", STR, STR))
    return [(r.key, r.value, r.timestamp) for r in reader[1].read_records()]


def tick(driver: TopologyTestDriver, ms: int, step: int = 1_000) -> None:
    """The wall clock moves ``ms`` as it does in a running application: a check every ``step``."""
    for _ in range(ms // step):
        driver.advance_wall_clock_time(step)


def processors(driver: TopologyTestDriver, kind: type) -> list[Any]:
    return [node.processor for task in driver._manager.tasks.values() for node in task.graph.nodes
            if isinstance(getattr(node, "processor", None), kind)]


@pytest.mark.parametrize("config", CACHES)
def test_each_window_goes_out_once_with_its_final_value_when_stream_time_closes_it(config: dict[str, Any]) -> None:
    """Matches KStreamWindowAggregateTest.shouldEmitWithInterval0 (ON_WINDOW_CLOSE): a window goes out
    when stream time reaches its end + grace, with the largest record timestamp in it, oldest first;
    cached or not, no update goes out before."""
    with TopologyTestDriver(final_aggregate(HOPPING, EmitStrategy.on_window_close()).build(), config) as driver:
        pipe(driver, [("A", "1", 0), ("A", "1", 5), ("B", "2", 10), ("C", "3", 15), ("D", "4", 20)])
        assert out(driver) == [("A@0/10", "0+1+1", 5), ("A@5/15", "0+1", 5), ("B@5/15", "0+2", 10)]
        # The store is the table's as with updates: every window, closed or not.
        assert driver.get_window_store("agg").fetch_range("D", 0, 100) == [(15, "0+4"), (20, "0+4")]


def test_nothing_goes_out_while_stream_time_does_not_reach_a_new_close() -> None:
    """Matches KStreamWindowAggregateTest.shouldNotEmitFinalIfNotProgressEnough (ON_WINDOW_CLOSE)."""
    with TopologyTestDriver(final_aggregate(HOPPING, EmitStrategy.on_window_close()).build(), NO_CACHE) as driver:
        pipe(driver, [("A", "1", 0), ("B", "2", 5), ("C", "3", 15)])
        assert out(driver) == [("A@0/10", "0+1", 0), ("B@0/10", "0+2", 5)]
        pipe(driver, [("D", "4", 15), ("E", "5", 19)])
        assert out(driver) == []


def test_a_window_emitted_before_a_restart_is_not_emitted_again() -> None:
    """Matches KStreamWindowAggregateTest.shouldEmitFromLastEmitTime (ON_WINDOW_CLOSE): new processors
    (a moved task) over the restored store emit only the windows that closed since."""
    with TopologyTestDriver(final_aggregate(HOPPING, EmitStrategy.on_window_close()).build(), NO_CACHE) as driver:
        pipe(driver, [("A", "1", 0), ("B", "2", 5), ("C", "3", 15)])
        assert out(driver) == [("A@0/10", "0+1", 0), ("B@0/10", "0+2", 5)]
        driver.rebalance(driver.task_ids[0])
        pipe(driver, [("D", "4", 25)])
        assert out(driver) == [("B@5/15", "0+2", 5), ("C@10/20", "0+3", 15)]
        driver.crash()
        pipe(driver, [("E", "5", 30)])
        assert out(driver) == [("C@15/25", "0+3", 15)]


def test_records_for_closed_windows_are_dropped_as_late() -> None:
    """Matches KStreamWindowAggregateTest.shouldLogAndMeterWhenSkippingExpiredWindowByGrace
    (ON_WINDOW_CLOSE): records past the grace period are dropped and counted; the open window at
    200 is not emitted."""
    windows = TimeWindows.of_size_and_grace(10, 90)
    with TopologyTestDriver(final_aggregate(windows, EmitStrategy.on_window_close()).build(), NO_CACHE) as driver:
        pipe(driver, [("k", "100", 200), *[("k", str(i), 100 + i) for i in range(6)], ("k", "6", 6)])
        assert out(driver) == []
        [processor] = processors(driver, FinalWindowAggregateProcessor)
        assert processor.dropped == 7


def test_on_window_update_is_the_default() -> None:
    """Matches KStreamWindowAggregateTest.testAggBasic (ON_WINDOW_UPDATE): every update goes out."""
    with TopologyTestDriver(final_aggregate(HOPPING, EmitStrategy.on_window_update()).build(), NO_CACHE) as driver:
        pipe(driver, [("A", "1", 0), ("A", "1", 5)])
        assert [(k, v) for k, v, _ in out(driver)] == [("A@0/10", "0+1"), ("A@0/10", "0+1+1"), ("A@5/15", "0+1")]


# -- the wall clock -------------------------------------------------------------------------------
START = 1_000_000  # the wall clock and the records' timestamps, in epoch ms
MINUTE = TimeWindows.of_size_and_grace(60_000, 5_000)


def test_the_last_window_closes_on_the_wall_clock_once_the_input_is_quiet() -> None:
    """With stream time alone the key's last window never closes; with a wall-clock close it goes out
    once its end + grace has passed on the wall clock and no record came for the idle time."""
    strategy = EmitStrategy.on_window_close().with_wall_clock_close(10_000, check_interval_ms=1_000)
    with TopologyTestDriver(final_aggregate(MINUTE, strategy).build(), initial_wall_clock_ms=START) as driver:
        window = START - START % 60_000
        end = window + 60_000
        pipe(driver, [("k", "1", START), ("k", "2", START + 1)])
        driver.advance_wall_clock_time(end + 5_000 - 1 - START)  # quiet, but end + grace not reached
        assert out(driver) == []
        driver.advance_wall_clock_time(1_000)
        assert out(driver) == [(f"k@{window}/{end}", "0+1+2", START + 1)]
        # Closed: a record for it now is late, dropped and counted; nothing goes out twice.
        pipe(driver, [("k", "3", START + 2)])
        driver.advance_wall_clock_time(60_000)
        assert out(driver) == []
        [processor] = processors(driver, FinalWindowAggregateProcessor)
        assert processor.dropped == 1


def test_records_arriving_keep_windows_open_past_their_end_on_the_wall_clock() -> None:
    """The wall clock closes nothing while records come, even ones filtered out before the aggregation
    (the task's input is not quiet): only stream time does."""
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=STR).filter(lambda _k, v: v != "noise").group_by_key()
            .windowed_by(MINUTE)
            .emit_strategy(EmitStrategy.on_window_close().with_wall_clock_close(10_000, check_interval_ms=1_000))
            .count(materialized="counts")
            .to_stream().map(lambda w, n: (f"{w.key}@{w.start}", n)).to("out", key_serde=STR, value_serde=LONG))
    with TopologyTestDriver(builder.build(), initial_wall_clock_ms=START) as driver:
        source = driver.create_input_topic("in", STR, STR)
        output = driver.create_output_topic("out", STR, LONG)
        source.pipe_input("k", "v", START)
        for _ in range(100):  # 100 s of wall clock, a filtered-out record every 5 s
            driver.advance_wall_clock_time(5_000)
            source.pipe_input("other", "noise", START)
        assert output.read_key_values() == []
        # A record that did not reach the aggregation is seen at the next check: the quiet starts there.
        for _ in range(10):
            driver.advance_wall_clock_time(1_000)
        assert output.read_key_values() == []
        driver.advance_wall_clock_time(1_000)
        assert output.read_key_values() == [(f"k@{START - START % 60_000}", 1)]


def test_a_wall_clock_close_survives_a_restart() -> None:
    """After a crash the close time of the last emission is restored: the window is not emitted again
    and a late record for it stays late."""
    strategy = EmitStrategy.on_window_close().with_wall_clock_close(1_000)
    with TopologyTestDriver(final_aggregate(MINUTE, strategy).build(), initial_wall_clock_ms=START) as driver:
        pipe(driver, [("k", "1", START)])
        driver.advance_wall_clock_time(70_000)
        [(_, value, _)] = out(driver)
        assert value == "0+1"
        driver.crash()
        pipe(driver, [("k", "2", START + 1)])
        driver.advance_wall_clock_time(70_000)
        assert out(driver) == []
        [processor] = processors(driver, FinalWindowAggregateProcessor)
        assert processor.dropped == 1


def suppressed_counts(suppressed: Suppressed) -> StreamsBuilder:
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=STR).group_by_key().windowed_by(MINUTE)
            .count(materialized="counts").suppress(suppressed)
            .to_stream().map(lambda w, n: (f"{w.key}@{w.start}", n)).to("out", key_serde=STR, value_serde=LONG))
    return builder


@pytest.mark.parametrize("config", CACHES)
def test_suppress_until_window_closes_can_close_on_the_wall_clock(config: dict[str, Any]) -> None:
    """The aggregation's updates still in its cache go into the buffer first; an update for a window the
    suppression closed (the aggregation, on stream time, still takes it) is dropped, not emitted twice."""
    suppressed = Suppressed.until_window_closes(BufferConfig.unbounded()).with_wall_clock_close(
        10_000, check_interval_ms=1_000)
    config = {**config, "commit.interval.ms": 3_600_000}  # the cache flushes only when the test asks
    with TopologyTestDriver(suppressed_counts(suppressed).build(), config, initial_wall_clock_ms=START) as driver:
        source = driver.create_input_topic("in", STR, STR)
        output = driver.create_output_topic("out", STR, LONG)
        window = START - START % 60_000
        for i in range(3):
            source.pipe_input("k", "v", START + i)
        tick(driver, window + 65_000 - START)
        assert output.read_key_values() == [(f"k@{window}", 3)]
        source.pipe_input("k", "v", START + 10)
        tick(driver, 70_000)
        assert output.read_key_values() == []
        driver.crash()
        source.pipe_input("k", "v", START + 11)
        tick(driver, 70_000)
        assert output.read_key_values() == []
        # Nothing was committed (the long commit interval): the records before the crash are processed
        # again, and their updates of the closed window are dropped too.
        assert sum(p.dropped for p in processors(driver, SuppressProcessor)) >= 1


def test_bad_settings_are_typed_errors_naming_the_fix() -> None:
    with pytest.raises(TopologyError, match="on_window_close"):
        EmitStrategy.on_window_update().with_wall_clock_close(1_000)
    with pytest.raises(TopologyError, match="idle_ms must be an int >= 1"):
        EmitStrategy.on_window_close().with_wall_clock_close(0)
    with pytest.raises(TopologyError, match="check_interval_ms must be an int >= 1"):
        Suppressed.until_window_closes(BufferConfig.unbounded()).with_wall_clock_close(1_000, check_interval_ms=0)
    with pytest.raises(TopologyError, match="until_window_closes"):
        Suppressed.until_time_limit(10, BufferConfig.unbounded()).with_wall_clock_close(1_000)
    grouped = StreamsBuilder().stream("in").group_by_key()
    with pytest.raises(TopologyError, match="needs an EmitStrategy"):
        grouped.windowed_by(MINUTE).emit_strategy("on_window_close")  # type: ignore[arg-type]


def test_the_close_time_has_a_changelogged_store_of_its_own() -> None:
    topology = final_aggregate(MINUTE, EmitStrategy.on_window_close()).build()
    assert "(stores: [agg, agg-close-time])" in topology.describe()
    topology.set_application_id("app")
    assert "app-agg-close-time-changelog" in topology.internal_topics({"in": 2})


def test_the_wall_clock_may_move_before_any_record() -> None:
    """The driver restores a task's stores before its first wall-clock punctuation, as a stream thread
    does (it punctuated a task whose stores were not open yet, and the check failed reading them)."""
    strategy = EmitStrategy.on_window_close().with_wall_clock_close(1_000)
    with TopologyTestDriver(final_aggregate(MINUTE, strategy).build(), initial_wall_clock_ms=START) as driver:
        driver.advance_wall_clock_time(5_000)
        pipe(driver, [("k", "1", START + 5_000)])
        tick(driver, 70_000)
        assert [v for _, v, _ in out(driver)] == ["0+1"]


@pytest.mark.parametrize("config", CACHES)
def test_sliding_windows_go_out_once_when_they_close(config: dict[str, Any]) -> None:
    """Matches KStreamSlidingWindowAggregateTest.testAggregateSmallInput (ON_WINDOW_CLOSE): at stream
    time 30 with grace 5 the windows ending before 25 go out, each once with its final aggregate and
    largest timestamp; [15, 25] is still open."""
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=STR).group_by_key()
            .windowed_by(SlidingWindows.of_time_difference_and_grace(10, 5))
            .emit_strategy(EmitStrategy.on_window_close())
            .aggregate(lambda: "0", lambda _k, v, agg: f"{agg}+{v}", materialized=Materialized("agg", value_serde=STR))
            .to_stream().map(lambda w, v: (f"{w.key}@{w.start}/{w.end}", v))
            .to("out", key_serde=STR, value_serde=STR))
    with TopologyTestDriver(builder.build(), config) as driver:
        pipe(driver, [("A", "1", 10), ("A", "2", 10), ("A", "3", 14), ("A", "4", 15), ("A", "5", 20),
                      ("A", "6", 22), ("A", "7", 30)])
        assert out(driver) == [("A@0/10", "0+1+2", 10), ("A@4/14", "0+1+2+3", 14), ("A@5/15", "0+1+2+3+4", 15),
                               ("A@10/20", "0+1+2+3+4+5", 20), ("A@11/21", "0+3+4+5", 20),
                               ("A@12/22", "0+3+4+5+6", 22)]
        driver.rebalance(driver.task_ids[0])
        pipe(driver, [("A", "8", 31)])  # closes [15, 25] only, and nothing twice
        assert out(driver) == [("A@15/25", "0+4+5+6", 22)]


@pytest.mark.parametrize("config", CACHES)
def test_sessions_go_out_once_when_they_close(config: dict[str, Any]) -> None:
    """Matches KStreamSessionWindowAggregateProcessorTest.shouldHandleMultipleSessionsAndMerging
    (ON_WINDOW_CLOSE): a session goes out once stream time - gap - grace is past its end, with its end
    as timestamp; merged-away sessions never go out, and no tombstone does."""
    gap = 5 * 60 * 1000
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=STR).group_by_key()
            .windowed_by(SessionWindows.of_inactivity_gap_with_no_grace(gap))
            .emit_strategy(EmitStrategy.on_window_close())
            .count(materialized="sessions")
            .to_stream().map(lambda w, n: (f"{w.key}@{w.start}/{w.end}", str(n)))
            .to("out", key_serde=STR, value_serde=STR))
    with TopologyTestDriver(builder.build(), config) as driver:
        pipe(driver, [("a", "1", 0), ("b", "1", 0), ("c", "1", 0), ("d", "1", 0), ("d", "2", gap // 2),
                      ("a", "2", gap + 1), ("b", "2", gap + 1), ("a", "3", gap + 1 + gap // 2),
                      ("c", "3", gap + 1 + gap // 2)])
        assert out(driver) == [("a@0/0", "1", 0), ("b@0/0", "1", 0), ("c@0/0", "1", 0),
                               (f"d@0/{gap // 2}", "2", gap // 2)]
        driver.crash()
        # a's second session [gap + 1, gap + 1 + gap / 2] merges with a record in its gap, then closes.
        pipe(driver, [("a", "4", 2 * gap), ("z", "1", 10 * gap)])
        assert out(driver) == [(f"b@{gap + 1}/{gap + 1}", "1", gap + 1),
                               (f"c@{gap + 1 + gap // 2}/{gap + 1 + gap // 2}", "1", gap + 1 + gap // 2),
                               (f"a@{gap + 1}/{2 * gap}", "3", 2 * gap)]


def test_a_session_closes_on_the_wall_clock_once_the_input_is_quiet() -> None:
    """A session goes out once its end + gap + grace has passed on the wall clock and the input was
    quiet; a record inside it is late then (one that would make it end after the close time is not:
    as on stream time, the longer session it makes goes out in turn)."""
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=STR).group_by_key()
            .windowed_by(SessionWindows.of_inactivity_gap_and_grace(30_000, 1_000))
            .emit_strategy(EmitStrategy.on_window_close().with_wall_clock_close(5_000))
            .count(materialized="sessions")
            .to_stream().map(lambda w, n: (f"{w.key}@{w.start}/{w.end}", str(n)))
            .to("out", key_serde=STR, value_serde=STR))
    with TopologyTestDriver(builder.build(), initial_wall_clock_ms=START) as driver:
        pipe(driver, [("k", "1", START), ("k", "2", START + 10_000)])
        tick(driver, 41_000)  # START + 10000 + gap + grace is START + 41000: not past yet
        assert out(driver) == []
        tick(driver, 1_000)
        assert out(driver) == [(f"k@{START}/{START + 10_000}", "2", START + 10_000)]
        pipe(driver, [("k", "3", START + 5_000)])
        tick(driver, 60_000)
        assert out(driver) == []
        [processor] = processors(driver, FinalSessionWindowAggregateProcessor)
        assert processor.dropped == 1
