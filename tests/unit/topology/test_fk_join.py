"""Foreign-key table joins (KIP-213) through the ``TopologyTestDriver``, step by step against the
outputs of Kafka Streams' KTableKTableForeignKeyJoinIntegrationTest (a TopologyTestDriver test,
parameterised by inner/left join and a rejoin of the result with the left table).

As there, left values are ``"<value>|<foreign key>"`` and the joiner writes ``(left,right)``;
caching is off so that every update (also the "unnecessary" tombstones the test asserts) is
forwarded. The output is read as a map of the last value per key, as ``readKeyValuesToMap``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from streamloop.errors import TopologyError
from streamloop.processors.fk_join import Instruction, Response, Subscription, prefix_end, subscription_key
from streamloop.serdes import IntegerSerde, JsonSerde, StringSerde
from streamloop.state import Materialized
from streamloop.testing import TopologyTestDriver
from streamloop.topology.builder import StreamsBuilder

STR, JSON, INT = StringSerde(), JsonSerde(), IntegerSerde()
CONFIG = {"cache.max.bytes.buffering": 0, "default.key.serde": STR, "default.value.serde": STR}


def extractor(value: str) -> str:
    return value.split("|")[1]


def joiner(left: str | None, right: str | None) -> str:
    return f"({left},{right})"


class Case:
    """The test's topology: ``left.join/left_join(right, extractor, joiner, store)`` to "output",
    and, with ``rejoin``, the result joined again (by key) with the left table to "rejoin"."""

    def __init__(self, driver: TopologyTestDriver, rejoin: bool) -> None:
        self.driver = driver
        self.left = driver.create_input_topic("left", STR, STR)
        self.right = driver.create_input_topic("right", STR, STR)
        self.output = driver.create_output_topic("output", STR, STR)
        self.rejoin = driver.create_output_topic("rejoin", STR, STR) if rejoin else None
        self.time = 0

    def pipe(self, side: str, key: str, value: str | None) -> None:
        self.time += 1
        (self.left if side == "left" else self.right).pipe_input(key, value, self.time)

    def out(self) -> dict[str, Any]:
        return dict(self.output.read_key_values())

    def rejoined(self) -> dict[str, Any]:
        assert self.rejoin is not None
        return dict(self.rejoin.read_key_values())

    def store(self) -> dict[str, Any]:
        return dict(self.driver.get_key_value_store("store").all())


@pytest.fixture(params=[(False, False), (True, False), (False, True), (True, True)],
                ids=["inner", "left", "inner-rejoin", "left-rejoin"])
def case(request: pytest.FixtureRequest) -> Iterator[tuple[Case, bool]]:
    left_join, rejoin = request.param
    builder = StreamsBuilder()
    left = builder.table("left", key_serde=STR, value_serde=STR)
    right = builder.table("right", key_serde=STR, value_serde=STR)
    method = left.left_join if left_join else left.join
    joined = method(right, extractor, joiner, materialized="store")
    joined.to_stream().to("output")
    if rejoin:
        (joined.left_join if left_join else joined.join)(left, lambda a, b: f"rejoin({a},{b})") \
            .to_stream().to("rejoin")
    with TopologyTestDriver(builder.build(), CONFIG) as driver:
        yield Case(driver, rejoin), left_join


def test_join_from_left_then_delete_left_entity(case: tuple[Case, bool]) -> None:
    """doJoinFromLeftThenDeleteLeftEntity."""
    c, _left_join = case
    for key in ("rhs1", "rhs2", "rhs3"):
        c.pipe("right", key, f"rhsValue{key[-1]}")
    assert c.out() == {} and c.store() == {}
    c.pipe("left", "lhs1", "lhsValue1|rhs1")
    c.pipe("left", "lhs2", "lhsValue2|rhs2")
    expected = {"lhs1": "(lhsValue1|rhs1,rhsValue1)", "lhs2": "(lhsValue2|rhs2,rhsValue2)"}
    assert c.out() == expected and c.store() == expected
    if c.rejoin is not None:
        assert c.rejoined() == {"lhs1": "rejoin((lhsValue1|rhs1,rhsValue1),lhsValue1|rhs1)",
                                "lhs2": "rejoin((lhsValue2|rhs2,rhsValue2),lhsValue2|rhs2)"}
    c.pipe("left", "lhs3", "lhsValue3|rhs1")  # another reference to an existing foreign key
    assert c.out() == {"lhs3": "(lhsValue3|rhs1,rhsValue1)"}
    assert c.store() == {**expected, "lhs3": "(lhsValue3|rhs1,rhsValue1)"}
    c.pipe("left", "lhs1", None)
    assert c.out() == {"lhs1": None}
    if c.rejoin is not None:
        c.rejoined()  # lhs3's rejoin
        c.pipe("left", "lhs2", None)
        assert c.rejoined() == {"lhs2": None}
    else:
        assert c.store() == {"lhs2": "(lhsValue2|rhs2,rhsValue2)", "lhs3": "(lhsValue3|rhs1,rhsValue1)"}


def test_join_from_right_then_delete_right_entity(case: tuple[Case, bool]) -> None:
    """doJoinFromRightThenDeleteRightEntity."""
    c, left_join = case
    c.pipe("left", "lhs1", "lhsValue1|rhs1")
    c.pipe("left", "lhs2", "lhsValue2|rhs2")
    c.pipe("left", "lhs3", "lhsValue3|rhs1")
    halves = {"lhs1": "(lhsValue1|rhs1,null)", "lhs2": "(lhsValue2|rhs2,null)", "lhs3": "(lhsValue3|rhs1,null)"}
    halves = {k: v.replace("null", "None") for k, v in halves.items()}
    assert c.out() == (halves if left_join else {})
    assert c.store() == (halves if left_join else {})
    c.pipe("right", "rhs1", "rhsValue1")
    both = {"lhs1": "(lhsValue1|rhs1,rhsValue1)", "lhs3": "(lhsValue3|rhs1,rhsValue1)"}
    assert c.out() == both
    assert c.store() == ({**halves, **both} if left_join else both)
    c.pipe("right", "rhs2", "rhsValue2")
    assert c.out() == {"lhs2": "(lhsValue2|rhs2,rhsValue2)"}
    full = {**both, "lhs2": "(lhsValue2|rhs2,rhsValue2)"}
    assert c.store() == full
    c.pipe("right", "rhs3", "rhsValue3")  # an unreferenced foreign key shows up nowhere
    assert c.out() == {} and c.store() == full
    c.pipe("right", "rhs1", None)
    assert c.out() == {"lhs1": halves["lhs1"] if left_join else None,
                       "lhs3": halves["lhs3"] if left_join else None}
    assert c.store() == ({**halves, "lhs2": full["lhs2"]} if left_join else {"lhs2": full["lhs2"]})


def test_deleting_a_non_joining_row_emits_a_tombstone(case: tuple[Case, bool]) -> None:
    """shouldEmitTombstoneWhenDeletingNonJoiningRecords: an inner join cannot know whether the row
    joined before, so it sends a tombstone; deleting it again sends nothing."""
    c, left_join = case
    c.pipe("left", "lhs1", "lhsValue1|rhs1")
    expected = {"lhs1": "(lhsValue1|rhs1,None)"} if left_join else {}
    assert c.out() == expected and c.store() == expected
    c.pipe("left", "lhs1", None)
    assert c.out() == {"lhs1": None} and c.store() == {}
    c.pipe("left", "lhs1", None)
    assert c.out() == {} and c.store() == {}


def test_deleting_a_row_that_never_existed_emits_nothing(case: tuple[Case, bool]) -> None:
    """shouldNotEmitTombstonesWhenDeletingNonExistingRecords."""
    c, _left_join = case
    c.pipe("left", "lhs1", None)
    assert c.out() == {} and c.store() == {}


def test_a_foreign_key_without_a_right_row(case: tuple[Case, bool]) -> None:
    """joinShouldProduceNullsWhenValueHasNonMatchingForeignKey: moving between foreign keys without
    right rows sends an (unnecessary) tombstone in an inner join and the half-joined row in a left
    join; a right row for a key no longer referenced changes nothing."""
    c, left_join = case

    def half(fk: str) -> dict[str, Any]:
        return {"lhs1": f"(lhsValue1|{fk},None)"} if left_join else {}
    c.pipe("left", "lhs1", "lhsValue1|rhs1")
    assert c.out() == half("rhs1") and c.store() == half("rhs1")
    for fk in ("rhs2", "rhs3"):
        c.pipe("left", "lhs1", f"lhsValue1|{fk}")
        assert c.out() == {"lhs1": half(fk)["lhs1"] if left_join else None}
        assert c.store() == half(fk)
    c.pipe("right", "rhs1", "rhsValue1")
    assert c.out() == {} and c.store() == half("rhs3")
    c.pipe("left", "lhs1", "lhsValue1|rhs1")
    assert c.out() == {"lhs1": "(lhsValue1|rhs1,rhsValue1)"} == c.store()
    c.pipe("left", "lhs1", "lhsValue1|rhs2")
    assert c.out() == {"lhs1": half("rhs2")["lhs1"] if left_join else None}
    assert c.store() == half("rhs2")


def test_an_old_foreign_key_is_unsubscribed(case: tuple[Case, bool]) -> None:
    """shouldUnsubscribeOldForeignKeyIfLeftSideIsUpdated: after the left row moves to another
    foreign key, updates of the old one's right row reach it no more."""
    c, _left_join = case
    c.pipe("right", "rhs1", "rhsValue1")
    c.pipe("right", "rhs2", "rhsValue2")
    assert c.out() == {} and c.store() == {}
    c.pipe("left", "lhs1", "lhsValue1|rhs1")
    assert c.out() == {"lhs1": "(lhsValue1|rhs1,rhsValue1)"} == c.store()
    c.pipe("left", "lhs1", "lhsValue1|rhs2")
    assert c.out() == {"lhs1": "(lhsValue1|rhs2,rhsValue2)"} == c.store()
    c.pipe("right", "rhs1", "rhsValue1Delta")
    assert c.out() == {} and c.store() == {"lhs1": "(lhsValue1|rhs2,rhsValue2)"}


