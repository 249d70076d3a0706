"""Which serdes a sink uses: the ones given to it, else the ones the stream knows, else the defaults.

As in Kafka Streams, a sink without serdes of its own writes with the stream's key and value
serdes where the operations since the source kept their types (``filter``, ``peek``, a ``merge``
of streams with the same serdes, the key through ``map_values``, the value through
``select_key``), and with ``default.key.serde``/``default.value.serde`` otherwise. A value the
chosen serde cannot write is an error naming the sink, its topic, key or value, the type, and
both fixes; where the type is known when the client starts, it is an error then.
"""

from __future__ import annotations

from typing import Any

import pytest

from streamloop import KafkaStreams, StreamsBuilder, TimeWindows, Topology
from streamloop.errors import MissingSerdeError, ProcessingError, SerializationError
from streamloop.handlers import LogAndContinueProcessingExceptionHandler
from streamloop.serdes import BytesSerde, IntegerSerde, JsonSerde, LongSerde, Serde, StringSerde
from streamloop.testing import TopologyTestDriver
from streamloop.topology.builder import KStream

STR, INT, JSON = StringSerde(), IntegerSerde(), JsonSerde()


def sink_serdes(topology: Topology, sink: str = "sink") -> tuple[Serde | None, Serde | None]:
    spec = topology.spec(sink)
    return spec.key_serde, spec.value_serde


def source(builder: StreamsBuilder, topic: str = "in") -> KStream:
    return builder.stream(topic, key_serde=STR, value_serde=JSON)


# -- the inheritance rules, on the built topology ---------------------------------------------


@pytest.mark.parametrize("keep", [
    lambda s: s,
    lambda s: s.filter(lambda k, v: True),
    lambda s: s.filter_not(lambda k, v: False),
    lambda s: s.peek(lambda k, v: None),
    lambda s: s.branch(lambda k, v: True)[0],
    lambda s: s.split().branch(lambda k, v: True).default_branch()["1"],
    lambda s: s.merge(s.filter(lambda k, v: True)),
], ids=["source", "filter", "filter_not", "peek", "branch", "split", "merge-same-serdes"])
def test_operations_that_keep_types_keep_both_serdes_up_to_the_sink(keep: Any) -> None:
    builder = StreamsBuilder()
    keep(source(builder)).to("out", name="sink")

    assert sink_serdes(builder.build()) == (STR, JSON)


@pytest.mark.parametrize("change, expected", [
    (lambda s: s.map_values(lambda v: v), (STR, None)),
    (lambda s: s.flat_map_values(lambda v: [v]), (STR, None)),
    (lambda s: s.select_key(lambda k, v: k), (None, JSON)),
    (lambda s: s.map(lambda k, v: (k, v)), (None, None)),
    (lambda s: s.flat_map(lambda k, v: [(k, v)]), (None, None)),
    (lambda s: s.process(lambda: None), (None, None)),
], ids=["map_values", "flat_map_values", "select_key", "map", "flat_map", "process"])
def test_operations_that_may_change_a_type_drop_that_serde_only(change: Any, expected: Any) -> None:
    builder = StreamsBuilder()
    change(source(builder)).to("out", name="sink")

    assert sink_serdes(builder.build()) == expected


def test_serdes_given_to_the_sink_win_over_the_streams() -> None:
    builder = StreamsBuilder()
    source(builder).to("out", key_serde=BytesSerde(), value_serde=StringSerde, name="sink")

    key, value = sink_serdes(builder.build())
    assert isinstance(key, BytesSerde) and isinstance(value, StringSerde)


def test_merge_keeps_equal_builtin_serdes_and_drops_different_ones() -> None:
    builder = StreamsBuilder()
    left = builder.stream("a", key_serde=StringSerde(), value_serde=JsonSerde())
    right = builder.stream("b", key_serde=StringSerde, value_serde=IntegerSerde())
    left.merge(right).to("out", name="sink")

    assert sink_serdes(builder.build()) == (STR, None)


