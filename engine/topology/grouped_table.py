"""``KTable.group_by(selector)``: a table regrouped by a new key, to aggregate with an adder and a
subtractor (Kafka Streams' KGroupedTable).

Each update of the table is mapped by ``selector(key, value) -> (group_key, group_value)``
twice: its old value is subtracted from the old value's group, then its new value added to
the new value's group (in one record when that is the same group, KIP-904). They go through
a repartition topic so that all rows of a group meet in one task. A group whose rows are all
gone keeps the aggregate the subtractor left (0 for ``count()``), as in Kafka Streams.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from streamloop.processors.change import ChangeSerde
from streamloop.processors.table_ops import TableAggregateProcessor, TableReduceProcessor, TableRegroupProcessor
from streamloop.serdes import LongSerde, Serde, as_serde
from streamloop.state.stores import Materialized
from streamloop.topology.table_ops import add_table_store, plain_function, send_old_values

if TYPE_CHECKING:
    from streamloop.topology.builder import StreamsBuilder
    from streamloop.topology.tables import KTable


def group_table(table: KTable, selector: Callable[[Any, Any], Any], key_serde: Serde | type | None,
                value_serde: Serde | type | None, name: str | None) -> KGroupedTable:
    plain_function(selector, "group_by()")
    builder = table._builder
    send_old_values(table)  # an update's old value is what to subtract from its old group
    node = builder._name(name, "KTABLE-SELECT")
    builder._topology.add_processor(node, lambda: TableRegroupProcessor(selector), table._node)
    ks = None if key_serde is None else as_serde(key_serde, "key serde of group_by()")
    vs = None if value_serde is None else as_serde(value_serde, "value serde of group_by()")
    # Values go as TableChange (added and subtracted value), written with the grouping's value serde.
    repartitioned = builder._stream_at(node, key_changed=True)._repartition(ks, ChangeSerde(vs), (False, False),
                                                                            "group_by()")
    return KGroupedTable(builder, repartitioned._node, ks, vs, type(table))


class KGroupedTable:
    """A table's rows regrouped by a new key, ready to aggregate (``count``, ``reduce``, ``aggregate``)."""

    def __init__(self, builder: StreamsBuilder, node: str, key_serde: Serde | None, value_serde: Serde | None,
                 table_class: type[KTable]) -> None:
        self._builder = builder
        self._node = node
        self._key_serde = key_serde
        self._value_serde = value_serde
        self._table_class = table_class  # KTable (streamloop.topology.tables imports this module)

    def count(self, *, materialized: Materialized | str | None = None, name: str | None = None) -> KTable:
        """The number of rows per group."""
        return self._aggregate("count", lambda: 0, lambda _k, _v, n: n + 1, lambda _k, _v, n: n - 1,
                               materialized, name, LongSerde())

    def aggregate(self, initializer: Callable[[], Any], adder: Callable[[Any, Any, Any], Any],
                  subtractor: Callable[[Any, Any, Any], Any], *, materialized: Materialized | str | None = None,
                  name: str | None = None) -> KTable:
        """``adder(key, value, aggregate)`` for each row joining a group, ``subtractor(key, value,
        aggregate)`` for each leaving it (the old value of an updated or deleted row); a group's
        first row starts from ``initializer()``."""
        return self._aggregate("aggregate", initializer, adder, subtractor, materialized, name, None)

    def reduce(self, adder: Callable[[Any, Any], Any], subtractor: Callable[[Any, Any], Any], *,
               materialized: Materialized | str | None = None, name: str | None = None) -> KTable:
        """``adder(aggregate, value)`` / ``subtractor(aggregate, value)``; a group's first row is its aggregate."""
        plain_function(adder, "reduce() adder")
        plain_function(subtractor, "reduce() subtractor")
        store = self._builder._store_name(materialized, "KTABLE-REDUCE-STATE-STORE")
        return self._table(store, materialized, self._value_serde,
                           lambda: TableReduceProcessor(store, adder, subtractor), "KTABLE-REDUCE", name)

    def _aggregate(self, what: str, initializer: Callable[[], Any], adder: Callable[[Any, Any, Any], Any],
                   subtractor: Callable[[Any, Any, Any], Any], materialized: Materialized | str | None,
                   name: str | None, value_serde: Serde | None) -> KTable:
        plain_function(initializer, f"{what}() initializer")
        plain_function(adder, f"{what}() adder")
        plain_function(subtractor, f"{what}() subtractor")
        store = self._builder._store_name(materialized, "KTABLE-AGGREGATE-STATE-STORE")
        return self._table(store, materialized, value_serde,
                           lambda: TableAggregateProcessor(store, initializer, adder, subtractor),
                           "KTABLE-AGGREGATE", name)

    def _table(self, store: str, materialized: Materialized | str | None, value_serde: Serde | None,
               supplier: Callable[[], Any], prefix: str, name: str | None) -> KTable:
        builder = self._builder
        node = builder._name(name, prefix)
        builder._topology.add_processor(node, supplier, self._node)
        store_builder = add_table_store(builder, store, materialized, node, self._key_serde, value_serde)
        return self._table_class(builder, node, store, store_builder.key_serde, store_builder.value_serde)
