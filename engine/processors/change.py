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

from engine.processors.api import ProcessorContext
from engine.records import Record

Getter = Callable[[Any], Any]


@dataclass(slots=True)
class ChangeRecord(Record):
    """A table update: ``value`` is the new value (None: deleted), ``old_value`` the one it replaces."""

    old_value: Any = field(default=None)


def old_value_of(record: Record) -> Any:
    """The value ``record`` replaces in its table (None when the table sends no old values)."""
    return record.old_value if isinstance(record, ChangeRecord) else None


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
            return filtered_get
        return TableView(self.stores, make)

    def mapped(self, mapper: Callable[[Any], Any]) -> TableView:
        parent = self.make

        def make(context: ProcessorContext) -> Getter:
            get = parent(context)

            def mapped_get(key: Any) -> Any:
                value = get(key)
                return None if value is None else mapper(value)
            return mapped_get
        return TableView(self.stores, make)