def test_left_tables_of_other_partition_counts_join_through_the_internal_topics() -> None:
    """The tables need not be co-partitioned: the subscription topic gets the right topic's
    partitions, the response topic the left's (KS' FK join co-partitions each internal topic with
    one side only)."""
    builder = StreamsBuilder()
    left = builder.table("left", key_serde=STR, value_serde=STR)
    right = builder.table("right", key_serde=STR, value_serde=STR)
    left.join(right, extractor, joiner, materialized="store").to_stream().to("output")
    with TopologyTestDriver(builder.build(), CONFIG, partitions={"left": 3, "right": 2}) as driver:
        internal = {t: n for t, (n, _c) in driver._internal_topics.items() if t.endswith("-topic")}
        assert sorted(internal.values()) == [2, 3]
        subscription = next(t for t in internal if "REGISTRATION" in t)
        assert internal[subscription] == 2
        lefts, rights = driver.create_input_topic("left", STR, STR), driver.create_input_topic("right", STR, STR)
        for i in range(12):
            rights.pipe_input(f"r{i % 4}", f"R{i % 4}v{i}")
            lefts.pipe_input(f"l{i}", f"L{i}|r{(i * 7) % 5}")
        rights.pipe_input("r0", None)
        want = {f"l{i}": f"(L{i}|r{(i * 7) % 5},R{(i * 7) % 5}v{8 + (i * 7) % 5})"
                for i in range(12) if (i * 7) % 5 in (1, 2, 3)}
        assert dict(driver.get_key_value_store("store").all()) == want


