"""The worker-side pieces of the bulk path, without Spark: decoding a batch of fetched bytes, the
record a batch's rows leave with, and serializing the output for a sink right after the stage."""

from __future__ import annotations

from typing import Any

from streamloop.processors.nodes import ProcessorNode, SinkNode
from streamloop.records import FetchedRecord, Record
from streamloop.serdes import IntegerSerde, JsonSerde, StringSerde
from streamloop.spark.frames import decode
from streamloop.spark.stage import carrier_of, direct_sink, serialize_for

JSON, STR, INT = JsonSerde(), StringSerde(), IntegerSerde()


def fetched(offset: int, key: bytes | None, value: bytes | None) -> FetchedRecord:
    return FetchedRecord("in", 0, offset, 1_000 + offset, key, value)


def test_a_batch_decodes_with_the_source_serdes_and_keeps_the_failures_by_index() -> None:
    raws = [fetched(0, b"a", b'{"x": 1}'), fetched(1, b"b", b"{nope"), fetched(2, b"c", b'{"x": 3}')]

    decoded = decode(raws, STR, JSON)

    assert decoded.records == [Record("a", {"x": 1}, 1_000), Record("c", {"x": 3}, 1_002)]
    assert decoded.positions == [0, 2]
    assert list(decoded.failed) == [1]
    assert decoded.failed[1][0] == "value"
    assert isinstance(decoded.failed[1][1], ValueError)


def test_a_key_that_does_not_decode_says_so() -> None:
    decoded = decode([fetched(0, b"\xff\xfe", b"{}")], STR, JSON)

    assert decoded.records == [] and decoded.failed[0][0] == "key"


def test_rows_leave_with_the_last_record_or_the_last_before_the_first_left_out() -> None:
    assert carrier_of(5, {}) == 4
    assert carrier_of(5, {2: None, 4: None}) == 1  # a PAUSE at 2 must not drop the rows of 0..1
    assert carrier_of(5, {0: None, 3: None}) == 4  # the very first left out: the last that fits
    assert carrier_of(2, {0: None, 1: None}) == -1  # nothing fits: no rows


def _stage_with(*children: Any) -> ProcessorNode:
    node = ProcessorNode("stage", processor=None)  # type: ignore[arg-type]
    node.children.extend(children)
    return node


def test_output_is_serialized_on_the_worker_only_for_a_lone_sink_with_builtin_serdes() -> None:
    sink = SinkNode("sink", "out", STR, JSON, None)

    assert direct_sink(_stage_with(sink)) is sink
    assert direct_sink(_stage_with(sink, SinkNode("other", "out2", STR, JSON, None))) is None
    assert direct_sink(_stage_with(SinkNode("routed", lambda k, v, r: "out", STR, JSON, None))) is None
    assert direct_sink(_stage_with(SinkNode("parted", "out", STR, JSON, lambda t, k, v, n: 0))) is None

    class Own:  # a user's serde may not be safe on another thread
        def serialize(self, value: Any) -> bytes:
            return b""

        def deserialize(self, data: bytes) -> Any:
            return data

    assert direct_sink(_stage_with(SinkNode("own", "out", Own(), JSON, None))) is None  # type: ignore[arg-type]


def test_serialized_output_is_the_sinks_bytes_or_none_when_one_record_does_not_serialize() -> None:
    sink = SinkNode("sink", "out", INT, JSON, None)
    records = [Record(1, {"a": 1}, 5), Record(None, {"b": [1, 2]}, 5)]

    assert serialize_for(sink, records) == [(INT.serialize(1), JSON.serialize({"a": 1})),
                                            (None, JSON.serialize({"b": [1, 2]}))]
    assert serialize_for(sink, [*records, Record("not an int", {}, 5)]) is None