def test_merge_with_a_stream_of_unknown_serdes_knows_none() -> None:
    builder = StreamsBuilder()
    source(builder).merge(builder.stream("b")).to("out", name="sink")

    assert sink_serdes(builder.build()) == (None, None)


def test_a_counts_stream_writes_the_grouping_key_serde_and_longs() -> None:
    builder = StreamsBuilder()
    source(builder).group_by_key().count().to_stream().to("out", name="sink")

    key, value = sink_serdes(builder.build())
    assert key == STR and isinstance(value, LongSerde)


def test_a_table_stream_keeps_the_tables_serdes() -> None:
    builder = StreamsBuilder()
    builder.table("t", key_serde=STR, value_serde=JSON).to_stream().filter(lambda k, v: True).to("out", name="sink")

    assert sink_serdes(builder.build()) == (STR, JSON)


def test_a_join_keeps_the_streams_key_serde_only() -> None:
    builder = StreamsBuilder()
    table = builder.table("t", key_serde=STR, value_serde=INT)
    source(builder).join(table, lambda v, t: v).to("out", name="sink")

    assert sink_serdes(builder.build()) == (STR, None)


def test_a_repartition_for_grouping_writes_and_reads_with_the_known_serdes() -> None:
    builder = StreamsBuilder()
    source(builder).select_key(lambda k, v: v["user"]).group_by_key(key_serde=STR).count()
    topology = builder.build()

    repartition_sink = next(n for n in topology.node_names() if topology.spec(n).kind.name == "SINK")
    repartition_source = next(n for n in topology.node_names()
                              if topology.spec(n).internal and topology.spec(n).kind.name == "SOURCE")
    assert sink_serdes(topology, repartition_sink) == (STR, JSON)
    assert sink_serdes(topology, repartition_source) == (STR, JSON)


def test_a_repartitioned_stream_before_a_join_keeps_its_value_serde() -> None:
    builder = StreamsBuilder()
    table = builder.table("t", key_serde=STR, value_serde=INT)
    joined = source(builder).select_key(lambda k, v: v["user"]).join(table, lambda v, t: v)
    joined.to("out", name="sink")
    topology = builder.build()

    repartition_sink = next(n for n in topology.node_names() if topology.spec(n).kind.name == "SINK"
                            and n != "sink")
    assert sink_serdes(topology, repartition_sink) == (None, JSON)


def test_a_spark_stage_output_keeps_no_serde() -> None:
    pytest.importorskip("pyspark")
    builder = StreamsBuilder()
    source(builder).spark_batch(lambda frame: frame).to("out", name="sink")

    assert sink_serdes(builder.build()) == (None, None)


# -- the records, through the test driver ------------------------------------------------------


def test_to_without_serdes_writes_with_the_serdes_the_stream_was_read_with() -> None:
    builder = StreamsBuilder()
    source(builder).filter(lambda k, v: v["n"] > 0).to("out")

    with TopologyTestDriver(builder.build()) as driver:
        driver.create_input_topic("in", STR, JSON).pipe_records([("a", {"n": 1}), ("b", {"n": 0}), ("c", {"n": 2})])
        assert driver.create_output_topic("out", STR, JSON).read_key_values() == [("a", {"n": 1}), ("c", {"n": 2})]


def test_map_values_output_is_written_with_the_key_serde_and_the_default_value_serde() -> None:
    builder = StreamsBuilder()
    source(builder).map_values(lambda v: v["n"] * 10).to("out")

    with TopologyTestDriver(builder.build(), {"default.value.serde": IntegerSerde}) as driver:
        driver.create_input_topic("in", STR, JSON).pipe_input("a", {"n": 4})
        assert driver.create_output_topic("out", STR, INT).read_key_value() == ("a", 40)


