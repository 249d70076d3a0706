"""Stream-stream windowed joins, on the test driver; each test names the Kafka Streams test it matches.

Kafka Streams' tests read from ``streams/src/test/java/org/apache/kafka/streams/kstream/internals/``;
its ``MockValueJoiner.TOSTRING_JOINER`` is ``joiner`` here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from streamloop import JoinWindows, StreamJoined, StreamsBuilder, Topology
from streamloop.errors import TopologyError
from streamloop.serdes import IntegerSerde, LongSerde, StringSerde
from streamloop.state.bytes_stores import InMemoryBytesStore
from streamloop.state.join_store import JoinWindowStore
from streamloop.testing import TopologyTestDriver

INT, STR, LONG = IntegerSerde(), StringSerde(), LongSerde()


def joiner(left: Any, right: Any) -> str:
    return f"{'null' if left is None else left}+{'null' if right is None else right}"


def join_topology(kind: str, windows: JoinWindows, right_values: Any = STR,
                  shape: Callable[[Any, Any], Any] | None = None) -> Topology:
    builder = StreamsBuilder()
    left = builder.stream("left", key_serde=INT, value_serde=STR)
    right = builder.stream("right", key_serde=INT, value_serde=right_values)
    if shape is not None:
        left, right = shape(left, right)
    getattr(left, kind)(right, joiner, windows).to("out", key_serde=INT, value_serde=STR)
    return builder.build()


class Driven:
    def __init__(self, driver: TopologyTestDriver, right_values: Any) -> None:
        self.driver = driver
        self.left = driver.create_input_topic("left", INT, STR)
        self.right = driver.create_input_topic("right", INT, right_values)
        self.out = driver.create_output_topic("out", INT, STR)

    def results(self) -> list[tuple[Any, Any, int]]:
        return [(r.key, r.value, r.timestamp) for r in self.out.read_records()]


@pytest.fixture
def run() -> Iterator[Callable[..., Driven]]:
    drivers: list[TopologyTestDriver] = []

    def start(kind: str, windows: JoinWindows, right_values: Any = STR, **kwargs: Any) -> Driven:
        driver = TopologyTestDriver(join_topology(kind, windows, right_values, **kwargs))
        drivers.append(driver)
        return Driven(driver, right_values)

    yield start
    for driver in drivers:
        driver.close()


def test_inner_join_pairs_records_within_the_window_with_the_larger_timestamp(run) -> None:
    """KStreamKStreamJoinTest.testJoin (its first steps): only keys on both sides join."""
    d = run("join", JoinWindows.of_time_difference_with_no_grace(100))
    d.left.pipe_input(0, "A0", 0)
    d.left.pipe_input(1, "A1", 0)
    assert d.results() == []
    d.right.pipe_input(0, "a0", 5)
    d.right.pipe_input(1, "a1", 5)
    d.right.pipe_input(2, "a2", 5)
    assert d.results() == [(0, "A0+a0", 5), (1, "A1+a1", 5)]
    d.left.pipe_input(0, "B0", 3)
    assert d.results() == [(0, "B0+a0", 5)]


def test_window_bounds_are_inclusive_and_nothing_outside_joins(run) -> None:
    """KStreamKStreamJoinTest.testWindowing (testUpperWindowBound / testLowerWindowBound): a time
    difference of exactly the window joins, one more does not."""
    d = run("join", JoinWindows.of_time_difference_with_no_grace(100))
    d.left.pipe_input(0, "A0", 1000)
    d.right.pipe_input(0, "a", 1100)
    d.right.pipe_input(0, "b", 1101)
    d.right.pipe_input(0, "c", 900)
    d.right.pipe_input(0, "d", 899)
    assert d.results() == [(0, "A0+a", 1100), (0, "A0+c", 1000)]


def test_asymmetric_windows_look_only_the_given_way(run) -> None:
    """KStreamKStreamJoinTest.testAsymmetricWindowingAfter: with before 0, after 100, a right record
    older than the left one does not join."""
    d = run("join", JoinWindows.of_time_difference_with_no_grace(0).after(100))
    d.left.pipe_input(0, "A0", 1000)
    d.right.pipe_input(0, "old", 999)
    d.right.pipe_input(0, "same", 1000)
    d.right.pipe_input(0, "newest", 1100)
    d.right.pipe_input(0, "too-new", 1101)
    assert d.results() == [(0, "A0+same", 1000), (0, "A0+newest", 1100)]


def test_left_join_emits_duplicates_with_none_only_once_the_window_closed(run) -> None:
    """KStreamKStreamLeftJoinTest.testLeftJoinDuplicates."""
    d = run("left_join", JoinWindows.of_time_difference_and_grace(100, 10))
    d.left.pipe_input(0, "A0", 0)
    d.left.pipe_input(0, "A0-0", 0)
    d.right.pipe_input(1, "a0", 110)
    assert d.results() == []  # stream time 110 = 0 + 100 + grace 10: not closed yet
    d.right.pipe_input(2, "dummy", 500)
    assert d.results() == [(0, "A0+null", 0), (0, "A0-0+null", 0)]
    d.left.pipe_input(2, "A2", 1000)
    d.left.pipe_input(2, "A2-0", 1000)
    d.right.pipe_input(2, "a2", 1001)
    assert d.results() == [(2, "A2+a2", 1001), (2, "A2-0+a2", 1001)]
    d.right.pipe_input(3, "a3", 315)
    assert d.results() == []


def test_unmatched_left_records_are_emitted_by_a_right_record_too(run) -> None:
    """KStreamKStreamLeftJoinTest.testLeftExpiredNonJoinedRecordsAreEmittedByTheRightProcessor."""
    d = run("left_join", JoinWindows.of_time_difference_and_grace(100, 0))
    d.left.pipe_input(0, "A0", 1)
    d.left.pipe_input(1, "A1", 2)
    d.left.pipe_input(0, "A0-0", 3)
    d.right.pipe_input(1, "a1", 3)
    assert d.results() == [(1, "A1+a1", 3)]
    d.right.pipe_input(2, "dummy", 401)
    assert d.results() == [(0, "A0+null", 1), (0, "A0-0+null", 3)]
    d.left.pipe_input(2, "dummy", 402)
    assert d.results() == [(2, "dummy+dummy", 402)]


def test_closed_unmatched_records_come_before_the_join_of_the_record_that_closed_them(run) -> None:
    """KStreamKStreamLeftJoinTest.testOrdering."""
    d = run("left_join", JoinWindows.of_time_difference_with_no_grace(100))
    d.left.pipe_input(0, "A0", 0)
    d.left.pipe_input(1, "A1", 100)
    d.right.pipe_input(1, "a1", 110)
    assert d.results() == [(0, "A0+null", 0), (1, "A1+a1", 110)]


def test_grace_holds_unmatched_records_back_and_records_past_the_window_do_not_join(run) -> None:
    """KStreamKStreamLeftJoinTest.testGracePeriod."""
    d = run("left_join", JoinWindows.of_time_difference_and_grace(100, 10))
    d.left.pipe_input(0, "A0", 0)
    d.left.pipe_input(1, "A1", 0)
    for key in range(4):
        d.right.pipe_input(key, f"a{key}", 101)
    assert d.results() == []
    d.right.pipe_input(0, "dummy", 1201)
    assert d.results() == [(0, "A0+null", 0), (1, "A1+null", 0)]


def test_out_of_order_record_whose_window_closed_is_emitted_with_none_at_once(run) -> None:
    """KStreamKStreamLeftJoinTest.testLeftJoinedRecordsWithZeroAfterAreEmitted (first steps): with
    after 0 a left record's window closes with the next newer record, and a right record arriving
    out of order inside the store's retention still joins."""
    d = run("left_join", JoinWindows.of_time_difference_with_no_grace(100).after(0))
    for i in range(4):
        d.left.pipe_input(i, f"A{i}", 1000 + i)
    assert d.results() == [(0, "A0+null", 1000), (1, "A1+null", 1001), (2, "A2+null", 1002)]
    for i in range(4):
        d.right.pipe_input(i, f"a{i}", 999)
    assert d.results() == [(0, "A0+a0", 1000), (1, "A1+a1", 1001), (2, "A2+a2", 1002), (3, "A3+a3", 1003)]
    for i in range(4):
        d.right.pipe_input(i, f"c{i}", 1001)
    assert d.results() == [(1, "A1+c1", 1001), (2, "A2+c2", 1002), (3, "A3+c3", 1003)]