def test_subscriptions_and_results_survive_a_crash() -> None:
    """The subscription and result stores outlive a crash and a rebalance: a right update still
    reaches the left rows subscribed before them (restoring from the changelog into a new state
    directory is tests/integration/test_fk_joins.py's)."""
    builder = StreamsBuilder()
    left = builder.table("left", key_serde=STR, value_serde=STR)
    right = builder.table("right", key_serde=STR, value_serde=STR)
    left.left_join(right, extractor, joiner, materialized="store").to_stream().to("output")
    with TopologyTestDriver(builder.build(), CONFIG) as driver:
        c = Case(driver, False)
        c.pipe("left", "lhs1", "a|rhs1")
        c.pipe("left", "lhs2", "b|rhs1")
        c.pipe("right", "rhs1", "R1")
        driver.crash()
        c.pipe("right", "rhs1", "R2")
        assert c.store() == {"lhs1": "(a|rhs1,R2)", "lhs2": "(b|rhs1,R2)"}
        c.pipe("left", "lhs1", "a|rhs9")
        for task in driver.task_ids:  # new processors on every task, the stores restored
            driver.rebalance(task)
        c.pipe("right", "rhs1", "R3")
        assert c.store() == {"lhs1": "(a|rhs9,None)", "lhs2": "(b|rhs1,R3)"}


