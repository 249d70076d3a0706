"""MemoryProducer: buffers records per partition and appends them to the broker's logs.

Acks are immediate: ``send_buffered`` writes every buffered record, so ``flush``
is ``send_buffered``. Records for a topic or partition that does not exist are
dropped, and the producer fails: the call that handed them over (``send_buffered``
or ``flush``) and every later one raise ``ProduceError`` naming the first such
partition, as the Kafka transport's producer does. The records of the other
partitions of that hand-over are written all the same.
"""

from __future__ import annotations

from collections.abc import Mapping

from streamloop.errors import IllegalStateError, ProduceError
from streamloop.records import Headers, TopicPartition
from streamloop.transport.base import ProducerSettings
from streamloop.transport.memory.broker import MemoryBroker
from streamloop.transport.memory.log import ProducedRecord


class MemoryProducer:
    """Implements :class:`streamloop.transport.base.Producer` on a :class:`MemoryBroker`."""

    def __init__(self, broker: MemoryBroker, settings: ProducerSettings) -> None:
        self._broker = broker
        self._settings = settings
        self._buffer: dict[TopicPartition, list[ProducedRecord]] = {}
        self._buffered = 0
        self._failure: tuple[TopicPartition, str | BaseException] | None = None
        self._closed = False
        self._acked: dict[TopicPartition, int] = {}

    def __repr__(self) -> str:
        return f"MemoryProducer({self._settings.client_id} on {self._broker!r})"

    async def start(self) -> None:
        self._check_open()

    def append(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        timestamp_ms: int | None,
        headers: Headers,
    ) -> None:
        """Buffer one record; without a timestamp it gets the broker's wall clock now."""
        self._check_open()
        timestamp = timestamp_ms if timestamp_ms is not None else self._broker.now_ms()
        batch = self._buffer.setdefault(TopicPartition(topic, partition), [])
        batch.append(ProducedRecord(key, value, timestamp, tuple(headers)))
        self._buffered += 1

    def buffered(self) -> int:
        return self._buffered

    async def send_buffered(self) -> None:
        """Append every buffered record to its partition log (per partition in order, atomically)."""
        self._raise_failure()
        if not self._buffer:
            return
        batches, self._buffer, self._buffered = self._buffer, {}, 0
        failed = self._broker.produce(batches, self._acked)
        if failed:
            self._failure = next(iter(failed.items()))
            self._raise_failure()

    async def flush(self) -> None:
        """Send what is buffered; every record is acknowledged once it is written."""
        await self.send_buffered()

    def acked_ends(self) -> Mapping[TopicPartition, int]:
        return self._acked

    async def close(self) -> None:
        """Drop what was not handed over (as the Kafka transport does) and refuse further records."""
        self._closed = True
        self._buffer, self._buffered = {}, 0

    def _raise_failure(self) -> None:
        if self._failure is not None:
            tp, reason = self._failure
            cause = reason if isinstance(reason, BaseException) else None
            raise ProduceError(tp.topic, tp.partition, reason) from cause

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError(f"Producer {self._settings.client_id} is closed.")
