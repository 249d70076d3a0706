"""``KTable.transform_values``: a ``ValueTransformerWithKey`` over a table's updates, checked
against Kafka Streams' KTableTransformValuesTest for the same inputs."""

from __future__ import annotations

from typing import Any

import pytest

from streamloop.errors import ForwardingError, TopologyError
from streamloop.processors.api import ProcessorContext
from streamloop.records import Record
from streamloop.serdes import IntegerSerde, LongSerde, StringSerde
from streamloop.state import Materialized, Stores
from streamloop.testing import TopologyTestDriver
from streamloop.topology.builder import StreamsBuilder

STR, INT, LONG = StringSerde(), IntegerSerde(), LongSerde()
CONFIG = {"cache.max.bytes.buffering": 0, "default.key.serde": STR, "default.value.serde": STR}


class Exclamation:
    """KTableTransformValuesTest's ExclamationValueTransformer: checks its stores in init."""

    closed = 0

    def __init__(self, *stores: str) -> None:
        self.stores = stores

    def init(self, context: ProcessorContext) -> None:
        for store in self.stores:
            assert context.get_state_store(store) is not None

    def transform(self, key: Any, value: Any) -> str:
        return f"{key}->{value}!"

    def close(self) -> None:
        Exclamation.closed += 1


class Counting:
    """KTableTransformValuesTest's StatefulTransformer: the number of calls so far."""

    def __init__(self) -> None:
        self.counter = 0

    def init(self, context: ProcessorContext) -> None:
        pass

    def transform(self, key: Any, value: Any) -> int:
        self.counter += 1
        return self.counter

    def close(self) -> None:
        pass


class Length:
    """KTableTransformValuesTest's StatelessTransformer."""

    def init(self, context: ProcessorContext) -> None:
        pass

    def transform(self, key: Any, value: Any) -> int | None:
        return None if value is None else len(value)

    def close(self) -> None:
        pass


def store(builder: StreamsBuilder, name: str) -> None:
    builder.add_state_store(Stores.key_value_store_builder(Stores.in_memory_key_value_store(name), LONG, LONG))


def run(builder: StreamsBuilder, inputs: list[tuple[str, str | None, int]], output: str = "output",
        value_serde: Any = STR) -> tuple[list[tuple[Any, Any]], TopologyTestDriver]:
    driver = TopologyTestDriver(builder.build(), CONFIG)
    topic = driver.create_input_topic("input", STR, STR)
    for key, value, timestamp in inputs:
        topic.pipe_input(key, value, timestamp)
    return driver.create_output_topic(output, STR, value_serde).read_key_values(), driver


def test_transforms_values_with_key_and_its_stores() -> None:
    """Matches KTableTransformValuesTest.shouldTransformValuesWithKey: the transformer sees its
    stores, is called for a delete too (``D->None!``), and no store is made for the result."""
    builder = StreamsBuilder()
    store(builder, "store")
    store(builder, "other")
    builder.table("input", key_serde=STR, value_serde=STR) \
        .transform_values(lambda: Exclamation("store", "other"), stores=["store", "other"]) \
        .to_stream().to("output")
    out, driver = run(builder, [("A", "a", 5), ("B", "b", 10), ("D", None, 15)])
    with driver:
        assert out == [("A", "A->a!"), ("B", "B->b!"), ("D", "D->None!")]
        assert "KTABLE-TRANSFORMVALUES-STATE-STORE" not in builder.build().describe()


def test_transforms_values_into_a_materialized_store() -> None:
    """Matches KTableTransformValuesTest.shouldTransformValuesWithKeyAndMaterialize."""
    builder = StreamsBuilder()
    store(builder, "store")
    table = builder.table("input", key_serde=STR, value_serde=STR).transform_values(
        lambda: Exclamation("store", "queryable"), materialized=Materialized("queryable", value_serde=STR),
        stores=["store"])
    assert table.queryable_store_name == "queryable"
    table.to_stream().to("output")
    out, driver = run(builder, [("A", "a", 5), ("B", "b", 10), ("C", None, 15)])
    with driver:
        assert out == [("A", "A->a!"), ("B", "B->b!"), ("C", "C->None!")]
        kv = driver.get_key_value_store("queryable")
        assert (kv.get("A"), kv.get("B"), kv.get("C")) == ("A->a!", "B->b!", "C->None!")