def test_a_count_is_written_without_any_serde_given_to_the_sink() -> None:
    builder = StreamsBuilder()
    source(builder).group_by_key().count().to_stream().to("counts")

    with TopologyTestDriver(builder.build(), {"cache.max.bytes.buffering": 0}) as driver:
        driver.create_input_topic("in", STR, JSON).pipe_records([("a", {}), ("b", {}), ("a", {})])
        assert driver.create_output_topic("counts", STR, LongSerde()).read_key_values() == [
            ("a", 1), ("b", 1), ("a", 2)]


def test_a_value_no_serde_can_write_fails_naming_the_sink_the_type_and_both_fixes() -> None:
    builder = StreamsBuilder()
    source(builder).map_values(lambda v: v["n"]).to("out", name="to-out")

    with TopologyTestDriver(builder.build()) as driver:
        with pytest.raises(ProcessingError) as failed:
            driver.create_input_topic("in", STR, JSON).pipe_input("a", {"n": 4})
        error = failed.value.__cause__
        assert isinstance(error, SerializationError)
        assert (error.sink, error.topic, error.what) == ("to-out", "out", "value")
        message = str(error)
        for part in ["'to-out'", "topic 'out'", "value", "int", "value_serde=", "default.value.serde"]:
            assert part in message, f"{part!r} not in {message!r}"
        assert "key_serde" not in message


def test_a_key_no_serde_can_write_names_the_key_serde_fixes() -> None:
    builder = StreamsBuilder()
    source(builder).select_key(lambda k, v: v["n"]).to("out", name="to-out")

    with TopologyTestDriver(builder.build()) as driver:
        with pytest.raises(ProcessingError) as failed:
            driver.create_input_topic("in", STR, JSON).pipe_input("a", {"n": 4})
        error = failed.value.__cause__
        assert isinstance(error, SerializationError)
        assert error.what == "key"
        message = str(error)
        for part in ["'to-out'", "topic 'out'", "key", "int", "key_serde=", "default.key.serde"]:
            assert part in message, f"{part!r} not in {message!r}"


def test_a_serde_given_to_the_sink_that_cannot_write_the_value_is_named_in_the_error() -> None:
    builder = StreamsBuilder()
    source(builder).to("out", value_serde=IntegerSerde(), name="to-out")

    with TopologyTestDriver(builder.build()) as driver:
        with pytest.raises(ProcessingError) as failed:
            driver.create_input_topic("in", STR, JSON).pipe_input("a", {"n": 4})
        error = failed.value.__cause__
        assert isinstance(error, SerializationError)
        assert "IntegerSerde(4)" in str(error) and "dict" in str(error)
        assert isinstance(error.__cause__, TypeError)


def test_the_processing_handler_decides_about_a_record_the_sink_cannot_write() -> None:
    builder = StreamsBuilder()
    source(builder).map_values(lambda v: v["n"] if v["n"] else b"zero").to("out")
    config = {"processing.exception.handler": LogAndContinueProcessingExceptionHandler}

    with TopologyTestDriver(builder.build(), config) as driver:
        driver.create_input_topic("in", STR, JSON).pipe_records([("a", {"n": 0}), ("b", {"n": 7}), ("c", {"n": 0})])
        assert driver.create_output_topic("out", STR, BytesSerde()).read_key_values() == [
            ("a", b"zero"), ("c", b"zero")]
        assert driver.committed("in") == 3


def test_a_repartition_for_grouping_without_a_key_serde_names_group_by_key_as_the_fix() -> None:
    builder = StreamsBuilder()
    source(builder).select_key(lambda k, v: v["n"]).group_by_key().count()

    with TopologyTestDriver(builder.build()) as driver:
        with pytest.raises(ProcessingError) as failed:
            driver.create_input_topic("in", STR, JSON).pipe_input("a", {"n": 4})
        error = failed.value.__cause__
        assert isinstance(error, SerializationError)
        assert error.what == "key" and error.topic.endswith("-repartition")
        assert "key_serde= to group_by_key()" in str(error) and "default.key.serde" in str(error)


