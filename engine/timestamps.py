"""Timestamp extractors: the event time of each consumed record, as Kafka Streams'
``TimestampExtractor`` (``default.timestamp.extractor``, or per source with
``builder.stream(topic, timestamp_extractor=...)``).

An extractor gets the record with its key and value deserialized and the partition's time
(the largest timestamp of the partition's records so far; -1 before the first) and returns
the record's timestamp. A negative timestamp drops the record (logged, counted as dropped),
as Kafka Streams' ``RecordQueue`` does; an exception goes to the deserialization exception
handler as a ``DeserializationError`` of the record's ``timestamp`` (the default handler fails).

The built-ins differ in what they do with a record whose own timestamp is negative:

- ``FailOnInvalidTimestamp`` (the default): raise ``InvalidTimestampError``.
- ``LogAndSkipOnInvalidTimestamp``: log it and drop the record.
- ``UsePartitionTimeOnInvalidTimestamp``: use the partition's time (an error before the first).
- ``WallclockTimestampExtractor``: ignore the record's timestamp, use the wall clock.

Foundation level: imports nothing of tasks or threads.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from streamloop.clock import Clock, SystemClock
from streamloop.config import DEFAULT_TIMESTAMP_EXTRACTOR, StreamsConfig
from streamloop.errors import ConfigError
from streamloop.records import Headers

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ConsumedRecord:
    """A fetched record with its key and value deserialized: what an extractor reads
    (Kafka Streams hands its extractor a ``ConsumerRecord<Object, Object>``)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: Any
    value: Any
    headers: Headers = ()


@runtime_checkable
class TimestampExtractor(Protocol):
    def extract(self, record: ConsumedRecord, partition_time: int) -> int:
        """The record's timestamp in ms; negative drops the record."""


class InvalidTimestampError(ValueError):
    """A record's timestamp is negative and its extractor does not accept that."""

    def __init__(self, record: ConsumedRecord, reason: str) -> None:
        super().__init__(
            f"Record at {record.topic}-{record.partition} offset {record.offset} has invalid (negative) "
            f"timestamp {record.timestamp}: {reason}. Set default.timestamp.extractor (or the source's "
            "timestamp_extractor=) to one that accepts it, e.g. LogAndSkipOnInvalidTimestamp, "
            "UsePartitionTimeOnInvalidTimestamp or WallclockTimestampExtractor"
        )
        self.topic = record.topic
        self.partition = record.partition
        self.offset = record.offset
        self.timestamp = record.timestamp


class FailOnInvalidTimestamp:
    """The record's own timestamp; a negative one raises ``InvalidTimestampError``."""

    def extract(self, record: ConsumedRecord, partition_time: int) -> int:
        if record.timestamp < 0:
            return self.on_invalid(record, partition_time)
        return record.timestamp

    def on_invalid(self, record: ConsumedRecord, partition_time: int) -> int:
        raise InvalidTimestampError(record, "the extractor is FailOnInvalidTimestamp")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class LogAndSkipOnInvalidTimestamp(FailOnInvalidTimestamp):
    """The record's own timestamp; a record with a negative one is logged and dropped."""

    def on_invalid(self, record: ConsumedRecord, partition_time: int) -> int:
        log.warning("Dropping the record at %s-%s offset %s: its timestamp %s is negative "
                    "(LogAndSkipOnInvalidTimestamp)", record.topic, record.partition, record.offset,
                    record.timestamp)
        return record.timestamp


class UsePartitionTimeOnInvalidTimestamp(FailOnInvalidTimestamp):
    """The record's own timestamp; a negative one is replaced by the partition's time, which
    must be known (an ``InvalidTimestampError`` for the partition's first valid record)."""

    def on_invalid(self, record: ConsumedRecord, partition_time: int) -> int:
        if partition_time < 0:
            raise InvalidTimestampError(record, "UsePartitionTimeOnInvalidTimestamp cannot replace it: "
                                                "the partition has no time yet")
        return partition_time


class WallclockTimestampExtractor:
    """The wall-clock time when the record is processed (processing-time semantics)."""

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock = clock or SystemClock()

    def extract(self, record: ConsumedRecord, partition_time: int) -> int:
        return self._clock.wall_ms()

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def as_extractor(value: object, label: str) -> TimestampExtractor:
    """An extractor from an instance, a class (made with no arguments) or a ``module.Name`` path.

    Raises ``ValueError`` naming ``label`` (the config key or the source) when it is none of these.
    """
    if isinstance(value, str):
        module_name, _, attribute = value.rpartition(".")
        if not module_name:
            raise ValueError(f"{label}: expected a dotted path like 'package.module.Extractor', got {value!r}")
        try:
            value = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"{label}: cannot load {value!r}: {exc}") from exc
    if isinstance(value, type):
        value = value()
    if not callable(getattr(value, "extract", None)):
        raise ValueError(f"{label}: {value!r} has no extract(record, partition_time) method")
    return value  # type: ignore[return-value]  # checked just above: it has extract()


def load_timestamp_extractor(config: StreamsConfig) -> TimestampExtractor:
    """``default.timestamp.extractor``: raises ``ConfigError`` naming the key when it cannot be loaded."""
    try:
        return as_extractor(config[DEFAULT_TIMESTAMP_EXTRACTOR], DEFAULT_TIMESTAMP_EXTRACTOR)
    except ValueError as exc:
        raise ConfigError(DEFAULT_TIMESTAMP_EXTRACTOR, str(exc)) from exc


__all__ = [
    "ConsumedRecord",
    "FailOnInvalidTimestamp",
    "InvalidTimestampError",
    "LogAndSkipOnInvalidTimestamp",
    "TimestampExtractor",
    "UsePartitionTimeOnInvalidTimestamp",
    "WallclockTimestampExtractor",
    "as_extractor",
    "load_timestamp_extractor",
]
