"""``KStream.process_values``: a Processor API processor that cannot change the key (Kafka
Streams 4's ``FixedKeyProcessor``, KIP-820).

The processor gets a ``FixedKeyRecord`` and may forward only ``FixedKeyRecord``s made from it
(``with_value``, ``with_timestamp``, ``with_headers``: there is no ``with_key``). Since every
record leaves with the key it came with, the stream after it is still partitioned by its key:
a later ``group_by_key`` or join needs no repartition, and the key serde is kept.
Forwarding anything else raises ``ForwardingError``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from streamloop.errors import ForwardingError
from streamloop.processors.api import BaseProcessor, Cancellable, ProcessorContext, PunctuationType
from streamloop.records import Headers, Record


class FixedKeyRecord:
    """A record whose key a processor cannot change; made by the engine, copied with ``with_*``."""

    __slots__ = ("_record",)

    def __init__(self, record: Record) -> None:
        self._record = record

    @property
    def key(self) -> Any:
        return self._record.key

    @property
    def value(self) -> Any:
        return self._record.value

    @property
    def timestamp(self) -> int:
        return self._record.timestamp

    @property
    def headers(self) -> Headers:
        return self._record.headers

    def with_value(self, value: Any) -> FixedKeyRecord:
        return FixedKeyRecord(self._record.with_value(value))

    def with_timestamp(self, timestamp: int) -> FixedKeyRecord:
        return FixedKeyRecord(self._record.with_timestamp(timestamp))

    def with_headers(self, headers: Headers) -> FixedKeyRecord:
        return FixedKeyRecord(self._record.with_headers(headers))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FixedKeyRecord) and self._record == other._record

    __hash__ = None  # type: ignore[assignment]  # mutable inside, as Record

    def __repr__(self) -> str:
        return f"FixedKeyRecord(key={self.key!r}, value={self.value!r}, timestamp={self.timestamp})"


class FixedKeyProcessorContext(Protocol):
    """A ``ProcessorContext`` whose ``forward`` takes only ``FixedKeyRecord``s."""

    @property
    def task_id(self) -> Any: ...
    @property
    def topic(self) -> str | None: ...
    @property
    def partition(self) -> int | None: ...
    @property
    def offset(self) -> int | None: ...
    @property
    def timestamp(self) -> int: ...

    def forward(self, record: FixedKeyRecord, to: str | None = None) -> None: ...
    def commit(self) -> None: ...
    def get_state_store(self, name: str) -> Any: ...
    def schedule(self, interval_ms: int, kind: PunctuationType,
                 punctuator: Callable[[int], Any]) -> Cancellable: ...


@runtime_checkable
class FixedKeyProcessor(Protocol):
    def init(self, context: FixedKeyProcessorContext) -> None: ...

    def process(self, record: FixedKeyRecord) -> Any:
        """Handle one record; may be ``async def``."""

    def close(self) -> None: ...


FixedKeyProcessorSupplier = Callable[[], FixedKeyProcessor]


class _FixedKeyContext:
    """The node's context, with a ``forward`` that refuses what could carry another key."""

    __slots__ = ("_inner", "_node")

    def __init__(self, inner: ProcessorContext, node: str) -> None:
        self._inner = inner
        self._node = node

    def forward(self, record: FixedKeyRecord, to: str | None = None) -> None:
        if not isinstance(record, FixedKeyRecord):
            raise ForwardingError(self._node, (
                f"a process_values() processor forwards FixedKeyRecords (record.with_value(...)), got "
                f"{type(record).__name__}; use process() for a processor that changes keys"))
        self._inner.forward(record._record, to)

    def __getattr__(self, name: str) -> Any:
        # Everything else (task_id, topic, stores, schedule, commit, ...) is the node's context's.
        return getattr(self._inner, name)


class FixedKeyProcessorAdapter(BaseProcessor):
    """Runs a ``FixedKeyProcessor`` as a node's processor (its ``process`` may be ``async def``)."""

    def __init__(self, node: str, processor: FixedKeyProcessor) -> None:
        self.node = node
        self.processor = processor

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.processor.init(_FixedKeyContext(context, self.node))

    def process(self, record: Record) -> Any:
        return self.processor.process(FixedKeyRecord(record))

    def close(self) -> None:
        self.processor.close()