def test_a_repartition_before_a_join_names_the_default_as_the_only_fix() -> None:
    builder = StreamsBuilder()
    table = builder.table("t", key_serde=INT, value_serde=INT)
    source(builder).select_key(lambda k, v: v["n"]).join(table, lambda v, t: t).to("out", value_serde=INT)

    with TopologyTestDriver(builder.build()) as driver:
        with pytest.raises(ProcessingError) as failed:
            driver.create_input_topic("in", STR, JSON).pipe_input("a", {"n": 4})
        error = failed.value.__cause__
        assert isinstance(error, SerializationError)
        assert error.what == "key"
        assert "Set the config default.key.serde" in str(error) and "key_serde=" not in str(error)

    with TopologyTestDriver(builder.build(), {"default.key.serde": IntegerSerde}) as driver:
        driver.create_input_topic("t", INT, INT).pipe_input(4, 40)
        driver.create_input_topic("in", STR, JSON).pipe_input("a", {"n": 4})
        assert driver.create_output_topic("out", INT, INT).read_key_value() == (4, 40)


def windowed_counts(**to: Any) -> Topology:
    builder = StreamsBuilder()
    (source(builder).group_by_key().windowed_by(TimeWindows.of_size_with_no_grace(1000)).count()
                    .to_stream().to("out", name="to-out", **to))
    return builder.build()


def test_windowed_keys_without_a_key_serde_fail_when_the_driver_starts() -> None:
    with pytest.raises(MissingSerdeError) as failed:
        TopologyTestDriver(windowed_counts())

    error = failed.value
    assert (error.sink, error.topic, error.what) == ("to-out", "out", "key")
    for part in ["'to-out'", "topic 'out'", "Windowed", "key_serde=", "default.key.serde"]:
        assert part in str(error), f"{part!r} not in {str(error)!r}"


class WindowedSerde:
    def serialize(self, value: Any) -> bytes | None:
        return None if value is None else f"{value.key}@{value.start}".encode()

    def deserialize(self, data: bytes | None) -> Any:
        return None if data is None else data.decode()


@pytest.mark.parametrize("how", ["sink", "default"])
def test_windowed_keys_are_written_with_the_sinks_or_the_default_key_serde(how: str) -> None:
    topology = windowed_counts(key_serde=WindowedSerde()) if how == "sink" else windowed_counts()
    config = {"cache.max.bytes.buffering": 0}
    if how == "default":
        config["default.key.serde"] = WindowedSerde()  # type: ignore[assignment]

    with TopologyTestDriver(topology, config) as driver:
        driver.create_input_topic("in", STR, JSON).pipe_input("a", {}, timestamp=1500)
        assert driver.create_output_topic("out", StringSerde(), LongSerde()).read_key_value() == ("a@1000", 1)


def test_a_spark_stages_dict_values_without_a_value_serde_fail_when_the_driver_starts() -> None:
    pytest.importorskip("pyspark")
    builder = StreamsBuilder()
    source(builder).spark_batch(lambda frame: frame).to("out", key_serde=STR, name="to-out")

    with pytest.raises(MissingSerdeError, match=r"'to-out'.*topic 'out'.*value.*dict") as failed:
        TopologyTestDriver(builder.build())
    assert failed.value.what == "value"


def test_windowed_keys_without_a_key_serde_fail_when_the_client_is_created() -> None:
    config = {"application.id": "windowed-app", "bootstrap.servers": "memory://sink-serdes-client"}

    with pytest.raises(MissingSerdeError, match=r"Sink 'to-out' \(topic 'out'\) writes keys that are Windowed"):
        KafkaStreams(windowed_counts(), config)
    client = KafkaStreams(windowed_counts(), {**config, "default.key.serde": WindowedSerde()})
    client.close(timeout=5)
