"""Stores in the topology: declared once, connected to the processors that use them."""

from __future__ import annotations

import pytest

from streamloop import StreamsBuilder, TopologyError
from streamloop.errors import StateStoreError
from streamloop.processors.api import BaseProcessor
from streamloop.serdes import StringSerde
from streamloop.state import Materialized, Stores, TimeWindows
from streamloop.state.cleaner import StateDirCleaner


class Counting(BaseProcessor):
    def __init__(self, store: str) -> None:
        self.store_name = store

    def init(self, context) -> None:
        super().init(context)
        self.store = context.get_state_store(self.store_name)

    def process(self, record) -> None:
        pass


class Quiet(BaseProcessor):
    def process(self, record) -> None:
        pass


def test_two_stores_with_one_name_are_an_error_at_build_time() -> None:
    builder = StreamsBuilder()
    builder.add_state_store(Stores.key_value_store_builder(Stores.in_memory_key_value_store("s")))
    with pytest.raises(TopologyError, match="State store 's' is already added"):
        builder.add_state_store(Stores.key_value_store_builder(Stores.persistent_key_value_store("s")))
    stream = builder.stream("in")
    stream.group_by_key().count(materialized="t")
    with pytest.raises(TopologyError, match="'t' is already added"):
        stream.group_by_key().count(materialized="t")


def test_a_processor_using_a_store_it_did_not_declare_is_an_error() -> None:
    from streamloop.ids import TaskId
    from streamloop.processors.context import TaskContext

    builder = StreamsBuilder()
    builder.add_state_store(Stores.key_value_store_builder(Stores.in_memory_key_value_store("s")))
    stream = builder.stream("in")
    stream.process(lambda: Quiet(), stores=["s"], name="declares")
    stream.process(lambda: Counting("s"), name="sneaky")
    topology = builder.build()
    context = TaskContext("app", TaskId(0, 0), lambda: 0)
    with pytest.raises(StateStoreError, match="processor 'sneaky' has no access to it"):
        topology.build_task_graph(0, context, None, StringSerde(), StringSerde())  # type: ignore[arg-type]


def test_unknown_or_unconnected_stores_are_errors() -> None:
    builder = StreamsBuilder()
    with pytest.raises(TopologyError, match="uses state store 'missing', which is not added"):
        builder.stream("in").process(lambda: Counting("missing"), stores=["missing"])
    lonely = StreamsBuilder()
    lonely.add_state_store(Stores.key_value_store_builder(Stores.in_memory_key_value_store("lonely")))
    lonely.stream("in").peek(lambda k, v: None)
    with pytest.raises(TopologyError, match=r"\['lonely'\] are not connected to any processor"):
        lonely.build()


def test_illegal_store_names_and_windows_are_refused() -> None:
    with pytest.raises(TopologyError, match="Store name 'a b' is not legal"):
        Materialized.as_("a b")
    with pytest.raises(TopologyError, match="Window size must be an int > 0"):
        TimeWindows.of_size_with_no_grace(0)
    with pytest.raises(TopologyError, match=r"advance must be an int in 1..10"):
        TimeWindows.of_size_with_no_grace(10).advance_by(11)
    with pytest.raises(TopologyError, match="must be a plain function"):
        async def agg(k, v, a):
            return a
        StreamsBuilder().stream("in").group_by_key().aggregate(lambda: 0, agg)


def test_hopping_windows_for_a_timestamp() -> None:
    assert TimeWindows.of_size_with_no_grace(10).windows_for(25) == [20]
    assert TimeWindows.of_size_with_no_grace(10).advance_by(5).windows_for(25) == [20, 25]
    assert TimeWindows.of_size_with_no_grace(10).advance_by(5).windows_for(3) == [0]