def test_a_stale_response_is_dropped() -> None:
    """A response whose hash is not the current left value's is dropped (the left row changed since
    it subscribed; SubscriptionResolverJoinProcessorSupplier): here piped by hand onto the response
    topic after the row changed."""
    builder = StreamsBuilder()
    left = builder.table("left", key_serde=STR, value_serde=STR)
    right = builder.table("right", key_serde=STR, value_serde=STR)
    left.join(right, extractor, joiner, materialized="store").to_stream().to("output")
    topology = builder.build()
    with TopologyTestDriver(topology, CONFIG) as driver:
        c = Case(driver, False)
        c.pipe("right", "rhs1", "R1")
        c.pipe("left", "lhs1", "old|rhs1")
        assert c.out() == {"lhs1": "(old|rhs1,R1)"}
        subscription = driver._log(next(t for t in topology.repartition_topics() if "REGISTRATION" in t))
        first = subscription.partitions[0][0]
        old_hash = Subscription.from_bytes(first.value).hash
        c.pipe("left", "lhs1", "new|rhs1")
        assert c.out() == {"lhs1": "(new|rhs1,R1)"}
        response = next(t for t in topology.repartition_topics() if "RESPONSE" in t)
        driver.pipe_raw(response, b"lhs1", Response(old_hash, 0, b"STALE").to_bytes())
        assert c.out() == {} and c.store() == {"lhs1": "(new|rhs1,R1)"}


def test_wire_formats_round_trip_and_prefixes_bound_their_keys() -> None:
    sub = Subscription(Instruction.PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE, b"h" * 16, 7, b"key")
    assert Subscription.from_bytes(sub.to_bytes()) == sub
    assert Subscription.from_stored(sub.stored(), b"key") == sub
    gone = Subscription(Instruction.DELETE_KEY_AND_PROPAGATE, None, 0, b"")
    assert Subscription.from_bytes(gone.to_bytes()) == gone
    for response in (Response(None, 2, None), Response(b"x" * 16, 0, b""), Response(None, 1, b"v")):
        assert Response.from_bytes(response.to_bytes()) == response
        assert Response.partitioner("t", b"k", response.to_bytes(), 3) == response.partition
    assert Response.partitioner("t", b"k", Response(None, 5, None).to_bytes(), 3) is None
    prefix = subscription_key(b"fk", b"")
    end = prefix_end(prefix)
    assert end is not None and prefix < subscription_key(b"fk", b"\xff" * 9) < end
    assert subscription_key(b"fl", b"") > end or not subscription_key(b"fl", b"").startswith(prefix)
    assert prefix_end(b"\xff\xff") is None and prefix_end(b"a\xff") == b"b"
    with pytest.raises(ValueError, match="version 9"):
        Response.from_bytes(b"\x09\x00")


def test_join_arguments() -> None:
    builder = StreamsBuilder()
    left, right = builder.table("left"), builder.table("right")
    with pytest.raises(TypeError, match="foreign_key_extractor"):
        left.join(right, extractor, joiner, joiner)  # type: ignore[call-overload]
    with pytest.raises(TopologyError, match="plain function"):
        async def fk(value: Any) -> Any:
            return value
        left.left_join(right, fk, joiner)
    by_keyword = left.join(right, foreign_key_extractor=extractor, joiner=joiner)
    assert by_keyword.queryable_store_name is None  # not materialized: its store is internal
    left.left_join(right, extractor, joiner, name="orders")
    topology = builder.build()
    assert {"orders-subscription-registration-topic", "orders-subscription-response-topic"} \
        <= set(topology.repartition_topics())
    assert "orders-subscription-store" in topology.store_names


