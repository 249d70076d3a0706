"""Table-table joins (Kafka Streams' KTableKTableInnerJoin, LeftJoin, RightJoin and OuterJoin).

A join is two processors, one per side: an update of one side is joined with the other
side's current value for the key, read through that side's ``TableView``. Both forward
into one node, the joined table. What an update of a side forwards:

- inner: nothing while the other side lacks the key; else ``joiner`` of the new value (a
  delete when the side's value was deleted);
- left, left side: as inner, but joined with None when the right side lacks the key;
  right side: nothing while the left side lacks the key, else ``joiner(left, new right)``
  (None when the right value was deleted);
- outer: ``joiner`` with None for whichever side lacks the key; a delete once both do.

Unlike Kafka Streams, stores keep no timestamps here, so a result has the timestamp of the
update that caused it rather than the later of the two sides'.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from streamloop.processors.api import BaseProcessor, ProcessorContext
from streamloop.processors.change import ChangeRecord, Getter, TableView, close_getter, derived_getter, old_value_of
from streamloop.records import Record

log = logging.getLogger(__name__)

JOIN_KINDS = ("inner", "left", "outer")


class TableJoinProcessor(BaseProcessor):
    """One side of a table-table join: ``joiner(left_value, right_value)`` for this side's updates."""

    send_old_values = False  # set when a table operation downstream needs the results' old values

    def __init__(self, other: TableView, joiner: Callable[[Any, Any], Any], left_side: bool, kind: str) -> None:
        if kind not in JOIN_KINDS:
            raise ValueError(f"join kind must be one of {JOIN_KINDS}, got {kind!r}")
        self.other = other
        self.joiner = joiner
        self.left_side = left_side
        self.kind = kind
        self.dropped = 0

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.get: Getter = self.other.make(context)

    def _join(self, mine: Any, theirs: Any) -> Any:
        return self.joiner(mine, theirs) if self.left_side else self.joiner(theirs, mine)

    def close(self) -> None:
        close_getter(self.get)

    def process(self, record: Record) -> None:
        key = record.key
        if key is None:
            self.dropped += 1
            log.warning("Dropping a record of %s-%s offset %s in a table join: it has no key",
                        self.context.topic, self.context.partition, self.context.offset)
            return
        other = self.get(key)
        new, old = record.value, old_value_of(record)
        send_old = self.send_old_values
        if self.kind == "inner" or (self.kind == "left" and not self.left_side):
            if other is None:
                return
            if self.kind == "inner":
                result = None if new is None else self._join(new, other)
                previous = self._join(old, other) if send_old and old is not None else None
            else:  # the right side of a left join: the left value stays, joined with the new right one
                result = self._join(new, other)
                previous = self._join(old, other) if send_old else None
        else:  # the left side of a left join, either side of an outer join
            if other is None and new is None and old is None:
                return
            result = self._join(new, other) if new is not None or (self.kind == "outer" and other is not None) \
                else None
            previous = self._join(old, other) if send_old and (
                old is not None or (self.kind == "outer" and other is not None)) else None
        self.context.forward(ChangeRecord(key, result, record.timestamp, record.headers, previous))


def joined_view(left: TableView, right: TableView, joiner: Callable[[Any, Any], Any], kind: str) -> TableView:
    """The joined table's current value for a key, computed from both sides' (the join's value getter)."""

    def make(context: ProcessorContext) -> Getter:
        get_left, get_right = left.make(context), right.make(context)

        def get(key: Any) -> Any:
            lv, rv = get_left(key), get_right(key)
            if lv is None and (kind != "outer" or rv is None):
                return None
            if rv is None and kind == "inner":
                return None
            return joiner(lv, rv)
        return derived_getter(get, get_left, get_right)
    stores = left.stores + tuple(s for s in right.stores if s not in left.stores)
    return TableView(stores, make)
