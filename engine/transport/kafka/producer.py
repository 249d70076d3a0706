"""``KafkaProducer``: the engine's ``Producer`` over aiokafka's, transactions included.

Producer ordering
    aiokafka has at most one produce request in flight per broker and mutes a
    partition while a batch of it is in flight; failed batches are put back at
    the head of their partition's queue. Batches of one partition are therefore
    written in the order they were handed to ``send_batch``.

Transactions (exactly-once)
    With ``ProducerSettings.transactional_id`` the aiokafka producer is
    transactional: ``start`` sends InitProducerId (fencing older producers of
    the id and aborting their open transaction), a transaction begins with the
    first batch handed over, and ``commit_transaction`` flushes, sends
    AddOffsetsToTxn + TxnOffsetCommit and EndTxn. aiokafka 0.14 sends
    TxnOffsetCommit **v0**: group id, transactional id, producer id and epoch,
    offsets — no generation id, member id or group instance id, so the group
    coordinator cannot fence a zombie member (KIP-447); only the
    transactional.id fences. aiokafka sends EndTxn without waiting for batches
    in flight, so ``commit_transaction`` waits for every ack first and
    ``abort_transaction`` waits for them (bounded) too. It also waits for the
    end of a transaction without a deadline: both calls are bounded by
    ``request_timeout_ms`` here. Fencing (ProducerFenced, InvalidProducerEpoch,
    TransactionCoordinatorFenced) surfaces as ``ProducerFencedError``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer

from streamloop import redaction
from streamloop.errors import IllegalStateError, ProducerFencedError, TransportError
from streamloop.records import Headers, TopicPartition
from streamloop.transport.base import OffsetAndMetadata, ProducerSettings
from streamloop.transport.kafka.errors import describe, produce_error, transaction_error
from streamloop.transport.kafka.options import client_kwargs
from streamloop.transport.kafka.security import client_secrets, security_options
from streamloop.transport.kafka.startup import start_or_clean_up
from streamloop.transport.kafka.structs import aio_offsets

__all__ = ["KafkaProducer"]

log = logging.getLogger(__name__)


_NO_HEADERS: list[tuple[str, bytes]] = []  # shared; the batch builder only reads it


class _PublicAppend:
    """``append`` through aiokafka's public ``BatchBuilder.append`` (slower fallback)."""

    __slots__ = ("_batch",)

    def __init__(self, batch: Any) -> None:
        self._batch = batch

    def append(
        self, offset: int, timestamp: int | None, key: Any, value: Any, headers: list[Any]
    ) -> Any:
        return self._batch.append(timestamp=timestamp, key=key, value=value, headers=headers)


class _Slot:
    """One aiokafka ``BatchBuilder`` being filled for one partition.

    The fast path writes into the builder's record-batch builder (a Cython
    object) directly and sets the builder's record count once, at hand-over:
    it skips ``BatchBuilder.append``'s keyword call, serializer hooks and
    per-record bookkeeping (about 2.5x faster per record). Both attributes are
    private to aiokafka; :meth:`can_write_directly` checks they are there, and
    the public ``append`` is used otherwise.
    """

    __slots__ = ("batch", "count", "fast", "raw")

    def __init__(self, batch: Any, fast: bool) -> None:
        self.batch = batch
        self.fast = fast
        self.raw = batch._builder if fast else _PublicAppend(batch)
        self.count = 0

    @staticmethod
    def can_write_directly(batch: Any) -> bool:
        return (
            getattr(batch, "_relative_offset", None) == 0
            and callable(getattr(getattr(batch, "_builder", None), "append", None))
        )

    def seal(self) -> Any:
        """Close the builder for the hand-over and return it."""
        batch = self.batch
        if self.fast:
            batch._relative_offset = self.count
        batch.close()
        return batch