def test_a_table_joined_with_itself_by_foreign_key() -> None:
    """Employees with their managers' names: one table on both sides (its one sub-topology reads
    both internal topics); a manager's rename reaches the reports, a report's move reaches no one
    else."""
    builder = StreamsBuilder()
    staff = builder.table("staff", key_serde=STR, value_serde=JSON)
    staff.left_join(staff, lambda v: v["boss"], lambda v, boss: [v["name"], None if boss is None else boss["name"]],
                    materialized=Materialized("with-boss", value_serde=JSON))
    with TopologyTestDriver(builder.build(), CONFIG, partitions={"staff": 2}) as driver:
        staff_input = driver.create_input_topic("staff", STR, JSON)
        staff_input.pipe_input("a", {"name": "A", "boss": None})
        staff_input.pipe_input("b", {"name": "B", "boss": "a"})
        staff_input.pipe_input("c", {"name": "C", "boss": "b"})
        staff_input.pipe_input("a", {"name": "A2", "boss": None})
        staff_input.pipe_input("c", {"name": "C", "boss": "a"})
        staff_input.pipe_input("b", {"name": "B2", "boss": "a"})
        assert dict(driver.get_key_value_store("with-boss").all()) == {
            "a": ["A2", None], "b": ["B2", "A2"], "c": ["C", "A2"]}


def test_answers_reach_the_left_task_whatever_partitioned_the_left_topic() -> None:
    """The left topic written by a custom partitioner (here: each key put on a partition of its own
    choosing, not where its bytes hash to): answers go to the partition of the task that
    subscribed (carried in the subscription, as KS' primaryPartition), not to where the left
    key's bytes hash."""
    builder = StreamsBuilder()
    left = builder.table("left", key_serde=STR, value_serde=STR)
    right = builder.table("right", key_serde=STR, value_serde=STR)
    left.join(right, extractor, joiner, materialized="store")
    with TopologyTestDriver(builder.build(), CONFIG, partitions={"left": 3, "right": 2}) as driver:
        lefts, rights = driver.create_input_topic("left", STR, STR), driver.create_input_topic("right", STR, STR)
        rights.pipe_input("r", "R")
        for i in range(6):
            lefts.pipe_input(f"l{i}", f"v{i}|r", partition=i % 3)
        rights.pipe_input("r", "R2")
        assert dict(driver.get_key_value_store("store").all()) == {f"l{i}": f"(v{i}|r,R2)" for i in range(6)}


@pytest.mark.parametrize("variant", ["default", "consumed", "join-result", "equi-join-result", "produced"])
def test_the_default_serdes_fill_in_for_serdes_not_given(variant: str) -> None:
    """KTableKTableForeignKeyJoinScenarioTest.shouldWorkWithDefaultSerdes and its variants: with
    ``default.key.serde`` Integer and ``default.value.serde`` String, the serdes not given (foreign
    key, left value hash, right value, result) are the defaults; the FK join's result joined again
    by key with the left table."""
    builder = StreamsBuilder()
    a = builder.table("A", **({"key_serde": INT, "value_serde": STR} if variant == "consumed" else {}))
    b = builder.table("B")
    fk_materialized = Materialized("asdf", key_serde=INT, value_serde=STR) if variant == "join-result" else "asdf"
    fk_result = a.join(b, lambda v: int(v.split("-")[0]), lambda x, y: f"({x},{y})", materialized=fk_materialized)
    final = a.join(fk_result, lambda x, y: f"({x},{y})",
                   materialized=Materialized("final", key_serde=INT, value_serde=STR)
                   if variant == "equi-join-result" else None)
    final.to_stream().to("output", **({"key_serde": INT, "value_serde": STR} if variant == "produced" else {}))
    config = {"default.key.serde": INT, "default.value.serde": STR}
    with TopologyTestDriver(builder.build(), config) as driver:
        driver.create_input_topic("A", INT, STR).pipe_input(1, "999-alpha")
        driver.create_input_topic("B", INT, STR).pipe_input(999, "beta")
        assert dict(driver.create_output_topic("output", INT, STR).read_key_values()) == {
            1: "(999-alpha,(999-alpha,beta))"}
