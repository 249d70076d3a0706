"""The bodies of ``KTable``'s own operations: ``filter``/``filter_not``, ``map_values`` and the
table-table joins (``KTable`` keeps thin methods that call these).

A table operation needs the value each update of its parent replaces (Kafka Streams'
``enableSendingOldValues``): ``send_old_values`` switches the parent's processors to
forward ``ChangeRecord``s. Without ``materialized`` a filter, ``map_values`` or join keeps no
store: it is computed from its parent's updates, and a join reads it through its
``TableView`` (the parent's store with the operation applied on the fly).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from streamloop.errors import TopologyError
from streamloop.processors.builtin import PeekNode
from streamloop.processors.change import TableView
from streamloop.processors.table_joins import TableJoinProcessor, joined_view
from streamloop.processors.table_ops import MaterializedTableOpProcessor, TableFilterProcessor, TableMapValuesProcessor
from streamloop.serdes import Serde, as_serde
from streamloop.state.stores import Materialized, StoreBuilder, StoreSupplier
from streamloop.topology.copartition import add_copartition_group

if TYPE_CHECKING:
    from streamloop.topology.builder import StreamsBuilder
    from streamloop.topology.tables import KTable


def plain_function(fn: Any, what: str) -> None:
    """A table's functions run inside a store update, which cannot wait: no ``async def``."""
    if not callable(fn):
        raise TypeError(f"{what} needs a callable, got {fn!r}")
    if inspect.iscoroutinefunction(fn):
        raise TopologyError(f"{what} must be a plain function: a store update cannot wait (got async {fn!r})")


class _OldValuesFactory:
    """Wraps a table node's factory so that its processor forwards old values (set before ``init``)."""

    def __init__(self, inner: Callable[[], Any], node: str) -> None:
        self.inner = inner
        self.node = node

    def __call__(self) -> Any:
        made = self.inner()
        processor = getattr(made, "processor", None)
        if not hasattr(processor, "send_old_values"):
            raise TopologyError(f"Table node '{self.node}' cannot send the old values its table operations need")
        processor.send_old_values = True  # type: ignore[union-attr]  # checked just above
        return made


def send_old_values(table: KTable) -> None:
    """Make the nodes that forward ``table``'s updates send the values they replace too."""
    topology = table._builder._topology
    for node in table._change_nodes:
        # A table kept in a store only on demand (a foreign-key join's result) is from now on: the
        # values its updates replace come from there.
        topology.demand_stores_of(node)
        spec = topology.spec(node)
        if not isinstance(spec.factory, _OldValuesFactory):
            spec.factory = _OldValuesFactory(spec.factory, node)


def view_of(table: KTable, what: str) -> TableView:
    if table._view is None:
        raise TopologyError(f"{what} needs a key-value table; '{table._node}' is windowed or has no store to read")
    return table._view


def derived(table: KTable, node: str, store: str | None, value_serde: Serde | None, view: TableView | None,
            change_nodes: tuple[str, ...] | None = None) -> KTable:
    # The class of ``table`` (KTable): this module is imported by streamloop.topology.tables.
    result = type(table)(table._builder, node, store, table._key_serde, value_serde)
    result._view = TableView.of_store(store) if store is not None else view
    result._change_nodes = change_nodes or (node,)
    return result


def table_store(store: str, materialized: Materialized | str | None, key_serde: Serde | None,
                value_serde: Serde | None) -> StoreBuilder:
    """The builder of a table's key-value store ``store``, tuned by ``materialized``."""
    spec = materialized if isinstance(materialized, Materialized) else Materialized(store)
    ks = None if spec.key_serde is None else as_serde(spec.key_serde, f"key serde of store '{store}'")
    vs = None if spec.value_serde is None else as_serde(spec.value_serde, f"value serde of store '{store}'")
    return StoreBuilder(StoreSupplier(store, spec.persistent), ks or key_serde, vs or value_serde,
                        caching=spec.caching, logging=spec.logging, ttl=spec.ttl)


def add_table_store(builder: StreamsBuilder, store: str, materialized: Materialized | str | None, node: str,
                    key_serde: Serde | None, value_serde: Serde | None) -> StoreBuilder:
    """Add the key-value store ``store`` of ``node``, tuned by ``materialized``; returns its builder."""
    store_builder = table_store(store, materialized, key_serde, value_serde)
    builder._topology.add_state_store(store_builder, node)
    return store_builder


