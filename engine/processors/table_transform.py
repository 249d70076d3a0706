"""The processors of ``KTable.transform_values`` (Kafka Streams' KTableTransformValues): a
``ValueTransformerWithKey`` applied to every update of a table, with state stores if it needs them.

As in Kafka Streams the transformer is called for every update, deletes included
(``transform(key, None)``); what it returns is the new value (None deletes the key). Without a
store of its own the old value sent on is the transform of the parent's old value (so a
stateful transformer is called twice per update then), and the table is read (by a join) with a
transformer of its own applied to the parent's current value. With a store, the results are
kept there and the old value is the stored one. The transformer's context forwards nothing.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from streamloop.errors import ForwardingError, TopologyError
from streamloop.processors.api import BaseProcessor, ProcessorContext
from streamloop.processors.change import ChangeRecord, Getter, TableView, derived_getter, old_value_of
from streamloop.processors.stateful import _TableProcessor
from streamloop.records import Record


@runtime_checkable
class ValueTransformerWithKey(Protocol):
    def init(self, context: ProcessorContext) -> None: ...

    def transform(self, key: Any, value: Any) -> Any:
        """The new value for ``key`` (``value`` None: the key was deleted); a plain method."""

    def close(self) -> None: ...


ValueTransformerWithKeySupplier = Callable[[], ValueTransformerWithKey]


class _NoForwardContext:
    """The node's context for a transformer: it returns values, it does not forward records."""

    __slots__ = ("_inner", "_node")

    def __init__(self, inner: ProcessorContext, node: str) -> None:
        self._inner = inner
        self._node = node

    def forward(self, record: Record, to: str | None = None) -> None:
        raise ForwardingError(self._node, "a transform_values() transformer cannot forward records: return the "
                                          "new value from transform() (the key must not change)")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def started(supplier: ValueTransformerWithKeySupplier, context: ProcessorContext, node: str) -> ValueTransformerWithKey:
    """A new transformer from ``supplier``, checked and initialized with ``context`` (forwarding off)."""
    transformer = supplier()
    transform = getattr(transformer, "transform", None)
    if not callable(transform):
        raise TopologyError(f"transform_values() supplier of '{node}' must make a ValueTransformerWithKey "
                            f"(init, transform, close), got {transformer!r}")
    if inspect.iscoroutinefunction(transform):
        raise TopologyError(f"transform() of '{node}' must be a plain method: a table update cannot wait")
    transformer.init(_NoForwardContext(context, node))
    return transformer


class TableTransformValuesProcessor(BaseProcessor):
    """Without a store: forwards ``transform(key, new)``, and ``transform(key, old)`` as the old value
    when a table operation downstream needs old values."""

    send_old_values = False

    def __init__(self, node: str, supplier: ValueTransformerWithKeySupplier) -> None:
        self.node = node
        self.supplier = supplier

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.transformer = started(self.supplier, context, self.node)

    def process(self, record: Record) -> None:
        key = record.key
        new = self.transformer.transform(key, record.value)
        old = self.transformer.transform(key, old_value_of(record)) if self.send_old_values else None
        self.context.forward(ChangeRecord(key, new, record.timestamp, record.headers, old))

    def close(self) -> None:
        self.transformer.close()


class MaterializedTableTransformProcessor(_TableProcessor):
    """With a store: keeps ``transform(key, new)`` there; updates go on as they leave the store."""

    def __init__(self, store_name: str, node: str, supplier: ValueTransformerWithKeySupplier) -> None:
        super().__init__(store_name)
        self.node = node
        self.supplier = supplier

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.transformer = started(self.supplier, context, self.node)

    def process(self, record: Record) -> None:
        if record.key is None:
            self._drop(record, "it has no key")
            return
        self.store.put(record.key, self.transformer.transform(record.key, record.value))

    def close(self) -> None:
        self.transformer.close()


def transformed_view(parent: TableView, supplier: ValueTransformerWithKeySupplier, node: str,
                     stores: tuple[str, ...]) -> TableView:
    """How a join reads an unmaterialized ``transform_values`` table: a transformer of the reader's
    own, applied to the parent's current value (None where the parent lacks the key, as Kafka Streams)."""

    def make(context: ProcessorContext) -> Getter:
        get = parent.make(context)
        transformer = started(supplier, context, node)

        def transformed_get(key: Any) -> Any:
            return transformer.transform(key, get(key))
        # Closed with the reader (shouldCloseTransformerOnGetterClose), after its parent's getter.
        return derived_getter(transformed_get, get, close=transformer.close)
    return TableView((*parent.stores, *(s for s in stores if s not in parent.stores)), make)
