"""What flows between a table's operations: an update with the value it replaces, and a way
to read a table's current value by key.

Kafka Streams forwards ``Change(newValue, oldValue)`` between KTable processors. Here a
``ChangeRecord`` is a ``Record`` whose ``value`` is the new value and which also carries
``old_value``: any node that knows nothing of tables (``to_stream()`` and everything after
it, a sink) sees an ordinary record, so a table that sends old values looks the same to
them as one that does not. A delete is ``value`` None.

A ``TableView`` is Kafka Streams' value getter: a join reads the other table through it,
also when that table has no store of its own (a filter or ``map_values`` that was not
materialized reads its parent's store and applies itself on the fly).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from streamloop.processors.api import ProcessorContext
from streamloop.records import Record
from streamloop.serdes import Serde

Getter = Callable[[Any], Any]


@dataclass(slots=True)
class ChangeRecord(Record):
    """A table update: ``value`` is the new value (None: deleted), ``old_value`` the one it replaces."""

    old_value: Any = field(default=None)


def old_value_of(record: Record) -> Any:
    """The value ``record`` replaces in its table (None when the table sends no old values)."""
    return record.old_value if isinstance(record, ChangeRecord) else None


class ClosingGetter:
    """A getter that holds what its reader must close with it: the transformers a
    ``transform_values`` view made for it (Kafka Streams' ``KTableValueGetter.close``)."""

    __slots__ = ("_closers", "_get")

    def __init__(self, get: Getter, closers: tuple[Callable[[], None], ...]) -> None:
        self._get = get
        self._closers = closers

    def __call__(self, key: Any) -> Any:
        return self._get(key)

    def close(self) -> None:
        for close in self._closers:
            close()


def derived_getter(get: Getter, *parents: Getter, close: Callable[[], None] | None = None) -> Getter:
    """``get``, made from ``parents``' getters: it closes what they close (and ``close``), if anything."""
    closers = tuple(c for p in parents if isinstance(p, ClosingGetter) for c in p._closers)
    if close is not None:
        closers = (*closers, close)
    return ClosingGetter(get, closers) if closers else get


def close_getter(get: Getter) -> None:
    """Close what a getter holds (Caller: a processor's ``close``, for the getters it made)."""
    if isinstance(get, ClosingGetter):
        get.close()


@dataclass(frozen=True)
class TableView:
    """How a processor reads a table's current value for a key, from the stores named in ``stores``
    (which the processor must be connected to)."""

    stores: tuple[str, ...]
    make: Callable[[ProcessorContext], Getter]

    @staticmethod
    def of_store(name: str) -> TableView:
        return TableView((name,), lambda context: context.get_state_store(name).get)

    def filtered(self, predicate: Callable[[Any, Any], Any], negate: bool) -> TableView:
        parent = self.make

        def make(context: ProcessorContext) -> Getter:
            get = parent(context)

            def filtered_get(key: Any) -> Any:
                value = get(key)
                return value if value is not None and bool(predicate(key, value)) != negate else None
            return derived_getter(filtered_get, get)
        return TableView(self.stores, make)

    def mapped(self, mapper: Callable[[Any], Any]) -> TableView:
        parent = self.make

        def make(context: ProcessorContext) -> Getter:
            get = parent(context)

            def mapped_get(key: Any) -> Any:
                value = get(key)
                return None if value is None else mapper(value)
            return derived_getter(mapped_get, get)
        return TableView(self.stores, make)


@dataclass(frozen=True, slots=True)
class TableChange:
    """A regrouped table update on its way to its group: the value to add (``new``) and the one
    to subtract (``old``); None where there is none."""

    new: Any
    old: Any


_HAS_NEW, _HAS_OLD = 1, 2


class ChangeSerde:
    """Writes a ``TableChange`` with ``inner`` (the grouping's value serde) as one record of a
    repartition topic: a flag byte (which values are there), the new value's length (4 bytes),
    the new value's bytes, the old value's bytes. An update that stays in its group goes as one
    record, so its group subtracts and adds at once (Kafka Streams >= 3.5, KIP-904).

    Without ``inner`` it takes the default value serde when the task is built (``with_default``).
    """

    def __init__(self, inner: Serde | None) -> None:
        self.inner = inner

    def with_default(self, default: Serde) -> ChangeSerde:
        return self if self.inner is not None else ChangeSerde(default)

    def __repr__(self) -> str:
        return f"ChangeSerde({self.inner!r})"

    def _serde(self) -> Serde:
        if self.inner is None:
            raise ValueError("ChangeSerde has no value serde (with_default was not called)")
        return self.inner

    def serialize(self, change: TableChange | None) -> bytes | None:
        if change is None:
            return None
        serde = self._serde()
        new = None if change.new is None else serde.serialize(change.new)
        old = None if change.old is None else serde.serialize(change.old)
        flags = (_HAS_NEW if new is not None else 0) | (_HAS_OLD if old is not None else 0)
        new_bytes = new or b""
        return bytes((flags,)) + len(new_bytes).to_bytes(4, "big") + new_bytes + (old or b"")

    def deserialize(self, data: bytes | None) -> TableChange | None:
        if data is None:
            return None
        if len(data) < 5:
            raise ValueError(f"not a table change: {len(data)} bytes")
        serde = self._serde()
        flags, size = data[0], int.from_bytes(data[1:5], "big")
        new = serde.deserialize(data[5:5 + size]) if flags & _HAS_NEW else None
        old = serde.deserialize(data[5 + size:]) if flags & _HAS_OLD else None
        return TableChange(new, old)