def test_describe_lists_stores_and_the_repartition_sub_topology() -> None:
    builder = StreamsBuilder()
    builder.stream("in").map(lambda k, v: (v, k)).group_by_key().count(materialized="by-value")
    topology = builder.build()
    topology.set_application_id("app")
    text = topology.describe()
    assert "(stores: [by-value])" in text
    assert "Sink: KSTREAM-SINK-0000000003 (topic: app-KSTREAM-REPARTITION-0000000002-repartition)" in text
    assert "Source: KSTREAM-SOURCE-0000000004 (topics: [app-KSTREAM-REPARTITION-0000000002-repartition])" in text
    internal = topology.internal_topics({"in": 6})
    assert internal == {
        "app-KSTREAM-REPARTITION-0000000002-repartition": (6, {"cleanup.policy": "delete"}),
        "app-by-value-changelog": (6, {"cleanup.policy": "compact"}),
    }
    with pytest.raises(TopologyError, match="already used by application 'app'"):
        topology.set_application_id("other")


def test_join_puts_stream_and_table_in_one_sub_topology() -> None:
    builder = StreamsBuilder()
    table = builder.table("users", materialized="users")
    builder.stream("clicks").join(table, lambda click, user: (click, user)).to("out")
    topology = builder.build()
    assert len(topology.subtopologies) == 1
    assert set(topology.subtopologies[0].source_topics) == {"users", "clicks"}


def test_cleaner_deletes_unowned_task_dirs_after_the_delay_and_only_while_threads_live(tmp_path) -> None:
    for task in ("0_0", "0_1", "1_0"):
        (tmp_path / task).mkdir()
    now = [0.0]
    owned: list[set[str] | None] = [{"0_0"}]
    cleaner = StateDirCleaner(str(tmp_path), 1_000, lambda: owned[0], clock=lambda: now[0])
    assert cleaner.clean_once() == []
    now[0] = 0.5
    assert cleaner.clean_once() == []
    owned[0] = None  # no thread alive: nothing is deleted, and the clock starts over
    now[0] = 5.0
    assert cleaner.clean_once() == []
    owned[0] = {"0_0", "1_0"}
    assert cleaner.clean_once() == []
    now[0] = 6.0
    assert cleaner.clean_once() == ["0_1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0_0", "1_0"]


def test_hopping_windows_whose_size_is_not_a_multiple_of_the_advance() -> None:
    windows = TimeWindows.of_size_with_no_grace(10).advance_by(3)
    assert windows.windows_for(11) == [3, 6, 9]  # [3,13) [6,16) [9,19); [0,10) ended before 11
    assert windows.windows_for(12) == [3, 6, 9, 12]


def test_a_join_after_a_key_change_repartitions_the_stream() -> None:
    builder = StreamsBuilder()
    users = builder.table("users", materialized="users")
    builder.stream("clicks").select_key(lambda _k, v: v).join(users, lambda c, u: (c, u)).to("out")
    topology = builder.build()
    topology.set_application_id("app")
    assert len(topology.repartition_topics()) == 1
    joined = topology.subtopology_of_store("users")
    assert set(joined.source_topics) == {"users", topology.repartition_topics()[0]}


def test_aggregations_ignore_records_without_a_value_and_reduce_keeps_the_grouped_serde() -> None:
    from streamloop.serdes import LongSerde
    from streamloop.testing import TopologyTestDriver

    builder = StreamsBuilder()
    grouped = builder.stream("in", key_serde=StringSerde(), value_serde=StringSerde()).group_by_key()
    grouped.count(materialized="counts").to_stream().to("counts", key_serde=StringSerde(), value_serde=LongSerde())
    grouped.reduce(lambda a, b: a + b, materialized="joined").to_stream().to("joined", key_serde=StringSerde(),
                                                                              value_serde=StringSerde())
    with TopologyTestDriver(builder.build()) as driver:
        source = driver.create_input_topic("in", StringSerde(), StringSerde())
        counts = driver.create_output_topic("counts", StringSerde(), LongSerde())
        joined = driver.create_output_topic("joined", StringSerde(), StringSerde())
        for value in ["a", None, "b", None]:
            source.pipe_input("k", value)
        assert counts.read_key_values() == [("k", 1), ("k", 2)]
        assert joined.read_key_values() == [("k", "a"), ("k", "ab")]
