"""The body of ``KTable.transform_values`` (``KTable`` keeps a thin method that calls this); the
processors and semantics are in streamloop.processors.table_transform."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING

from streamloop.errors import TopologyError
from streamloop.processors.table_transform import (
    MaterializedTableTransformProcessor,
    TableTransformValuesProcessor,
    ValueTransformerWithKeySupplier,
    transformed_view,
)
from streamloop.state.stores import Materialized
from streamloop.topology.stream_processors import check_stores, check_supplier
from streamloop.topology.table_ops import add_table_store, derived

if TYPE_CHECKING:
    from streamloop.topology.tables import KTable


def transform_table_values(table: KTable, supplier: ValueTransformerWithKeySupplier,
                           materialized: Materialized | str | None, stores: Sequence[str],
                           name: str | None) -> KTable:
    builder = table._builder
    topology = builder._topology
    node = builder._name(name, "KTABLE-TRANSFORMVALUES")
    check_supplier(supplier, node, "transform_values()", "transform")
    if inspect.iscoroutinefunction(supplier().transform):
        raise TopologyError(f"transform() of '{node}' must be a plain method: a table update cannot wait")
    check_stores(builder, node, stores, "transform_values()")
    if materialized is None:
        topology.add_processor(node, lambda: TableTransformValuesProcessor(node, supplier), table._node,
                               stores=stores)
        view = None if table._view is None else transformed_view(table._view, supplier, node, tuple(stores))
        # Its old values are its parent's, transformed: the parent sends them only once asked to.
        return derived(table, node, None, None, view, (*table._change_nodes, node))
    store = builder._store_name(materialized, "KTABLE-TRANSFORMVALUES-STATE-STORE")
    topology.add_processor(node, lambda: MaterializedTableTransformProcessor(store, node, supplier), table._node,
                           stores=stores)
    store_builder = add_table_store(builder, store, materialized, node, table._key_serde, None)
    return derived(table, node, store, store_builder.value_serde, None)
