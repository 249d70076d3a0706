"""Sliding-window aggregations through the test driver, on the inputs and expectations of Kafka
Streams' ``KStreamSlidingWindowAggregateTest``."""

from __future__ import annotations

import pytest

from streamloop import Materialized, SlidingWindows, StreamsBuilder, TopologyError, Windowed
from streamloop.serdes import LongSerde, StringSerde
from streamloop.testing import TopologyTestDriver

STR, LONG = StringSerde(), LongSerde()
NO_CACHE = {"cache.max.bytes.buffering": 0}


def adder_topology(windows: SlidingWindows) -> StreamsBuilder:
    """``MockInitializer.STRING_INIT`` and ``MockAggregator.TOSTRING_ADDER`` of the Kafka tests."""
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=STR).group_by_key().windowed_by(windows)
            .aggregate(lambda: "0", lambda _k, v, agg: f"{agg}+{v}", materialized=Materialized("w", value_serde=STR))
            .to_stream().map(lambda w, v: (f"{w.key}@{w.start}-{w.end}", v)).to("out", key_serde=STR, value_serde=STR))
    return builder


def final_windows(windows: SlidingWindows, records: list[tuple[str, str, int]]) -> dict[str, tuple[str, int]]:
    """The last update of each window: ``"key@start" -> (value, timestamp)``."""
    with TopologyTestDriver(adder_topology(windows).build(), NO_CACHE) as driver:
        source = driver.create_input_topic("in", STR, STR)
        for key, value, timestamp in records:
            source.pipe_input(key, value, timestamp)
        final: dict[str, tuple[str, int]] = {}
        for record in driver.create_output_topic("out", STR, STR).read_records():
            key, _, window = record.key.partition("@")
            start, _, end = window.partition("-")
            assert int(end) == int(start) + windows.time_difference_ms
            final[f"{key}@{start}"] = (record.value, record.timestamp)
        return final


def test_aggregate_small_input() -> None:
    """``testAggregateSmallInput``: the left window of each record, the right windows of those with
    a later record within the difference, each with its largest record timestamp."""
    got = final_windows(SlidingWindows.of_time_difference_and_grace(10, 50),
                        [("A", "1", 10), ("A", "2", 15), ("A", "3", 20), ("A", "4", 22), ("A", "5", 30)])
    assert got == {"A@0": ("0+1", 10), "A@5": ("0+1+2", 15), "A@10": ("0+1+2+3", 20), "A@11": ("0+2+3", 20),
                   "A@12": ("0+2+3+4", 22), "A@16": ("0+3+4", 22), "A@20": ("0+3+4+5", 30),
                   "A@21": ("0+4+5", 30), "A@23": ("0+5", 30)}


def test_aggregate_large_input_out_of_order() -> None:
    """``testAggregateLargeInput``: out-of-order records update the windows that contain them and
    create the ones they define (the FINAL WINDOW values there)."""
    records = [("A", "1", 10), ("A", "2", 20), ("A", "3", 22), ("A", "4", 15),
               ("B", "1", 12), ("B", "2", 13), ("B", "3", 18), ("B", "4", 19), ("B", "5", 25), ("B", "6", 14),
               ("C", "1", 11), ("C", "2", 15), ("C", "3", 16), ("C", "4", 21), ("C", "5", 23),
               ("D", "4", 11), ("D", "2", 12), ("D", "3", 29), ("D", "5", 16)]
    got = final_windows(SlidingWindows.of_time_difference_and_grace(10, 50), records)
    expected = {
        "A": [(0, "0+1", 10), (5, "0+1+4", 15), (10, "0+1+2+4", 20), (11, "0+2+4", 20), (12, "0+2+3+4", 22),
              (16, "0+2+3", 22), (21, "0+3", 22)],
        "B": [(2, "0+1", 12), (3, "0+1+2", 13), (4, "0+1+2+6", 14), (8, "0+1+2+3+6", 18),
              (9, "0+1+2+3+4+6", 19), (13, "0+2+3+4+6", 19), (14, "0+3+4+6", 19), (15, "0+3+4+5", 25),
              (19, "0+4+5", 25), (20, "0+5", 25)],
        "C": [(1, "0+1", 11), (5, "0+1+2", 15), (6, "0+1+2+3", 16), (11, "0+1+2+3+4", 21), (12, "0+2+3+4", 21),
              (13, "0+2+3+4+5", 23), (16, "0+3+4+5", 23), (17, "0+4+5", 23), (22, "0+5", 23)],
        "D": [(1, "0+4", 11), (2, "0+4+2", 12), (6, "0+4+2+5", 16), (12, "0+2+5", 16), (13, "0+5", 16),
              (19, "0+3", 29)],
    }
    assert got == {f"{k}@{start}": (v, ts) for k, windows in expected.items() for start, v, ts in windows}


