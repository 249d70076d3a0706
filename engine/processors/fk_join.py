"""The processors of a foreign-key table join (Kafka Streams' KIP-213).

``left.join(right, foreign_key_extractor, joiner)`` joins each left row with the right row whose
key ``foreign_key_extractor(left_value)`` names (here always a function of the left row's key and
value: streamloop.topology.fk_join wraps a value-only extractor). The two tables need not be co-partitioned: a
left row *subscribes* to its foreign key through a topic partitioned by that key, so that the
task holding the right row for it gets the subscription; that task keeps it in a subscription
store and *responds*, now and on every later update of the right row, through a topic with the
left table's partitions, to the partition of the task holding the left row (carried in the
subscription), which joins.

- ``SubscriptionSendProcessor`` (left task): a left update becomes instructions for the
  subscription topic (KS' SubscriptionSendProcessorSupplier): subscribe to the new foreign key,
  unsubscribe from an old one that changed, and say whether a response is wanted when the right
  row is absent. A left join's row without a foreign key is answered on the spot (no right row
  can match it).
- ``SubscriptionReceiveProcessor`` (right task): keeps or removes the subscription and answers
  with the right row's current value (SubscriptionReceiveProcessorSupplier and
  SubscriptionJoinProcessorSupplier).
- ``ForeignTableChangeProcessor`` (right task): a right update answers every subscriber of its
  key (ForeignTableJoinProcessorSupplier), found by a prefix scan of the subscription store.
- ``ResponseJoinProcessor`` (left task): joins a response with the left row's current value,
  unless the left row changed since it subscribed: each subscription carries a hash of the left
  value it was sent for, and a response whose hash is not that of the current value is stale
  and dropped (SubscriptionResolverJoinProcessorSupplier / ResponseJoinProcessorSupplier).

Everything that crosses a topic or sits in the subscription store is bytes these processors
write themselves (formats below), with the tables' serdes or the client's defaults, so the
internal topics and store need no serdes of their own.
"""

from __future__ import annotations

import hashlib
import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from streamloop.processors.api import BaseProcessor, ProcessorContext
from streamloop.processors.change import Getter, TableView, close_getter, old_value_of
from streamloop.records import Record
from streamloop.serdes import Serde

log = logging.getLogger(__name__)

_VERSION = 0
_HASH_SIZE = 16
_PARTITION = struct.Struct(">i")


class Instruction(IntEnum):
    """What a subscription asks of the right side (KS' SubscriptionWrapper.Instruction)."""

    DELETE_KEY_NO_PROPAGATE = 0  # unsubscribe; the new foreign key's response updates the result
    DELETE_KEY_AND_PROPAGATE = 1  # unsubscribe and answer (None): the left row is gone
    PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE = 2  # subscribe; answer even when the right row is absent
    PROPAGATE_ONLY_IF_FK_VAL_AVAILABLE = 3  # subscribe; answer only when the right row exists


@dataclass(frozen=True, slots=True)
class Subscription:
    """A subscription as it travels: ``hash`` of the left value (None: deleted), the partition of
    the left task (the answer goes there, whatever partitioner wrote the left topic, as KS'
    primaryPartition), ``left_key`` as bytes."""

    instruction: Instruction
    hash: bytes | None
    partition: int
    left_key: bytes

    def to_bytes(self) -> bytes:
        # version, then the stored part (see ``stored``), then the left key's bytes
        return bytes((_VERSION,)) + self.stored() + self.left_key

    def stored(self) -> bytes:
        """What the subscription store keeps: instruction, has-hash flag, [16-byte hash], partition."""
        head = bytes((int(self.instruction), 0 if self.hash is None else 1))
        return head + (self.hash or b"") + _PARTITION.pack(self.partition)

    @staticmethod
    def from_stored(data: bytes, left_key: bytes) -> Subscription:
        end = 2 + (_HASH_SIZE if data[1] else 0)
        (partition,) = _PARTITION.unpack_from(data, end)
        return Subscription(Instruction(data[0]), data[2:end] if data[1] else None, partition, left_key)

    @staticmethod
    def from_bytes(data: bytes) -> Subscription:
        _check_version(data, "subscription")
        start = 1 + 2 + (_HASH_SIZE if data[2] else 0) + _PARTITION.size
        return Subscription.from_stored(data[1:start], data[start:])