class KafkaProducer:
    """Buffers records in one aiokafka batch per partition; see :meth:`append`.

    ``append`` writes straight into an aiokafka ``BatchBuilder`` (no future per
    record). ``send_buffered`` closes the builders and hands them to the sender
    (full ones first, in order), so lingering is the engine's business: a batch
    holds what was appended between two ``send_buffered`` calls, up to
    ``batch_size`` bytes. ``delivery_timeout_ms`` has no aiokafka equivalent:
    a batch expires ``request_timeout_ms`` after it was handed over.

    A failed delivery makes the producer *failed*: every later ``send_buffered``
    and ``flush`` raises ``ProduceError`` for that first failure (so nothing
    after it is taken as delivered). Close it and make a new one.
    """

    def __init__(
        self, bootstrap_servers: str, common: Mapping[str, object], settings: ProducerSettings,
        security: Sequence[tuple[str, Mapping[str, object]]] = (),
    ) -> None:
        self._settings = settings
        acks: object = settings.acks
        if isinstance(acks, str) and acks.strip().lstrip("-").isdigit():
            acks = int(acks)
        compression = settings.compression_type
        if compression is not None and compression.lower() == "none":
            compression = None
        kwargs: dict[str, object] = {
            "bootstrap_servers": bootstrap_servers,
            "client_id": settings.client_id,
            "acks": acks,
            "linger_ms": settings.linger_ms,
            "max_batch_size": settings.batch_size,
            "request_timeout_ms": settings.request_timeout_ms,
            "retry_backoff_ms": settings.retry_backoff_ms,
            "compression_type": compression,
        }
        if settings.transactional_id is not None:
            kwargs["transactional_id"] = settings.transactional_id
            kwargs["transaction_timeout_ms"] = settings.transaction_timeout_ms
        kwargs.update(security_options(*security, ("producer.", settings.extra)))
        kwargs.update(client_kwargs(AIOKafkaProducer, common))
        kwargs.update(client_kwargs(AIOKafkaProducer, settings.extra))
        self._kwargs = kwargs
        self._secrets = client_secrets(kwargs, *security, ("producer.", settings.extra))
        self._transactional = settings.transactional_id is not None
        self._producer: AIOKafkaProducer | None = None
        self._closed = False
        # Open builder per (topic, partition); full builders wait in _ready.
        self._open: dict[tuple[str, int], _Slot] = {}
        self._ready: list[tuple[str, int, _Slot]] = []
        # aiokafka's delivery futures (asyncio futures: waited for with asyncio.wait), their
        # partitions and record counts.
        self._pending: dict[asyncio.Future[Any], tuple[str, int, int]] = {}
        self._acked: dict[TopicPartition, int] = {}
        self._failure: tuple[str, int, BaseException] | None = None
        self._handoff = asyncio.Lock()
        self._fast = False

    @property
    def options(self) -> Mapping[str, object]:
        """The keyword arguments the aiokafka producer is made with (secrets included: never log them)."""
        return dict(self._kwargs)

    async def start(self) -> None:
        if self._producer is not None:
            raise IllegalStateError("the producer is already started")
        if self._closed:
            raise IllegalStateError("the producer is closed")
        # Before it connects: aiokafka logs the login's bytes at DEBUG.
        redaction.register(self, self._secrets)
        producer = AIOKafkaProducer(**self._kwargs)
        try:
            await start_or_clean_up(producer.start, producer.stop, "starting the producer", self._kwargs)
        except BaseException:
            redaction.unregister(self)
            raise
        if self._closed:
            # Closed while it was starting (a task closed during its start-up): nothing would
            # close this one later.
            await producer.stop()
            raise IllegalStateError("the producer was closed while it started")
        self._producer = producer
        self._fast = _Slot.can_write_directly(producer.create_batch())

    def append(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        timestamp_ms: int | None,
        headers: Headers,
    ) -> None:
        slot = self._open.get((topic, partition))
        if slot is None:
            slot = self._new_slot(topic, partition)
        if not headers:
            headers = _NO_HEADERS
        elif type(headers) is not list:  # the batch builder takes a list only
            headers = list(headers)
        if slot.raw.append(slot.count, timestamp_ms, key, value, headers) is None:
            # Full: keep it for the next hand-over and start another one. An
            # empty builder takes any first record, even one over batch_size.
            self._ready.append((topic, partition, slot))
            slot = self._new_slot(topic, partition)
            slot.raw.append(0, timestamp_ms, key, value, headers)
        slot.count += 1

    def _new_slot(self, topic: str, partition: int) -> _Slot:
        producer = self._producer
        if producer is None:
            raise IllegalStateError(
                "the producer is closed" if self._closed else "the producer is not started"
            )
        slot = _Slot(producer.create_batch(), self._fast)
        self._open[(topic, partition)] = slot
        return slot

    def buffered(self) -> int:
        # Counted on demand: one counter less to bump per appended record.
        return sum(slot.count for slot in self._open.values()) + sum(
            slot.count for _, _, slot in self._ready
        )

    async def send_buffered(self) -> None:
        self._raise_failure()
        if not self._open and not self._ready:
            if self._handoff.locked():
                # Another hand-over is under way (a task's chunk, its batches out of the buffer but
                # not yet in _pending): a flush must wait for it, or a commit would cover records
                # whose output was never handed over (and may yet fail, e.g. an unknown topic).
                async with self._handoff:
                    pass
                self._raise_failure()
            return
        producer = self._producer
        if producer is None:
            raise IllegalStateError("the producer is not started")
        async with self._handoff:  # keeps hand-overs (and so partition order) sequential
            if self._transactional and not producer._txn_manager.is_in_transaction():
                await self._begin(producer)
            batches = self._ready
            batches.extend((tp[0], tp[1], slot) for tp, slot in self._open.items())
            self._ready = []
            self._open = {}
            for i, (topic, partition, slot) in enumerate(batches):
                builder = slot.seal()
                try:
                    # Waits only while an earlier batch of this partition is still
                    # queued (aiokafka keeps at most one queued batch per partition).
                    future = await producer.send_batch(builder, topic, partition=partition)
                except BaseException as exc:
                    # e.g. UnknownTopicOrPartitionError after request_timeout_ms
                    # for a topic that does not exist, or a cancellation. The
                    # rest is dropped, so the producer is failed from here on
                    # (a later flush must not report these records delivered).
                    self._fail(topic, partition, exc)
                    dropped = sum(slot.count for _, _, slot in batches[i:])
                    log.error(
                        "Producer %s failed on %s-%s; %d records not sent: %s",
                        self._settings.client_id,
                        topic,
                        partition,
                        dropped,
                        describe(exc),
                    )
                    if not isinstance(exc, Exception):
                        raise
                    self._raise_failure()
                self._pending[future] = (topic, partition, slot.count)
                future.add_done_callback(self._on_delivered)

    def _on_delivered(self, future: asyncio.Future[Any]) -> None:
        where = self._pending.pop(future, None)
        if future.cancelled():
            exc: BaseException | None = asyncio.CancelledError("delivery cancelled")
        else:
            exc = future.exception()  # also marks it retrieved
        if where is None:
            return  # seen already (its callback, then a flush)
        topic, partition, count = where
        if exc is not None:
            self._fail(topic, partition, exc)
            return
        # A batch's records take consecutive offsets from the one its metadata names.
        end = future.result().offset + count
        tp = TopicPartition(topic, partition)
        if end > self._acked.get(tp, 0):
            self._acked[tp] = end

    def acked_ends(self) -> Mapping[TopicPartition, int]:
        return self._acked

    def _fail(self, topic: str, partition: int, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = (topic, partition, exc)

    def _raise_failure(self) -> None:
        if self._failure is not None:
            topic, partition, cause = self._failure
            raise produce_error(topic, partition, cause, self._settings.transactional_id) from cause

    async def flush(self) -> None:
        """Every record appended before this call is acknowledged (or the failure raised).

        Only those: the tasks go on producing beside a commit, and under steady load some batch
        is always in flight, so waiting until none was left never ended (no commit completed
        until the input ran dry)."""
        await self.send_buffered()
        waiting = list(self._pending)
        if waiting:
            await asyncio.wait(waiting)
            for future in waiting:
                # Its done callback may not have run yet; a second call finds nothing left to do.
                self._on_delivered(future)
        self._raise_failure()

    # -- transactions (exactly-once) ---------------------------------------------------
    #
    # aiokafka 0.14 sends TxnOffsetCommit v0: no generation id, no member id (KIP-447's
    # group fencing is missing). Zombies are therefore fenced by the transactional.id
    # alone; see engine.transactions for the id scheme that makes that enough.

    @property
    def in_transaction(self) -> bool:
        producer = self._producer
        return producer is not None and self._transactional and producer._txn_manager.is_in_transaction()

    async def _begin(self, producer: AIOKafkaProducer) -> None:
        try:
            await asyncio.wait_for(producer.begin_transaction(), self._settings.request_timeout_ms / 1000)
        except Exception as exc:
            raise self._transaction_error(exc, "beginning a transaction") from exc

    async def commit_transaction(self, offsets: Mapping[TopicPartition, OffsetAndMetadata], group_id: str) -> None:
        producer = self._producer
        if producer is None or not self._transactional:
            raise IllegalStateError("the producer is not a started transactional producer")
        timeout = self._settings.request_timeout_ms / 1000
        try:
            # A transactional producer's batches never expire while its coordinator is away (the
            # sender waits for AddPartitionsToTxn first): without a deadline this waits for good.
            await asyncio.wait_for(self.flush(), timeout)
        except TimeoutError as exc:
            raise self._transaction_error(exc, "flushing the transaction's records") from exc
        if not offsets and not self.in_transaction:
            return
        try:
            if not self.in_transaction:
                await self._begin(producer)
            if offsets:
                await asyncio.wait_for(producer.send_offsets_to_transaction(aio_offsets(offsets), group_id), timeout)
            # aiokafka waits for the transaction's end without a deadline of its own.
            await asyncio.wait_for(producer.commit_transaction(), timeout)
        except (ProducerFencedError, TransportError):
            raise
        except Exception as exc:
            raise self._transaction_error(exc, "committing the transaction") from exc

    async def abort_transaction(self) -> None:
        producer = self._producer
        self._open = {}
        self._ready = []
        if producer is None or not self._transactional:
            return
        manager = producer._txn_manager
        if not manager.is_in_transaction() and manager.state.name != "ABORTABLE_ERROR":
            return  # nothing open, or fenced/failed for good: closing is all that is left
        timeout = self._settings.request_timeout_ms / 1000
        if self._pending:
            # aiokafka sends EndTxn without waiting for batches in flight: let them land first, so
            # the abort marker follows every record of the transaction.
            await asyncio.wait(list(self._pending), timeout=timeout)
        try:
            await asyncio.wait_for(producer.abort_transaction(), timeout)
        except Exception as exc:
            raise self._transaction_error(exc, "aborting the transaction") from exc

    def _transaction_error(self, exc: BaseException, what: str) -> TransportError:
        return transaction_error(exc, what, self._settings.transactional_id)

    async def close(self) -> None:
        """Drop what was not handed over; wait for what was (aiokafka's ``stop``)."""
        if self._closed:
            return
        self._closed = True
        producer, self._producer = self._producer, None
        self._open = {}
        self._ready = []
        if producer is None:
            redaction.unregister(self)
            return
        try:
            await producer.stop()
        finally:
            redaction.unregister(self)
            if self._transactional:
                # A fenced or failed transaction leaves its waiter failed and unawaited; asyncio
                # would log "Future exception was never retrieved" when it is collected.
                waiter = getattr(producer._txn_manager, "_transaction_waiter", None)
                if waiter is not None and waiter.done() and not waiter.cancelled():
                    waiter.exception()