def test_outer_join_emits_both_sides_unmatched_right_first_at_one_timestamp(run) -> None:
    """KStreamKStreamOuterJoinTest.testOuterJoinDuplicates."""
    d = run("outer_join", JoinWindows.of_time_difference_and_grace(100, 10), LONG)
    d.left.pipe_input(0, "A0", 0)
    d.left.pipe_input(0, "A0-0", 0)
    d.right.pipe_input(1, 11, 0)
    d.right.pipe_input(1, 12, 0)
    d.right.pipe_input(1, 10, 111)
    d.right.pipe_input(3, 100, 211)
    assert d.results() == [(1, "null+11", 0), (1, "null+12", 0), (0, "A0+null", 0), (0, "A0-0+null", 0)]
    d.left.pipe_input(2, "A2", 200)
    d.left.pipe_input(2, "A2-0", 200)
    d.right.pipe_input(2, 13, 201)
    d.right.pipe_input(2, 14, 201)
    assert d.results() == [(2, "A2+13", 201), (2, "A2-0+13", 201), (2, "A2+14", 201), (2, "A2-0+14", 201)]
    d.right.pipe_input(3, 100, 1500)
    assert d.results() == [(1, "null+10", 111), (3, "null+100", 211)]


def test_outer_join_with_asymmetric_windows_closes_each_side_by_its_own_look_ahead(run) -> None:
    """KStreamKStreamOuterJoinTest.testEmitAllNonJoinedResultsForAsymmetricWindow."""
    d = run("outer_join", JoinWindows.of_time_difference_with_no_grace(5).after(20), LONG)
    d.left.pipe_input(0, "A0", 29)
    d.left.pipe_input(1, "A1", 30)
    d.right.pipe_input(2, 12, 31)
    d.right.pipe_input(3, 13, 36)
    assert d.results() == []
    d.right.pipe_input(4, 14, 37)
    assert d.results() == [(2, "null+12", 31)]
    d.right.pipe_input(5, 15, 50)
    assert d.results() == [(0, "A0+null", 29), (3, "null+13", 36), (4, "null+14", 37)]