def test_old_values_come_from_the_store_when_materialized_even_if_stateful() -> None:
    """Matches KTableTransformValuesTest.shouldCalculateCorrectOldValuesIfMaterializedEvenIfStateful:
    a downstream regrouping subtracts the stored old value, not a second call's."""
    builder = StreamsBuilder()
    builder.table("input", key_serde=STR, value_serde=STR) \
        .transform_values(Counting, materialized=Materialized("queryable", value_serde=INT)) \
        .group_by(lambda k, v: (k, v), key_serde=STR, value_serde=INT) \
        .reduce(lambda a, v: a + v, lambda a, v: a - v, materialized=Materialized("sum", value_serde=INT)) \
        .map_values(str).to_stream().to("output")
    out, driver = run(builder, [("A", "ignored", 5), ("A", "ignored1", 15), ("A", "ignored2", 10)])
    with driver:
        assert out == [("A", "1"), ("A", "2"), ("A", "3")]
        assert driver.get_key_value_store("queryable").get("A") == 3


def test_old_values_are_transformed_too_when_not_materialized() -> None:
    """Matches KTableTransformValuesTest.shouldCalculateCorrectOldValuesIfNotStatefulEvenIfNotMaterialized
    (and shouldSetSendOldValuesOnParentIfNotMaterialized: the parent is asked for old values)."""
    builder = StreamsBuilder()
    builder.table("input", key_serde=STR, value_serde=STR).transform_values(Length) \
        .group_by(lambda k, v: (k, v), key_serde=STR, value_serde=INT) \
        .reduce(lambda a, v: a + v, lambda a, v: a - v, materialized=Materialized("sum", value_serde=INT)) \
        .map_values(str).to_stream().to("output")
    out, driver = run(builder, [("A", "a", 5), ("A", "aa", 15), ("A", "aaa", 10)])
    with driver:
        assert out == [("A", "1"), ("A", "2"), ("A", "3")]


def test_a_join_reads_an_unmaterialized_table_through_its_own_transformer() -> None:
    """Matches KTableTransformValuesTest.shouldTransformOnGetIfNotMaterialized: the value getter
    transforms the parent's current value (and shouldGetStoreNamesFromParentIfNotMaterialized)."""
    builder = StreamsBuilder()
    table = builder.table("input", key_serde=STR, value_serde=STR).transform_values(Exclamation)
    builder.stream("lookups", key_serde=STR, value_serde=STR).join(table, lambda v, t: f"{v}:{t}").to("output")
    text = builder.build().describe()
    assert "KSTREAM-JOIN-0000000005 (stores: [KSTREAM-SOURCE-0000000000-STATE-STORE-0000000001])" in text
    with TopologyTestDriver(builder.build(), CONFIG) as driver:
        driver.create_input_topic("input", STR, STR).pipe_input("Key", "Value", 1)
        driver.create_input_topic("lookups", STR, STR).pipe_input("Key", "q", 2)
        assert driver.create_output_topic("output", STR, STR).read_key_values() == [("Key", "q:Key->Value!")]