@dataclass(frozen=True, slots=True)
class Response:
    """A right side's answer: the subscription's ``hash``, the left task's partition, and the right
    value's bytes (None: absent)."""

    hash: bytes | None
    partition: int
    foreign_value: bytes | None

    def to_bytes(self) -> bytes:
        # version, flags (1: hash, 2: foreign value), [16-byte hash], partition, foreign value bytes
        flags = (0 if self.hash is None else 1) | (0 if self.foreign_value is None else 2)
        return (bytes((_VERSION, flags)) + (self.hash or b"") + _PARTITION.pack(self.partition)
                + (self.foreign_value or b""))

    @staticmethod
    def from_bytes(data: bytes) -> Response:
        _check_version(data, "subscription response")
        flags = data[1]
        end = 2 + (_HASH_SIZE if flags & 1 else 0)
        (partition,) = _PARTITION.unpack_from(data, end)
        start = end + _PARTITION.size
        return Response(data[2:end] if flags & 1 else None, partition, data[start:] if flags & 2 else None)

    @staticmethod
    def partitioner(_topic: str, _key: Any, value: Any, count: int) -> int | None:
        """The response sink's partitioner: the partition of the left task that subscribed."""
        if not isinstance(value, bytes):
            return None
        partition = Response.from_bytes(value).partition
        return partition if 0 <= partition < count else None


@dataclass(frozen=True, slots=True)
class LocalResponse:
    """A response the left task gives itself (a left join's row without a foreign key)."""

    hash: bytes | None


def _check_version(data: bytes | None, what: str) -> None:
    if data is None or len(data) < 2:
        raise ValueError(f"not a foreign-key join {what}: {data!r}")
    if data[0] != _VERSION:
        raise ValueError(f"foreign-key join {what} of version {data[0]}, this client reads {_VERSION}")


def value_hash(data: bytes) -> bytes:
    """128 bits of the left value's bytes: equal bytes, equal hash (KS uses Murmur3 128)."""
    return hashlib.blake2b(data, digest_size=_HASH_SIZE).digest()


def subscription_key(foreign_key: bytes, left_key: bytes) -> bytes:
    """The subscription store's key: the foreign key's length and bytes, then the left key's, so that
    all subscribers of a foreign key are one prefix (KS' CombinedKeySchema)."""
    return len(foreign_key).to_bytes(4, "big") + foreign_key + left_key