def test_records_without_key_or_value_join_nothing_but_a_left_side_record_without_key_is_emitted(run) -> None:
    """KStreamKStreamJoinTest.shouldLogAndMeterOnSkippedRecordsWithNullValue and KIP-962 (an outer side's
    record without a key is joined with None at once)."""
    d = run("left_join", JoinWindows.of_time_difference_with_no_grace(100))
    d.left.pipe_input(None, "nokey", 5)
    d.left.pipe_input(1, None, 5)
    d.right.pipe_input(None, "r", 5)
    d.right.pipe_input(1, None, 5)
    assert d.results() == [(None, "nokey+null", 5)]
    d.left.pipe_input(1, "A1", 6)
    d.right.pipe_input(1, "a1", 7)
    assert d.results() == [(1, "A1+a1", 7)]


def test_a_record_later_than_the_window_and_grace_is_not_kept_for_later_partners(run) -> None:
    """Late records (KStreamKStreamJoin with Kafka Streams' join window stores, whose retention is the
    window size before + after plus grace): a left record older than the left store's stream time by
    more than that is dropped from the store; the boundary is kept."""
    d = run("join", JoinWindows.of_time_difference_and_grace(10, 5))
    d.left.pipe_input(0, "new", 100)
    d.left.pipe_input(1, "late", 74)   # 100 - 74 = 26 > 10 + 10 + 5
    d.left.pipe_input(2, "in-grace", 75)
    d.right.pipe_input(1, "r", 74)
    d.right.pipe_input(2, "r", 75)
    assert d.results() == [(2, "in-grace+r", 75)]