def test_early_records_share_the_window_from_zero() -> None:
    """``testEarlyRecordsSmallInput`` and ``testEarlyRecordsRepeatedInput``: records before the time
    difference go into ``[0, diff]`` and get right windows as later records come."""
    got = final_windows(SlidingWindows.of_time_difference_and_grace(50, 200),
                        [("A", "1", 0), ("A", "2", 5), ("A", "3", 6), ("A", "4", 3), ("A", "5", 13), ("A", "6", 10)])
    assert got == {"A@0": ("0+1+2+3+4+5+6", 13), "A@1": ("0+2+3+4+5+6", 13), "A@4": ("0+2+3+5+6", 13),
                   "A@6": ("0+3+5+6", 13), "A@7": ("0+5+6", 13), "A@11": ("0+5", 13)}
    got = final_windows(SlidingWindows.of_time_difference_and_grace(5, 20),
                        [("A", "1", 0), ("A", "2", 2), ("A", "3", 4), ("A", "4", 0), ("A", "5", 2), ("A", "6", 2),
                         ("A", "7", 0)])
    assert got == {"A@0": ("0+1+2+3+4+5+6+7", 4), "A@1": ("0+2+3+5+6", 4), "A@3": ("0+3", 4)}


def test_late_records_are_dropped_and_closed_windows_not_updated() -> None:
    """``testAggregateRandomInput``'s lateness rule: a record is dropped once its right window would
    end before stream time - grace; a window ending before that is not updated."""
    got = final_windows(SlidingWindows.of_time_difference_with_no_grace(10),
                        [("A", "1", 100), ("A", "2", 89), ("A", "3", 95)])
    # 89 + 1 + 10 = 100 <= 100: dropped. 95's left window [85, 95] ends before 100: not created;
    # the window [90, 100] of the record at 100 takes it, and 95's right window holds the record at 100.
    assert got == {"A@90": ("0+1+3", 100), "A@96": ("0+1", 100)}


def test_counts_are_queryable_and_restored() -> None:
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=STR).group_by_key()
            .windowed_by(SlidingWindows.of_time_difference_with_no_grace(10))
            .count(materialized=Materialized("counts", persistent=False)))  # in memory: restored in full
    with TopologyTestDriver(builder.build(), NO_CACHE) as driver:
        source = driver.create_input_topic("in", STR, STR)
        for timestamp in (10, 15):
            source.pipe_input("k", "v", timestamp)
        driver.rebalance(driver.task_ids[0])
        source.pipe_input("k", "v", 20)
        store = driver.get_window_store("counts")
        assert store.fetch_range("k", 0, 100) == [(0, 1), (5, 2), (10, 3), (11, 2), (16, 1)]
        assert sorted(store.all(), key=lambda item: item[0].start) == [
            (Windowed("k", s, s + 10), n) for s, n in [(0, 1), (5, 2), (10, 3), (11, 2), (16, 1)]]


def test_sliding_windows_check_their_arguments() -> None:
    with pytest.raises(TopologyError):
        SlidingWindows.of_time_difference_with_no_grace(0)
    with pytest.raises(TopologyError):
        SlidingWindows.of_time_difference_and_grace(10, -5)