def prefix_end(prefix: bytes) -> bytes | None:
    """The first key after every key starting with ``prefix`` (None: there is none)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return None
    return trimmed[:-1] + bytes((trimmed[-1] + 1,))


@dataclass(frozen=True)
class JoinSerdes:
    """The serdes of the join's sides; None: the client's default (known once a task is built)."""

    left_key: Serde | None
    left_value: Serde | None
    foreign_key: Serde | None
    right_value: Serde | None

    def resolve(self, context: ProcessorContext) -> JoinSerdes:
        defaults = getattr(context, "default_serdes", None)
        if defaults is None:
            if None in (self.left_key, self.left_value, self.foreign_key, self.right_value):
                raise ValueError("A foreign-key join needs serdes for both tables or the client's defaults")
            return self
        key, value = defaults
        return JoinSerdes(self.left_key or key, self.left_value or value, self.foreign_key or key,
                          self.right_value or value)


def _serialize(serde: Serde | None, value: Any, what: str) -> bytes:
    data = None if serde is None else serde.serialize(value)
    if data is None:
        raise ValueError(f"A foreign-key join could not serialize the {what} {value!r}")
    return data


class SubscriptionSendProcessor(BaseProcessor):
    """Left task: each left update (with its old value) to subscription instructions, sent to
    ``sink`` keyed by the foreign key's bytes; a left join's answer without a foreign key goes
    straight to ``resolver``."""

    def __init__(self, extractor: Callable[[Any, Any], Any], left_join: bool, serdes: JoinSerdes, sink: str,
                 resolver: str) -> None:
        self.extractor = extractor
        self.left_join = left_join
        self.serdes = serdes
        self.sink = sink
        self.resolver = resolver
        self.dropped = 0

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.resolved = self.serdes.resolve(context)

    def process(self, record: Record) -> None:
        key, new, old = record.key, record.value, old_value_of(record)
        if key is None:
            self._skip("it has no key")
            return
        if new is None and old is None:
            return  # deleting a row that was not there changes nothing (KS: idempotent deletes)
        # The old value's foreign key is the one it subscribed with: same key, the old value.
        new_fk = None if new is None else self.extractor(key, new)
        old_fk = None if old is None else self.extractor(key, old)
        serdes = self.resolved
        left_key = _serialize(serdes.left_key, key, "left key")
        digest = None if new is None else value_hash(_serialize(serdes.left_value, new, "left value"))
        new_fkb = None if new_fk is None else _serialize(serdes.foreign_key, new_fk, "foreign key")
        old_fkb = None if old_fk is None else _serialize(serdes.foreign_key, old_fk, "foreign key")
        changed = old_fkb is not None and old_fkb != new_fkb
        if self.left_join:
            if changed:
                assert old_fkb is not None
                self._send(record, old_fkb, Instruction.DELETE_KEY_NO_PROPAGATE, digest, left_key)
            if new_fkb is None:
                # KS sends this to a null foreign key only to be answered with None: no right row can
                # match it, so the answer is given here.
                self.context.forward(Record(key, LocalResponse(digest), record.timestamp, record.headers),
                                     to=self.resolver)
            else:
                self._send(record, new_fkb, Instruction.PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE, digest, left_key)
            return
        if new is None:
            if old_fkb is not None:
                self._send(record, old_fkb, Instruction.DELETE_KEY_AND_PROPAGATE, digest, left_key)
            return
        if new_fkb is None:
            self._skip("its foreign key is None")
            if old_fkb is not None:
                self._send(record, old_fkb, Instruction.DELETE_KEY_AND_PROPAGATE, digest, left_key)
            return
        if changed:
            # The old subscription is at another task: remove it; the new one's answer (None when
            # no right row) replaces the result the old one may have made.
            assert old_fkb is not None
            self._send(record, old_fkb, Instruction.DELETE_KEY_NO_PROPAGATE, digest, left_key)
            self._send(record, new_fkb, Instruction.PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE, digest, left_key)
        else:
            # An insert, or the same foreign key: without a right row there was no result and is none.
            self._send(record, new_fkb, Instruction.PROPAGATE_ONLY_IF_FK_VAL_AVAILABLE, digest, left_key)

    def _send(self, record: Record, foreign_key: bytes, instruction: Instruction, digest: bytes | None,
              left_key: bytes) -> None:
        value = Subscription(instruction, digest, self.context.task_id.partition, left_key).to_bytes()
        self.context.forward(Record(foreign_key, value, record.timestamp, record.headers), to=self.sink)

    def _skip(self, why: str) -> None:
        self.dropped += 1
        log.warning("Skipping a record of %s-%s offset %s in a foreign-key join: %s", self.context.topic,
                    self.context.partition, self.context.offset, why)


class _RightSideProcessor(BaseProcessor):
    """Shares the subscription store and the serdes on the right task."""

    def __init__(self, store_name: str, serdes: JoinSerdes) -> None:
        self.store_name = store_name
        self.serdes = serdes

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.store: Any = context.get_state_store(self.store_name)
        self.resolved = self.serdes.resolve(context)

    def _respond(self, record: Record, sub: Subscription, foreign_value: Any) -> None:
        value = None if foreign_value is None else _serialize(self.resolved.right_value, foreign_value,
                                                              "right value")
        self.context.forward(Record(sub.left_key, Response(sub.hash, sub.partition, value).to_bytes(),
                                    record.timestamp, record.headers))


class SubscriptionReceiveProcessor(_RightSideProcessor):
    """Right task: keeps the subscriptions of the foreign keys of this partition, and answers them
    with the right row's current value as the instruction says."""

    def __init__(self, store_name: str, serdes: JoinSerdes, right: TableView) -> None:
        super().__init__(store_name, serdes)
        self.right = right
        self.dropped = 0

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.get: Getter = self.right.make(context)

    def close(self) -> None:
        close_getter(self.get)

    def process(self, record: Record) -> None:
        foreign_key, data = record.key, record.value
        if foreign_key is None or data is None:
            self.dropped += 1
            log.warning("Dropping a subscription without a foreign key or value at %s-%s offset %s",
                        self.context.topic, self.context.partition, self.context.offset)
            return
        sub = Subscription.from_bytes(data)
        stored = subscription_key(foreign_key, sub.left_key)
        if sub.instruction in (Instruction.DELETE_KEY_NO_PROPAGATE, Instruction.DELETE_KEY_AND_PROPAGATE):
            self.store.delete(stored)
        else:
            # What a right update needs to answer this subscriber: its hash and partition.
            self.store.put(stored, sub.stored())
        if sub.instruction is Instruction.DELETE_KEY_NO_PROPAGATE:
            return
        if sub.instruction is Instruction.DELETE_KEY_AND_PROPAGATE:
            self._respond(record, sub, None)
            return
        foreign_value = self.get(self.resolved.foreign_key.deserialize(foreign_key))  # type: ignore[union-attr]
        if foreign_value is None and sub.instruction is Instruction.PROPAGATE_ONLY_IF_FK_VAL_AVAILABLE:
            return
        self._respond(record, sub, foreign_value)