def test_join_state_is_restored_after_a_crash(run) -> None:
    """Both window stores and the outer store come back from their changelogs: a record from before
    the crash still joins, and one still waiting is emitted with None once its window closes."""
    d = run("left_join", JoinWindows.of_time_difference_with_no_grace(100))
    d.left.pipe_input(1, "A1", 10)
    d.left.pipe_input(0, "A0", 0)
    d.driver.crash()
    d.right.pipe_input(1, "a1", 20)
    assert d.results() == [(1, "A1+a1", 20)]
    d.right.pipe_input(9, "late-enough", 500)
    assert d.results() == [(0, "A0+null", 0)]
    assert d.driver.get_window_store("KSTREAM-JOINTHIS-0000000002-store").fetch_range(1, 0, 100) == [(10, "A1")]


def test_a_retried_record_emits_again_what_it_emitted_and_leaves_nothing_for_later(run) -> None:
    """A record retried after a timeout downstream runs again from its source with the join's store
    updates undone (the store journal): the held-back results its first attempt emitted are back in
    the outer store, so the retry emits them again (at least once), rather than a later, unrelated
    record emitting them behind its own results."""
    attempts: list[str] = []

    def flaky(value: str) -> str:
        attempts.append(value)
        if value == "b+x" and attempts.count(value) == 1:
            raise TimeoutError("the service did not answer")
        return value

    builder = StreamsBuilder()
    left = builder.stream("left", key_serde=INT, value_serde=STR)
    right = builder.stream("right", key_serde=INT, value_serde=STR)
    left.left_join(right, joiner, JoinWindows.of_time_difference_with_no_grace(10)).map_values(flaky).to(
        "out", key_serde=INT, value_serde=STR)
    with TopologyTestDriver(builder.build()) as driver:
        d = Driven(driver, STR)
        d.left.pipe_input(1, "a", 0)
        d.left.pipe_input(2, "b", 5)
        d.right.pipe_input(2, "x", 11)  # closes a's window: a+null, then b+x, which times out once
        assert d.results() == [(1, "a+null", 0), (1, "a+null", 0), (2, "b+x", 11)]
        d.left.pipe_input(3, "c", 16)
        assert d.results() == []
        d.left.pipe_input(4, "d", 30)
        assert d.results() == [(3, "c+null", 16)]


def test_a_side_whose_key_changed_is_repartitioned_before_the_join(run) -> None:
    """KStreamKStreamJoinTest.shouldReuseRepartitionTopicWithGeneratedName: a key-changing side goes
    through a repartition topic, the other side is read as it is."""
    def shape(left: Any, right: Any) -> tuple[Any, Any]:
        return left.select_key(lambda k, v: k + 1), right

    d = run("join", JoinWindows.of_time_difference_with_no_grace(10), shape=shape)
    topology = d.driver.topology
    assert topology.repartition_topics() == ["topology-test-driver-KSTREAM-REPARTITION-0000000003-repartition"]
    d.left.pipe_input(0, "A", 1)
    d.right.pipe_input(1, "b", 2)
    assert d.results() == [(1, "A+b", 2)]


def test_join_sides_with_different_partition_counts_are_refused() -> None:
    """Kafka Streams refuses to start when co-partitioned topics differ in partitions."""
    with pytest.raises(TopologyError, match="same number of partitions"):
        TopologyTestDriver(join_topology("join", JoinWindows.of_time_difference_with_no_grace(10)),
                           partitions={"left": 2, "right": 3})


