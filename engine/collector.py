"""``RecordCollector``: serialises a task's output, picks its partition, hands it to the producer.

Sends are synchronous appends to the thread's producer buffer; the task hands
the buffer to the network after each chunk of records, and a commit waits for
every ack before offsets are committed (see ``streamloop.commit``).
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Collection
from typing import TYPE_CHECKING, Any

from streamloop.errors import MissingSinkTopicError, ProduceError, SerializationError
from streamloop.records import Headers, Record
from streamloop.transport.base import Producer
from streamloop.transport.partitioner import key_hash

if TYPE_CHECKING:
    from streamloop.processors.nodes import SinkNode

_HASH_CACHE_LIMIT = 65_536


class RecordCollector:
    """One per stream thread, shared by its tasks (they all run on its loop).

    ``partition_counts`` is filled at start-up for the static sink topics;
    a topic chosen per record is looked up once with ``lookup``.
    """

    def __init__(
        self,
        producer: Producer,
        partition_counts: dict[str, int],
        lookup: Callable[[str], Awaitable[int | None]],
    ) -> None:
        self.producer = producer
        self._partitions = partition_counts
        self._lookup = lookup
        # murmur2 in pure Python costs microseconds; keys repeat, so remember them.
        self._hash_cache: dict[bytes, int] = {}
        self._round_robin: dict[str, itertools.count[int]] = {}
        self.sent = 0
        # Records a stream partitioner sent to no partition (an empty set: it says to drop them), one
        # count for this collector and its siblings (the thread's dropped-records-total adds it).
        self._dropped = [0]

    def sibling(self, producer: Producer) -> RecordCollector:
        """A collector over another producer (one task's, under exactly-once) that shares this one's
        partition counts and key hashes."""
        other = RecordCollector(producer, self._partitions, self._lookup)
        other._hash_cache = self._hash_cache
        other._round_robin = self._round_robin
        other._dropped = self._dropped
        return other

    @property
    def dropped(self) -> int:
        """Records stream partitioners dropped (answered an empty set), here and in the siblings."""
        return self._dropped[0]

    def send(self, topic: str, record: Record, sink: SinkNode,
             hold: list[Any] | None = None) -> Awaitable[None] | None:
        """Serialise ``record`` with the sink's serdes and append it; a serde that fails raises a
        ``SerializationError`` naming the sink, the topic and how to fix it (nothing is appended).

        With ``hold``, the serialised record goes there instead, as ``(topic, record, sink, key
        bytes, value bytes)`` for ``send_serialized`` later: ``HeldCollector``, for a record in
        flight, whose output waits for its turn while a serde failure is raised as it runs.
        """
        # Serialising is written once, here, and runs once per output record: no call of its own.
        try:
            key_bytes = sink.key_serde.serialize(record.key)
        except Exception as exc:
            raise _serialization_error(sink, topic, "key", record.key, exc) from exc
        try:
            value_bytes = sink.value_serde.serialize(record.value)
        except Exception as exc:
            raise _serialization_error(sink, topic, "value", record.value, exc) from exc
        if hold is not None:
            hold.append((topic, record, sink, key_bytes, value_bytes))
            return None
        # ``send_serialized``'s common case (a known topic, Kafka's default partitioning) inlined.
        count = self._partitions.get(topic)
        if count is None or sink.partitioner is not None or key_bytes is None:
            return self.send_serialized(topic, record, sink, key_bytes, value_bytes)
        hashed = self._hash_cache.get(key_bytes)
        if hashed is None:
            hashed = self._hash(key_bytes)
        self.producer.append(topic, hashed % count, key_bytes, value_bytes, record.timestamp, record.headers)
        self.sent += 1
        return None

    def send_serialized(self, topic: str, record: Record, sink: SinkNode, key_bytes: bytes | None,
                        value_bytes: bytes | None) -> Awaitable[None] | None:
        """Partition and append what ``send`` serialised; an awaitable when the topic's
        partition count must be looked up first, else None."""
        count = self._partitions.get(topic)
        if count is None:
            return self._send_after_lookup(topic, record, sink, key_bytes, value_bytes)
        partitioner = sink.partitioner
        if partitioner is not None:
            chosen = partitioner(topic, record.key, record.value, count)
            if chosen is not None:
                # KIP-837: a copy to each partition chosen (ascending), none for an empty set.
                partitions = checked_partitions(chosen, sink.name, topic, count)
                if not partitions:
                    self._dropped[0] += 1
                    return None
                for partition in partitions:
                    self.producer.append(topic, partition, key_bytes, value_bytes, record.timestamp, record.headers)
                self.sent += len(partitions)
                return None
        partition = self.default_partition(topic, key_bytes, count)
        self.producer.append(topic, partition, key_bytes, value_bytes, record.timestamp, record.headers)
        self.sent += 1
        return None

    async def _send_after_lookup(self, topic: str, record: Record, sink: SinkNode, key_bytes: bytes | None,
                                 value_bytes: bytes | None) -> None:
        await self.partition_count(topic)
        self.send_serialized(topic, record, sink, key_bytes, value_bytes)

    async def partition_count(self, topic: str) -> int:
        """``topic``'s partition count, looked up once; ``MissingSinkTopicError`` if it does not exist.
        Caller: ``send``, ``send_raw`` and the executors' writes (``streamloop.tasks.bulk_exec``), which partition
        by this count as ``default_partition`` does."""
        count = self._partitions.get(topic)
        if count is None:
            count = await self._lookup(topic)
            if count is None:
                raise MissingSinkTopicError([topic])
            self._partitions[topic] = count
        return count

    async def send_raw(self, topic: str, key: bytes | None, value: bytes | None, timestamp: int,
                       headers: Headers) -> None:
        """Send bytes as they are (dead letters), partitioned like any record."""
        count = await self.partition_count(topic)
        self.producer.append(topic, self.default_partition(topic, key, count), key, value, timestamp, headers)

    def append_raw(self, topic: str, partition: int, key: bytes, value: bytes | None, timestamp: int,
                   headers: Headers) -> None:
        """Bytes to a known partition (a changelog update goes to its task's partition)."""
        self.producer.append(topic, partition, key, value, timestamp, headers)

    def default_partition(self, topic: str, key: bytes | None, count: int) -> int:
        """Kafka's default: murmur2 of the key bytes; records without key go round-robin."""
        if key is None:
            counter = self._round_robin.get(topic)
            if counter is None:
                counter = self._round_robin[topic] = itertools.count()
            return next(counter) % count
        hashed = self._hash_cache.get(key)
        if hashed is None:
            hashed = self._hash(key)
        return hashed % count

    def _hash(self, key: bytes) -> int:
        """murmur2 of ``key``, remembered (the memory bounded by clearing it when full)."""
        if len(self._hash_cache) >= _HASH_CACHE_LIMIT:
            self._hash_cache.clear()
        hashed = self._hash_cache[key] = key_hash(key)
        return hashed

    def buffered(self) -> int:
        return self.producer.buffered()

    async def send_buffered(self) -> None:
        await self.producer.send_buffered()

    async def flush(self) -> None:
        await self.producer.flush()


def checked_partitions(chosen: object, sink: str, topic: str, count: int) -> list[int]:
    """What a stream partitioner of ``sink`` chose, sorted; ``ProduceError`` for anything but a
    collection of partitions of ``topic`` (0..count-1)."""
    if isinstance(chosen, (str, bytes)) or not isinstance(chosen, Collection):
        raise ProduceError(topic, -1, f"partitioner of '{sink}' returned {chosen!r}: StreamPartitioner.partitions() "
                                      "returns None or a set of partitions")
    partitions = []
    for partition in chosen:
        if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition < count:
            raise ProduceError(topic, partition if isinstance(partition, int) else -1,
                               f"partitioner of '{sink}' chose a partition outside 0..{count - 1}: {partition!r}")
        partitions.append(partition)
    partitions.sort()
    return partitions


def _serialization_error(sink: SinkNode, topic: str, what: str, value: object, cause: Exception) -> SerializationError:
    key = what == "key"
    return SerializationError(sink.name, topic, what, value, sink.key_serde if key else sink.value_serde,
                              sink.origins[0 if key else 1], sink.serde_call, cause)
