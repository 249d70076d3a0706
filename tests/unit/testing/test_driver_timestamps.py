"""Timestamp extractors through ``TopologyTestDriver``: the built-ins, ``default.timestamp.extractor``,
per-source extractors, and what invalid timestamps do (Kafka Streams' ``RecordQueue``: a negative
timestamp from the extractor drops the record; ``FailOnInvalidTimestamp`` raises)."""

from __future__ import annotations

from typing import Any

import pytest

from streamloop import PunctuationType, StreamsBuilder
from streamloop.clock import ManualClock
from streamloop.errors import ConfigError, DeserializationError, TopologyError
from streamloop.processors.api import BaseProcessor
from streamloop.records import Record
from streamloop.serdes import IntegerSerde, JsonSerde, StringSerde
from streamloop.testing import TopologyTestDriver
from streamloop.timestamps import (
    ConsumedRecord,
    InvalidTimestampError,
    LogAndSkipOnInvalidTimestamp,
    UsePartitionTimeOnInvalidTimestamp,
    WallclockTimestampExtractor,
)

STR, INT = StringSerde(), IntegerSerde()


class FromValue:
    """The event time is the value's ``t``."""

    def extract(self, record: ConsumedRecord, partition_time: int) -> int:
        return int(record.value["t"])


def passing(extractor: object = None) -> Any:
    builder = StreamsBuilder()
    builder.stream("in", key_serde=STR, value_serde=INT, timestamp_extractor=extractor).to(
        "out", key_serde=STR, value_serde=INT)
    return builder.build()


def timestamps_out(driver: TopologyTestDriver) -> list[tuple[int, int]]:
    return [(r.value, r.timestamp) for r in driver.create_output_topic("out", STR, INT).read_records()]


def test_the_default_fails_a_record_with_a_negative_timestamp_through_the_deserialization_handler() -> None:
    """Kafka Streams ``FailOnInvalidTimestampTest.failOnInvalidTimestamp``: the default extractor
    does not accept a negative timestamp."""
    with TopologyTestDriver(passing()) as driver:
        driver.create_output_topic("out", STR, INT)
        with pytest.raises(DeserializationError) as caught:
            driver.pipe_raw("in", b"k", INT.serialize(1), timestamp=-1)

    assert isinstance(caught.value.__cause__, InvalidTimestampError)
    assert caught.value.what == "timestamp"
    assert "LogAndSkipOnInvalidTimestamp" in str(caught.value)  # says what fixes it


def test_a_continuing_deserialization_handler_skips_a_record_with_a_negative_timestamp() -> None:
    config = {"default.deserialization.exception.handler": "streamloop.handlers.LogAndContinueExceptionHandler"}
    with TopologyTestDriver(passing(), config) as driver:
        driver.pipe_raw("in", b"k", INT.serialize(1), timestamp=-1)
        driver.create_input_topic("in", STR, INT).pipe_input("k", 2, timestamp=5)
        assert timestamps_out(driver) == [(2, 5)]
        assert driver.committed("in") == 2


def test_log_and_skip_drops_a_record_with_a_negative_timestamp_and_moves_past_it() -> None:
    """Kafka Streams ``LogAndSkipOnInvalidTimestampTest.logAndSkipOnInvalidTimestamp`` and
    ``RecordQueueTest.shouldDropOnNegativeTimestamp``."""
    with TopologyTestDriver(passing(LogAndSkipOnInvalidTimestamp)) as driver:
        driver.pipe_raw("in", b"k", INT.serialize(1), timestamp=-1)
        driver.create_input_topic("in", STR, INT).pipe_input("k", 2, timestamp=5)
        assert timestamps_out(driver) == [(2, 5)]
        assert driver.committed("in") == 2


def test_use_partition_time_replaces_a_negative_timestamp_by_the_partitions_time() -> None:
    """Kafka Streams ``UsePartitionTimeOnInvalidTimestampTest``: a negative timestamp becomes the
    partition time (the largest so far, not the last); with no partition time yet it fails."""
    config = {"default.timestamp.extractor": "streamloop.timestamps.UsePartitionTimeOnInvalidTimestamp"}
    with TopologyTestDriver(passing(), config) as driver:
        source = driver.create_input_topic("in", STR, INT)
        driver.create_output_topic("out", STR, INT)
        with pytest.raises(DeserializationError, match="no time yet"):
            driver.pipe_raw("in", b"k", INT.serialize(0), timestamp=-1)
    with TopologyTestDriver(passing(UsePartitionTimeOnInvalidTimestamp()), {}) as driver:
        source = driver.create_input_topic("in", STR, INT)
        source.pipe_input("k", 1, timestamp=50)
        source.pipe_input("k", 2, timestamp=20)
        driver.pipe_raw("in", b"k", INT.serialize(3), timestamp=-1)
        assert timestamps_out(driver) == [(1, 50), (2, 20), (3, 50)]