class ForeignTableChangeProcessor(_RightSideProcessor):
    """Right task: a right row's update (a delete too) answers every subscriber of its key."""

    def process(self, record: Record) -> None:
        if record.key is None:
            return  # a table forwards no update without a key
        foreign_key = _serialize(self.resolved.foreign_key, record.key, "foreign key")
        prefix = subscription_key(foreign_key, b"")
        end = prefix_end(prefix)
        for stored, entry in self.store.range(prefix, end):
            if not stored.startswith(prefix):
                continue  # ``end`` itself (the range is inclusive)
            self._respond(record, Subscription.from_stored(entry, stored[len(prefix):]), record.value)


class ResponseJoinProcessor(BaseProcessor):
    """Left task: joins an answer with the left row's current value, unless the left row changed
    since it subscribed (the answer's hash is not the current value's): then the answer is stale
    and a newer one is on its way."""

    def __init__(self, left: TableView, joiner: Callable[[Any, Any], Any], left_join: bool,
                 serdes: JoinSerdes) -> None:
        self.left = left
        self.joiner = joiner
        self.left_join = left_join
        self.serdes = serdes
        self.stale = 0

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.get: Getter = self.left.make(context)
        self.resolved = self.serdes.resolve(context)

    def close(self) -> None:
        close_getter(self.get)

    def process(self, record: Record) -> None:
        serdes = self.resolved
        if isinstance(record.value, LocalResponse):
            key, digest, foreign_value = record.key, record.value.hash, None
        else:
            if record.key is None or record.value is None:
                return
            response = Response.from_bytes(record.value)
            key = serdes.left_key.deserialize(record.key)  # type: ignore[union-attr]
            digest = response.hash
            foreign_value = None if response.foreign_value is None \
                else serdes.right_value.deserialize(response.foreign_value)  # type: ignore[union-attr]
        current = self.get(key)
        current_hash = None if current is None \
            else value_hash(_serialize(serdes.left_value, current, "left value"))
        if current_hash != digest:
            self.stale += 1
            return
        if foreign_value is None and (not self.left_join or current is None):
            result = None
        else:
            result = self.joiner(current, foreign_value)
        self.context.forward(Record(key, result, record.timestamp, record.headers))
