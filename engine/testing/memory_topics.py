"""The topics of the ``memory://`` broker from a test or a script: ``create_topics``, ``produce``, ``read``.

They take the same ``bootstrap.servers`` as the application (``memory://name``) and the
serdes of its topology, so that feeding the embedded broker needs no client and no internal
record type::

    create_topics("memory://shop", {"orders": 4, "big-orders": 4})
    produce("memory://shop", "orders", [("alice", {"amount": 12})], StringSerde(), JsonSerde())
    read("memory://shop", "big-orders", StringSerde(), JsonSerde())   # [TestRecord(key, value, ...)]

Each call works at once on the broker of that name, from any thread; nothing is buffered.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import Any

from streamloop.errors import TransportError
from streamloop.records import Record, TopicPartition
from streamloop.serdes import BytesSerde, Serde, as_serde
from streamloop.testing.topics import TestRecord
from streamloop.transport.memory import MemoryBroker
from streamloop.transport.memory.log import ProducedRecord
from streamloop.transport.partitioner import key_hash


def _broker(bootstrap: str, call: str) -> MemoryBroker:
    if not isinstance(bootstrap, str) or not bootstrap.startswith("memory://"):
        raise ValueError(f"{call}() works on the embedded broker only: expected memory://name, got {bootstrap!r}")
    return MemoryBroker.for_url(bootstrap)


def _serde(serde: Serde | type | None, what: str) -> Serde:
    return BytesSerde() if serde is None else as_serde(serde, what)


def create_topics(bootstrap: str, partitions: Mapping[str, int]) -> None:
    """Create each topic with its partition count; a topic that exists keeps its partitions."""
    _broker(bootstrap, "create_topics").create_topics(partitions)


def produce(bootstrap: str, topic: str, records: Iterable[tuple[Any, Any] | Record],
            key_serde: Serde | type | None = None, value_serde: Serde | type | None = None, *,
            partition: int | None = None) -> None:
    """Write ``(key, value)`` pairs or ``Record``\\ s to ``topic``, in order.

    Keys and values go through the serdes (bytes when None). A record goes to ``partition``
    if given, else to the one its key's bytes hash to, as the engine's producer and Kafka's
    default partitioner do (murmur2); records without key go round-robin. Its timestamp is a
    ``Record``'s, else the broker's wall clock. Raises ``TransportError`` when the topic does
    not exist and ``ValueError`` when ``bootstrap`` is not ``memory://…``.
    """
    broker = _broker(bootstrap, "produce")
    count = broker.partition_counts([topic]).get(topic)
    if count is None:
        raise TransportError(f"Topic '{topic}' does not exist on {bootstrap}; "
                             f"create it first with create_topics({bootstrap!r}, {{{topic!r}: <partitions>}})")
    if partition is not None and not 0 <= partition < count:
        raise ValueError(f"Topic '{topic}' has partitions 0..{count - 1}, not {partition}")
    keys, values = _serde(key_serde, "key_serde"), _serde(value_serde, "value_serde")
    round_robin = itertools.count()
    for item in records:
        if isinstance(item, Record):
            key, value, timestamp, headers = item.key, item.value, item.timestamp, tuple(item.headers)
        else:
            (key, value), timestamp, headers = item, broker.now_ms(), ()
        key_bytes = keys.serialize(key)
        target = partition
        if target is None:
            target = (next(round_robin) if key_bytes is None else key_hash(key_bytes)) % count
        failed = broker.produce({TopicPartition(topic, target): [
            ProducedRecord(key_bytes, values.serialize(value), timestamp, headers)]})
        if failed:
            raise TransportError(f"Cannot produce to {topic}-{target}: {failed[TopicPartition(topic, target)]}")


def read(bootstrap: str, topic: str, key_serde: Serde | type | None = None,
         value_serde: Serde | type | None = None) -> list[TestRecord]:
    """Every record of ``topic`` so far, partition by partition in offset order, through the serdes.

    Reading moves nothing: no consumer group, no committed offset; each call reads from the start.
    """
    broker = _broker(bootstrap, "read")
    count = broker.partition_counts([topic]).get(topic)
    if count is None:
        raise TransportError(f"Topic '{topic}' does not exist on {bootstrap}")
    keys, values = _serde(key_serde, "key_serde"), _serde(value_serde, "value_serde")
    return [TestRecord(keys.deserialize(r.key), values.deserialize(r.value), r.timestamp, tuple(r.headers),
                       r.topic, r.partition, r.offset)
            for p in range(count) for r in broker.records(TopicPartition(topic, p))]