def test_the_wall_clock_extractor_stamps_records_with_the_clock() -> None:
    clock = ManualClock(7_000)
    with TopologyTestDriver(passing(WallclockTimestampExtractor(clock))) as driver:
        driver.create_input_topic("in", STR, INT).pipe_input("k", 1, timestamp=3)
        clock.advance(5)
        driver.pipe_raw("in", b"k", INT.serialize(2), timestamp=-1)  # its own timestamp is not read
        assert timestamps_out(driver) == [(1, 7_000), (2, 7_005)]


def test_default_timestamp_extractor_applies_where_the_source_names_none_and_a_source_overrides_it() -> None:
    builder = StreamsBuilder()
    builder.stream("by-value", key_serde=STR, value_serde=JsonSerde()).map_values(lambda v: v["n"]).to(
        "out", key_serde=STR, value_serde=INT)
    builder.stream("own", key_serde=STR, value_serde=INT, timestamp_extractor=LogAndSkipOnInvalidTimestamp).to(
        "out", key_serde=STR, value_serde=INT)
    config = {"default.timestamp.extractor": FromValue}
    with TopologyTestDriver(builder.build(), config) as driver:
        driver.create_input_topic("by-value", STR, JsonSerde()).pipe_input("k", {"n": 1, "t": 99}, timestamp=1)
        driver.create_input_topic("own", STR, INT).pipe_input("k", 2, timestamp=7)
        assert timestamps_out(driver) == [(1, 99), (2, 7)]


def test_an_extractor_that_raises_goes_to_the_deserialization_handler() -> None:
    class Broken:
        def extract(self, record: ConsumedRecord, partition_time: int) -> int:
            raise KeyError("t")

    with TopologyTestDriver(passing(Broken())) as driver:
        driver.create_output_topic("out", STR, INT)
        with pytest.raises(DeserializationError) as caught:
            driver.create_input_topic("in", STR, INT).pipe_input("k", 1, timestamp=3)
    assert isinstance(caught.value.__cause__, KeyError)


def test_a_record_a_processing_handler_drops_still_moves_stream_time() -> None:
    """Kafka Streams ``PartitionGroup.nextRecord`` moves stream time when it hands a record to the
    task, before processing (``StreamTaskTest.shouldPunctuateOnceStreamTimeAfterGap`` counts on
    it): a record that the processing handler then drops still fires a stream-time punctuation."""
    fired: list[int] = []

    class Punctuating(BaseProcessor):
        def init(self, context: Any) -> None:
            super().init(context)
            context.schedule(100, PunctuationType.STREAM_TIME, fired.append)

        def process(self, record: Record) -> None:
            if record.value < 0:
                raise ValueError("negative")

    builder = StreamsBuilder()
    builder.stream("in", key_serde=STR, value_serde=INT).process(Punctuating)
    config = {"processing.exception.handler": "streamloop.handlers.LogAndContinueProcessingExceptionHandler"}
    with TopologyTestDriver(builder.build(), config) as driver:
        source = driver.create_input_topic("in", STR, INT)
        source.pipe_input("k", 1, timestamp=0)
        source.pipe_input("k", -1, timestamp=100)  # dropped by the handler
        assert fired == [100]


def test_a_bad_extractor_is_a_config_error_or_a_topology_error_naming_where_it_was_given() -> None:
    with pytest.raises(ConfigError, match=r"default\.timestamp\.extractor"):
        TopologyTestDriver(passing(), {"default.timestamp.extractor": "nowhere.Extractor"})
    with pytest.raises(TopologyError, match="timestamp extractor of source"):
        passing(object())


def test_a_tables_source_extractor_stamps_its_updates() -> None:
    builder = StreamsBuilder()
    (builder.table("prices", key_serde=STR, value_serde=JsonSerde(), timestamp_extractor=FromValue())
            .to_stream()
            .map_values(lambda v: v["n"])
            .to("out", key_serde=STR, value_serde=INT))
    with TopologyTestDriver(builder.build(), {"cache.max.bytes.buffering": 0}) as driver:
        driver.create_input_topic("prices", STR, JsonSerde()).pipe_input("k", {"n": 4, "t": 1_234}, timestamp=9)
        assert timestamps_out(driver) == [(4, 1_234)]