def test_a_join_reads_a_materialized_table_from_its_store() -> None:
    """Matches KTableTransformValuesTest.shouldGetFromStateStoreIfMaterialized (and
    shouldGetQueryableStoreNameIfMaterialized)."""
    builder = StreamsBuilder()
    table = builder.table("input", key_serde=STR, value_serde=STR) \
        .transform_values(Exclamation, materialized="queryable")
    builder.stream("lookups", key_serde=STR, value_serde=STR).join(table, lambda v, t: f"{v}:{t}").to("output")
    assert "Processor: KSTREAM-JOIN-0000000005 (stores: [queryable])" in builder.build().describe()
    with TopologyTestDriver(builder.build(), CONFIG) as driver:
        driver.create_input_topic("input", STR, STR).pipe_input("Key", "Value", 1)
        driver.create_input_topic("lookups", STR, STR).pipe_input("Key", "q", 2)
        assert driver.create_output_topic("output", STR, STR).read_key_values() == [("Key", "q:Key->Value!")]


def test_the_transformer_is_closed_with_its_task() -> None:
    """Matches KTableTransformValuesTest.shouldCloseTransformerOnProcessorClose."""
    builder = StreamsBuilder()
    builder.table("input", key_serde=STR, value_serde=STR).transform_values(Exclamation).to_stream().to("output")
    before = Exclamation.closed
    with TopologyTestDriver(builder.build(), CONFIG):
        pass
    assert Exclamation.closed == before + 1


def test_the_transformer_cannot_forward() -> None:
    """Matches KTableTransformValuesTest.shouldInitializeTransformerWithForwardDisabledProcessorContext."""

    class Forwarding(Length):
        def init(self, context: ProcessorContext) -> None:
            self.context = context

        def transform(self, key: Any, value: Any) -> int | None:
            self.context.forward(Record(key, value, 0))
            return None

    builder = StreamsBuilder()
    builder.table("input", key_serde=STR, value_serde=STR).transform_values(Forwarding).to_stream().to("output")
    with TopologyTestDriver(builder.build(), CONFIG) as driver, \
            pytest.raises(ForwardingError, match="cannot forward records"):
        driver.create_input_topic("input", STR, STR).pipe_input("A", "a", 0)


def test_bad_transformers_are_refused() -> None:
    """Kafka Streams' supplier check (``#get() must return a new object each time it is called``), as
    KStreamImplTest.shouldNotAllowBadProcessSupplierOnProcessValues, for a transformer supplier."""
    builder = StreamsBuilder()
    table = builder.table("input", key_serde=STR, value_serde=STR)
    with pytest.raises(TypeError, match=r"transform_values\(\) needs a supplier"):
        table.transform_values(Exclamation("x"))  # type: ignore[arg-type]
    same = Exclamation()
    with pytest.raises(TopologyError, match="returned the same object twice"):
        table.transform_values(lambda: same)
    with pytest.raises(TopologyError, match=r"must make objects with a transform\(\) method"):
        table.transform_values(object)  # type: ignore[arg-type]
    with pytest.raises(TopologyError, match="state store 'missing', which is not added"):
        table.transform_values(Exclamation, stores=["missing"])

    class Waiting(Length):
        async def transform(self, key: Any, value: Any) -> Any:  # type: ignore[override]
            return value

    with pytest.raises(TopologyError, match="must be a plain method"):
        table.transform_values(Waiting)


def test_a_joins_transformer_is_closed_with_the_join() -> None:
    """Matches KTableTransformValuesTest.shouldCloseTransformerOnGetterClose: the transformer a
    join's view made is closed when the join's processor closes (and the table's own one too)."""
    builder = StreamsBuilder()
    table = builder.table("input", key_serde=STR, value_serde=STR).transform_values(Exclamation) \
        .filter(lambda _k, v: v is not None)  # a view over the transformer's view closes it too
    builder.stream("lookups", key_serde=STR, value_serde=STR).join(table, lambda v, t: f"{v}:{t}").to("output")
    before = Exclamation.closed
    with TopologyTestDriver(builder.build(), CONFIG) as driver:
        driver.create_input_topic("input", STR, STR).pipe_input("k", "v", 0)
        driver.create_input_topic("lookups", STR, STR).pipe_input("k", "q", 1)
        assert driver.create_output_topic("output", STR, STR).read_values() == ["q:k->v!"]
        assert Exclamation.closed == before
    assert Exclamation.closed == before + 2
