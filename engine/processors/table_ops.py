"""The processors of a table's own operations: ``filter``/``filter_not``, ``map_values``, and
``group_by(...).aggregate/count/reduce`` (Kafka Streams' KTableFilter, KTableMapValues,
KTableRepartitionMap, KTableAggregate and KTableReduce).

Each gets its parent table's updates with the values they replace (``ChangeRecord``) and
forwards its own the same way. A filter forwards a delete for a key only when the key's
previous value passed (KTableFilterTest with old values sent): a key that never passed
stays unseen downstream. A regrouped update is sent through the repartition topic as a
subtraction from the group of the old value and an addition to the group of the new one: one
record when both are the same group (Kafka Streams >= 3.5, KIP-904), else two, subtraction first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from streamloop.processors.api import BaseProcessor
from streamloop.processors.change import ChangeRecord, TableChange, old_value_of
from streamloop.processors.stateful import _TableProcessor
from streamloop.records import Record

log = logging.getLogger(__name__)

def _passes(predicate: Callable[[Any, Any], Any], negate: bool, key: Any, value: Any) -> Any:
    return value if value is not None and bool(predicate(key, value)) != negate else None


class TableFilterProcessor(BaseProcessor):
    """A filter without a store of its own: the result is computed from the parent's update."""

    send_old_values = False  # it always computes the old value: it decides whether to forward at all

    def __init__(self, predicate: Callable[[Any, Any], Any], negate: bool) -> None:
        self.predicate = predicate
        self.negate = negate

    def process(self, record: Record) -> None:
        key = record.key
        new = _passes(self.predicate, self.negate, key, record.value)
        old = _passes(self.predicate, self.negate, key, old_value_of(record))
        if new is None and old is None:
            return  # neither passes: nothing changed downstream
        self.context.forward(ChangeRecord(key, new, record.timestamp, record.headers, old))


class TableMapValuesProcessor(BaseProcessor):
    """``map_values`` without a store of its own."""

    send_old_values = False

    def __init__(self, mapper: Callable[[Any], Any]) -> None:
        self.mapper = mapper

    def process(self, record: Record) -> None:
        new = None if record.value is None else self.mapper(record.value)
        old = None
        if self.send_old_values:
            previous = old_value_of(record)
            old = None if previous is None else self.mapper(previous)
        self.context.forward(ChangeRecord(record.key, new, record.timestamp, record.headers, old))


class MaterializedTableOpProcessor(_TableProcessor):
    """A filter or ``map_values`` with its own store: the result is stored, and forwarded as it
    goes down from the store (coalesced by the cache, as every table with a store is)."""

    def __init__(self, store_name: str, compute: Callable[[Any, Any], Any], skip_absent: bool) -> None:
        super().__init__(store_name)
        self.compute = compute
        # A filter does not delete (and so forward a delete for) a key its store does not hold.
        self.skip_absent = skip_absent

    def process(self, record: Record) -> None:
        new = None if record.value is None else self.compute(record.key, record.value)
        if new is None and self.skip_absent and self.store.get(record.key) is None:
            return
        self.store.put(record.key, new)


class TableRegroupProcessor(BaseProcessor):
    """Maps each update to its groups with ``selector(key, value) -> (group_key, group_value)``:
    one ``TableChange`` when the old and the new value are in the same group, else a subtraction
    for the old value's group and then an addition for the new one's (KTableRepartitionMap)."""

    def __init__(self, selector: Callable[[Any, Any], Any]) -> None:
        self.selector = selector

    def process(self, record: Record) -> None:
        old_value = old_value_of(record)
        old = None if old_value is None else self._group(record.key, old_value)
        new = None if record.value is None else self._group(record.key, record.value)
        ts = record.timestamp
        if old is not None and new is not None and old[0] == new[0]:
            self.context.forward(Record(new[0], TableChange(new[1], old[1]), ts))
            return
        if old is not None:
            self.context.forward(Record(old[0], TableChange(None, old[1]), ts))
        if new is not None:
            self.context.forward(Record(new[0], TableChange(new[1], None), ts))

    def _group(self, key: Any, value: Any) -> tuple[Any, Any] | None:
        pair = self.selector(key, value)
        if pair is None:
            return None  # as Kafka Streams: a row the selector maps to nothing is in no group
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise TypeError(f"group_by() selector must return a (key, value) tuple, got {pair!r}")
        return pair


class _RegroupedTableProcessor(_TableProcessor):
    """KTableAggregate/KTableReduce: subtract the old value (when the group has an aggregate), then
    add the new one, and store the result once."""

    def process(self, record: Record) -> None:
        change = record.value
        if record.key is None or not isinstance(change, TableChange):
            self._drop(record, "it has no key" if record.key is None else "it is not a table update")
            return
        old = self.store.get(record.key)
        aggregate = old if change.old is None or old is None else self.subtract(record.key, change.old, old)
        if change.new is not None:
            aggregate = self.add(record.key, change.new, aggregate)
        self.store.put(record.key, aggregate)

    def add(self, key: Any, value: Any, aggregate: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def subtract(self, key: Any, value: Any, aggregate: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError


class TableAggregateProcessor(_RegroupedTableProcessor):
    """KTableAggregate: ``adder(key, value, aggregate)`` / ``subtractor(key, value, aggregate)``;
    a group's first value starts from ``initializer()``."""

    def __init__(self, store_name: str, initializer: Callable[[], Any], adder: Callable[[Any, Any, Any], Any],
                 subtractor: Callable[[Any, Any, Any], Any]) -> None:
        super().__init__(store_name)
        self.initializer = initializer
        self.adder = adder
        self.subtractor = subtractor

    def add(self, key: Any, value: Any, aggregate: Any) -> Any:
        return self.adder(key, value, self.initializer() if aggregate is None else aggregate)

    def subtract(self, key: Any, value: Any, aggregate: Any) -> Any:
        return self.subtractor(key, value, aggregate)


class TableReduceProcessor(_RegroupedTableProcessor):
    """KTableReduce: ``adder(aggregate, value)`` / ``subtractor(aggregate, value)``; a group's first
    value is its aggregate."""

    def __init__(self, store_name: str, adder: Callable[[Any, Any], Any],
                 subtractor: Callable[[Any, Any], Any]) -> None:
        super().__init__(store_name)
        self.adder = adder
        self.subtractor = subtractor

    def add(self, key: Any, value: Any, aggregate: Any) -> Any:
        return value if aggregate is None else self.adder(aggregate, value)

    def subtract(self, key: Any, value: Any, aggregate: Any) -> Any:
        return self.subtractor(aggregate, value)