def test_a_repartitioned_side_gets_the_partition_count_of_the_other_side() -> None:
    """As Kafka Streams sizes a join's repartition topic to the co-partitioned source topic."""
    topology = join_topology("join", JoinWindows.of_time_difference_with_no_grace(10),
                             shape=lambda left, right: (left.select_key(lambda k, v: k), right))
    with TopologyTestDriver(topology, partitions={"left": 2, "right": 3}) as driver:
        repartition = driver.topology.repartition_topics()[0]
        assert driver.topology.internal_topics({"left": 2, "right": 3})[repartition][0] == 3


@pytest.mark.parametrize(("kind", "stores"), [
    ("join", ["orders-other-join-store", "orders-this-join-store"]),
    ("left_join", ["orders-left-shared-join-store", "orders-outer-other-join-store", "orders-this-join-store"]),
    ("outer_join", ["orders-outer-other-join-store", "orders-outer-shared-join-store",
                    "orders-outer-this-join-store"]),
])
def test_store_names_follow_stream_joined(kind: str, stores: list[str]) -> None:
    """As Kafka Streams' KStreamImplJoin: a side that emits unmatched records of the other has an
    ``-outer-`` store, and a left join's shared store is ``-left-shared-join`` (the store names
    name the changelog topics, which operators create, grant and watch by name)."""
    builder = StreamsBuilder()
    left, right = builder.stream("left"), builder.stream("right")
    getattr(left, kind)(right, joiner, JoinWindows.of_time_difference_with_no_grace(10),
                        StreamJoined.with_(INT, STR, STR).with_store_name("orders"), name="j").to("out")
    topology = builder.build()
    assert sorted(topology.store_names) == stores
    if kind == "outer_join":
        assert "Processor: j-outer-this-join" in topology.describe()


def test_joining_two_streams_needs_join_windows_and_a_plain_joiner() -> None:
    builder = StreamsBuilder()
    left, right = builder.stream("left"), builder.stream("right")
    with pytest.raises(TopologyError, match="needs JoinWindows"):
        left.join(right, joiner)

    async def slow(a: Any, b: Any) -> Any:
        return a

    with pytest.raises(TopologyError, match="plain function"):
        left.join(right, slow, JoinWindows.of_time_difference_with_no_grace(1))


@pytest.mark.parametrize(("make", "message"), [
    (lambda: JoinWindows.of_time_difference_with_no_grace(-1), "must be >= 0"),
    (lambda: JoinWindows.of_time_difference_and_grace(5, -1), "grace"),
    (lambda: JoinWindows.of_time_difference_with_no_grace(5).before(-6), "must not be negative"),
])
def test_join_windows_refuse_negative_sizes(make: Callable[[], Any], message: str) -> None:
    """Kafka Streams' JoinWindowsTest: a negative time difference, grace or window size is refused."""
    with pytest.raises(TopologyError, match=message):
        make()


def test_a_commit_during_the_restore_loses_no_record_of_a_join_side() -> None:
    """A commit's cache flush expires every store of the task, also while it is still restoring
    (restore writes straight into the bytes store). The join store must not take its stream time and
    next sequence number from the records restored so far: a later record of the same key and
    timestamp would reuse a restored record's sequence number and overwrite it."""
    def join_store() -> JoinWindowStore:
        return JoinWindowStore("side", InMemoryBytesStore("side"), INT, STR, None, None, "side", lambda: 0,
                               lambda: None, window_size_ms=100, retention_ms=100)

    before = join_store()
    before.put(1, "a", 5)
    before.put(1, "b", 5)
    changelog = before.inner.range(None, None)
    restored = join_store()
    first, second = list(changelog)
    restored.inner.put(*first)  # the first restored batch
    restored.expire()           # a commit meanwhile
    restored.inner.put(*second)  # the rest of the changelog
    restored.put(1, "c", 5)
    assert list(restored.fetch_range(1, 0, 10)) == [(5, "a"), (5, "b"), (5, "c")]