def _materialize(table: KTable, materialized: Materialized | str, node: str, parent: str,
                 compute: Callable[[Any, Any], Any], skip_absent: bool, value_serde: Serde | None,
                 prefix: str) -> KTable:
    """``node`` keeps its results in the store ``materialized`` names and forwards them from there."""
    builder = table._builder
    store = builder._store_name(materialized, prefix)
    builder._topology.add_processor(node, lambda: MaterializedTableOpProcessor(store, compute, skip_absent), parent)
    store_builder = add_table_store(builder, store, materialized, node, table._key_serde, value_serde)
    return derived(table, node, store, store_builder.value_serde, None)


def filter_table(table: KTable, predicate: Callable[[Any, Any], Any], negate: bool,
                 materialized: Materialized | str | None, name: str | None) -> KTable:
    plain_function(predicate, "filter_not()" if negate else "filter()")
    builder = table._builder
    # Whether a key passed before decides whether its removal is forwarded: always needs old values.
    send_old_values(table)
    node = builder._name(name, "KTABLE-FILTER")
    if materialized is None:
        builder._topology.add_processor(node, lambda: TableFilterProcessor(predicate, negate), table._node)
        view = table._view.filtered(predicate, negate) if table._view is not None else None
        return derived(table, node, None, table._value_serde, view)

    def compute(key: Any, value: Any) -> Any:
        return value if bool(predicate(key, value)) != negate else None
    return _materialize(table, materialized, node, table._node, compute, True, table._value_serde,
                        "KTABLE-FILTER-STATE-STORE")


def map_table_values(table: KTable, mapper: Callable[[Any], Any], materialized: Materialized | str | None,
                     name: str | None) -> KTable:
    plain_function(mapper, "map_values()")
    builder = table._builder
    node = builder._name(name, "KTABLE-MAPVALUES")
    if materialized is None:
        builder._topology.add_processor(node, lambda: TableMapValuesProcessor(mapper), table._node)
        view = table._view.mapped(mapper) if table._view is not None else None
        # Its old values are its parent's, mapped: the parent sends them only once asked to.
        return derived(table, node, None, None, view, (*table._change_nodes, node))
    return _materialize(table, materialized, node, table._node, lambda _k, v: mapper(v), False, None,
                        "KTABLE-MAPVALUES-STATE-STORE")


def join_views(table: KTable, other: KTable, what: str) -> tuple[TableView, TableView]:
    """How a join of ``table`` with ``other`` reads each side, once both are checked to be tables
    of one builder (key-to-key and foreign-key joins alike)."""
    if not isinstance(other, type(table)):
        raise TopologyError(f"{what} needs a KTable, got {other!r}")
    if other._builder is not table._builder:
        raise TopologyError(f"{what}: both tables must come from the same StreamsBuilder")
    return view_of(table, what), view_of(other, what)


def join_tables(table: KTable, other: KTable, joiner: Callable[[Any, Any], Any], kind: str,
                materialized: Materialized | str | None, name: str | None) -> KTable:
    what = {"inner": "join()", "left": "left_join()", "outer": "outer_join()"}[kind]
    plain_function(joiner, what)
    left_view, right_view = join_views(table, other, what)
    builder = table._builder
    topology = builder._topology
    base = builder._name(name, "KTABLE-JOINTHIS" if kind == "inner" else f"KTABLE-{kind.upper()}JOIN")
    this_node, other_node = f"{base}-this", f"{base}-other"
    topology.add_processor(this_node, lambda: TableJoinProcessor(right_view, joiner, True, kind), table._node,
                           stores=right_view.stores)
    topology.add_processor(other_node, lambda: TableJoinProcessor(left_view, joiner, False, kind), other._node,
                           stores=left_view.stores)
    # A side's old value tells what its update replaces in the joined table.
    send_old_values(table)
    send_old_values(other)
    merge = builder._name(None, "KTABLE-MERGE")
    topology.add_node(merge, lambda: PeekNode(merge, _ignore), this_node, other_node)
    add_copartition_group(topology, what, (table._node, other._node))
    if materialized is None:
        return derived(table, merge, None, None, joined_view(left_view, right_view, joiner, kind),
                       (this_node, other_node))
    return _materialize(table, materialized, builder._name(None, "KTABLE-MATERIALIZE"), merge,
                        lambda _k, v: v, False, None, "KTABLE-JOIN-STATE-STORE")


def _ignore(_key: Any, _value: Any) -> None:
    return None
