"""The stateful part of the DSL: grouped streams, windowed streams and tables.

``stream.group_by_key().count()`` is a ``KTable``: a store per task (queryable by
its name) whose updates flow on with ``to_stream()``. Grouping by a new key goes
through a repartition topic ``<application.id>-<store>-repartition`` so that all
records of a key meet in one task, as in Kafka Streams.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, overload

from streamloop.errors import TopologyError
from streamloop.processors.change import TableView
from streamloop.processors.emit_final import FinalWindowAggregateProcessor
from streamloop.processors.stateful import (
    AggregateProcessor,
    ReduceProcessor,
    StreamTableJoinProcessor,
    TableSourceProcessor,
    WindowedAggregateProcessor,
)
from streamloop.processors.table_transform import ValueTransformerWithKeySupplier
from streamloop.serdes import LongSerde, Serde, as_serde
from streamloop.state.session_windows import SessionWindows
from streamloop.state.sliding_windows import SlidingWindows
from streamloop.state.stores import Materialized, StoreBuilder, StoreSupplier, StoreType, check_store_name
from streamloop.state.windows import TimeWindows
from streamloop.topology.cogroup import CogroupedKStream, cogroup
from streamloop.topology.emit_strategy import EmitStrategy, StrategyType, check_emit_strategy, final_table
from streamloop.topology.fk_join import foreign_key_join
from streamloop.topology.grouped_table import KGroupedTable, group_table
from streamloop.topology.patterns import refuse_join
from streamloop.topology.suppressed import Suppressed, suppress_table
from streamloop.topology.table_ops import filter_table, join_tables, map_table_values
from streamloop.topology.table_transform import transform_table_values
from streamloop.topology.windowed_streams import (
    ON_WINDOW_UPDATE,
    SessionWindowedKStream,
    SlidingWindowedKStream,
    windowed_stream,
)

if TYPE_CHECKING:
    from streamloop.topology.builder import KStream, StreamsBuilder



def _sync(fn: Any, what: str) -> None:
    if not callable(fn):
        raise TypeError(f"{what} needs a callable, got {fn!r}")
    if inspect.iscoroutinefunction(fn):
        raise TopologyError(f"{what} must be a plain function: a store update cannot wait (got async {fn!r})")


def _serde(value: Serde | type | None, what: str) -> Serde | None:
    return None if value is None else as_serde(value, what)


class KGroupedStream:
    """Records grouped by key, ready to aggregate (``count``, ``reduce``, ``aggregate``, ``windowed_by``)."""

    def __init__(self, builder: StreamsBuilder, node: str, key_serde: Serde | None,
                 value_serde: Serde | None) -> None:
        self._builder = builder
        self._node = node
        self._key_serde = key_serde
        self._value_serde = value_serde

    def count(self, *, materialized: Materialized | str | None = None, name: str | None = None) -> KTable:
        """The number of records per key (values are ignored)."""
        return self._aggregate("count", lambda: 0, lambda _k, _v, n: n + 1, materialized, name, LongSerde())

    def reduce(self, reducer: Callable[[Any, Any], Any], *, materialized: Materialized | str | None = None,
               name: str | None = None) -> KTable:
        """``reducer(aggregate, value)`` over each key's values; the first value starts it."""
        _sync(reducer, "reduce()")
        store = self._builder._store_name(materialized, "KSTREAM-REDUCE-STATE-STORE")
        return self._table(store, materialized, self._value_serde, lambda: ReduceProcessor(store, reducer),
                           "KSTREAM-REDUCE", name)

    def aggregate(self, initializer: Callable[[], Any], aggregator: Callable[[Any, Any, Any], Any], *,
                  materialized: Materialized | str | None = None, name: str | None = None) -> KTable:
        """``aggregator(key, value, aggregate)`` over each key's values, starting from ``initializer()``."""
        return self._aggregate("aggregate", initializer, aggregator, materialized, name, None)

    def cogroup(self, aggregator: Callable[[Any, Any, Any], Any]) -> CogroupedKStream:
        """Start aggregating this grouped stream together with others (``.cogroup(other, aggregator)``,
        then ``.aggregate(initializer)``) into one table, with one store (streamloop.topology.cogroup)."""
        return cogroup(self, aggregator, KTable)

    @overload
    def windowed_by(self, windows: TimeWindows) -> TimeWindowedKStream: ...
    @overload
    def windowed_by(self, windows: SessionWindows) -> SessionWindowedKStream: ...
    @overload
    def windowed_by(self, windows: SlidingWindows) -> SlidingWindowedKStream: ...

    def windowed_by(self, windows: TimeWindows | SessionWindows | SlidingWindows,
                    ) -> TimeWindowedKStream | SessionWindowedKStream | SlidingWindowedKStream:
        if isinstance(windows, (SessionWindows, SlidingWindows)):
            return windowed_stream(self, windows)
        if not isinstance(windows, TimeWindows):
            raise TopologyError(f"windowed_by() needs TimeWindows, SessionWindows or SlidingWindows, got {windows!r}")
        return TimeWindowedKStream(self, windows)

    def _aggregate(self, what: str, initializer: Callable[[], Any], aggregator: Callable[[Any, Any, Any], Any],
                   materialized: Materialized | str | None, name: str | None,
                   value_serde: Serde | None) -> KTable:
        _sync(initializer, f"{what}() initializer")
        _sync(aggregator, f"{what}() aggregator")
        store = self._builder._store_name(materialized, "KSTREAM-AGGREGATE-STATE-STORE")
        return self._table(store, materialized, value_serde,
                           lambda: AggregateProcessor(store, initializer, aggregator), "KSTREAM-AGGREGATE", name)

    def _table(self, store: str, materialized: Materialized | str | None, value_serde: Serde | None,
               supplier: Callable[[], Any], prefix: str, name: str | None,
               windows: TimeWindows | SessionWindows | SlidingWindows | None = None,
               store_supplier: Callable[[bool | None], StoreSupplier] | None = None) -> KTable:
        """``store_supplier(persistent)``: the store of windows other than ``TimeWindows``."""
        builder = self._builder
        spec = materialized if isinstance(materialized, Materialized) else Materialized(store)
        if store_supplier is not None:
            supplier_spec = store_supplier(spec.persistent)
        elif isinstance(windows, TimeWindows):
            supplier_spec = StoreSupplier(store, spec.persistent, StoreType.WINDOW, windows.retention_ms,
                                          windows.size_ms)
        else:
            supplier_spec = StoreSupplier(store, spec.persistent)
        store_builder = StoreBuilder(
            supplier_spec,
            _serde(spec.key_serde, f"key serde of store '{store}'") or self._key_serde,
            _serde(spec.value_serde, f"value serde of store '{store}'") or value_serde,
            caching=spec.caching, logging=spec.logging, ttl=spec.ttl)
        node = builder._name(name, prefix)
        builder._topology.add_processor(node, supplier, self._node)
        builder._topology.add_state_store(store_builder, node)
        if windows is not None:
            table = KTable(builder, node, store, None, store_builder.value_serde,
                           key_kind="Windowed (a windowed table's keys)")
            table._windows = windows
            return table
        return KTable(builder, node, store, store_builder.key_serde, store_builder.value_serde)


class TimeWindowedKStream:
    """A grouped stream cut into time windows; the table's keys are ``Windowed(key, start, end)``."""

    def __init__(self, grouped: KGroupedStream, windows: TimeWindows,
                 strategy: EmitStrategy = ON_WINDOW_UPDATE) -> None:
        self._grouped = grouped
        self._windows = windows
        self._strategy = strategy

    def emit_strategy(self, strategy: EmitStrategy) -> TimeWindowedKStream:
        """When the aggregation's results go downstream: ``EmitStrategy.on_window_update()`` (the
        default) or ``EmitStrategy.on_window_close()``, once per window when it closes."""
        return TimeWindowedKStream(self._grouped, self._windows, check_emit_strategy(strategy))

    def count(self, *, materialized: Materialized | str | None = None, name: str | None = None) -> KTable:
        return self._aggregate("count", lambda: 0, lambda _k, _v, n: n + 1, materialized, name, LongSerde())

    def aggregate(self, initializer: Callable[[], Any], aggregator: Callable[[Any, Any, Any], Any], *,
                  materialized: Materialized | str | None = None, name: str | None = None) -> KTable:
        return self._aggregate("aggregate", initializer, aggregator, materialized, name, None)

    def reduce(self, reducer: Callable[[Any, Any], Any], *, materialized: Materialized | str | None = None,
               name: str | None = None) -> KTable:
        _sync(reducer, "reduce()")
        return self._aggregate("reduce", lambda: None,
                               lambda _k, v, agg: v if agg is None else reducer(agg, v), materialized, name,
                               self._grouped._value_serde)

    def _aggregate(self, what: str, initializer: Callable[[], Any], aggregator: Callable[[Any, Any, Any], Any],
                   materialized: Materialized | str | None, name: str | None,
                   value_serde: Serde | None) -> KTable:
        _sync(initializer, f"{what}() initializer")
        _sync(aggregator, f"{what}() aggregator")
        grouped, windows = self._grouped, self._windows
        store = grouped._builder._store_name(materialized, "KSTREAM-AGGREGATE-STATE-STORE")
        if self._strategy.type is StrategyType.ON_WINDOW_CLOSE:
            # Each window's store entry keeps its largest record timestamp: what it goes out with.
            return final_table(
                grouped, windows, self._strategy, store, materialized, value_serde,
                lambda closing: FinalWindowAggregateProcessor(store, windows, initializer, aggregator, closing),
                "KSTREAM-AGGREGATE", name,
                lambda persistent: StoreSupplier(store, persistent, StoreType.WINDOW, windows.retention_ms,
                                                 windows.size_ms, timestamped=True))
        return grouped._table(
            store, materialized, value_serde,
            lambda: WindowedAggregateProcessor(store, windows, initializer, aggregator),
            "KSTREAM-AGGREGATE", name, windows)


class KTable:
    """A table: the latest value per key, kept in the store ``queryable_store_name`` (None for a
    filter, ``map_values`` or join that was not materialized)."""

    def __init__(self, builder: StreamsBuilder, node: str, store: str | None, key_serde: Serde | None = None,
                 value_serde: Serde | None = None, key_kind: str | None = None) -> None:
        self._builder = builder
        self._node = node
        self.queryable_store_name = store
        self._key_serde = key_serde
        self._value_serde = value_serde
        self._key_kind = key_kind  # as on KStream: known never to be bytes, with no serde known
        # How a join reads this table by key (None: it cannot, as a windowed table), and the nodes
        # that forward its updates, to switch to sending old values (streamloop.topology.table_ops).
        self._view: TableView | None = TableView.of_store(store) if store is not None and key_kind is None else None
        self._change_nodes: tuple[str, ...] = (node,)

    # -- the table's own operations (bodies in streamloop.topology.table_ops / grouped_table) -----
    def filter(self, predicate: Callable[[Any, Any], Any], *, materialized: Materialized | str | None = None,
               name: str | None = None) -> KTable:
        """The rows for which ``predicate(key, value)`` is true; a row that stops passing is deleted."""
        return filter_table(self, predicate, False, materialized, name)

    def filter_not(self, predicate: Callable[[Any, Any], Any], *,
                   materialized: Materialized | str | None = None, name: str | None = None) -> KTable:
        """The rows for which ``predicate(key, value)`` is false."""
        return filter_table(self, predicate, True, materialized, name)

    def map_values(self, mapper: Callable[[Any], Any], *, materialized: Materialized | str | None = None,
                   name: str | None = None) -> KTable:
        """Each row's value replaced by ``mapper(value)``; deletes stay deletes."""
        return map_table_values(self, mapper, materialized, name)

    def transform_values(self, supplier: ValueTransformerWithKeySupplier, *,
                         materialized: Materialized | str | None = None, stores: Sequence[str] = (),
                         name: str | None = None) -> KTable:
        """Each row's value replaced by ``transform(key, value)`` of a ``ValueTransformerWithKey``
        that ``supplier()`` makes per task (deletes too: ``transform(key, None)``); ``stores`` names
        the state stores it uses (streamloop.processors.table_transform)."""
        return transform_table_values(self, supplier, materialized, stores, name)

    def group_by(self, selector: Callable[[Any, Any], Any], *, key_serde: Serde | type | None = None,
                 value_serde: Serde | type | None = None, name: str | None = None) -> KGroupedTable:
        """Rows regrouped by ``selector(key, value) -> (new_key, new_value)``, through a repartition topic."""
        return group_table(self, selector, key_serde, value_serde, name)

    @overload
    def join(self, other: KTable, joiner: Callable[[Any, Any], Any], *,
             materialized: Materialized | str | None = None, name: str | None = None) -> KTable: ...
    @overload
    def join(self, other: KTable, foreign_key_extractor: Callable[[Any], Any], joiner: Callable[[Any, Any], Any],
             *, materialized: Materialized | str | None = None, name: str | None = None) -> KTable: ...
    @overload
    def join(self, other: KTable, *, foreign_key_from_key_and_value: Callable[[Any, Any], Any],
             joiner: Callable[[Any, Any], Any], materialized: Materialized | str | None = None,
             name: str | None = None) -> KTable: ...

    def join(self, other: KTable, *functions: Callable[..., Any], joiner: Callable[..., Any] | None = None,
             foreign_key_extractor: Callable[[Any], Any] | None = None,
             foreign_key_from_key_and_value: Callable[[Any, Any], Any] | None = None,
             materialized: Materialized | str | None = None, name: str | None = None) -> KTable:
        """``joiner(value, other_value)`` for the keys both tables have (inputs co-partitioned).

        With ``foreign_key_extractor, joiner``: each row joined with ``other``'s row whose key is
        ``foreign_key_extractor(value)`` (a foreign-key join, streamloop.topology.fk_join; the inputs
        need not be co-partitioned). ``foreign_key_from_key_and_value=`` instead takes the row's key
        too: ``(key, value) -> foreign key`` (Kafka Streams 4.0's ``BiFunction`` extractor)."""
        by_value, joiner = _join_functions(functions, foreign_key_extractor, foreign_key_from_key_and_value,
                                           joiner, "join()")
        if by_value is not None or foreign_key_from_key_and_value is not None:
            return foreign_key_join(self, other, by_value, foreign_key_from_key_and_value, joiner, False,
                                    materialized, name)
        return join_tables(self, other, joiner, "inner", materialized, name)

    @overload
    def left_join(self, other: KTable, joiner: Callable[[Any, Any], Any], *,
                  materialized: Materialized | str | None = None, name: str | None = None) -> KTable: ...
    @overload
    def left_join(self, other: KTable, foreign_key_extractor: Callable[[Any], Any],
                  joiner: Callable[[Any, Any], Any], *, materialized: Materialized | str | None = None,
                  name: str | None = None) -> KTable: ...
    @overload
    def left_join(self, other: KTable, *, foreign_key_from_key_and_value: Callable[[Any, Any], Any],
                  joiner: Callable[[Any, Any], Any], materialized: Materialized | str | None = None,
                  name: str | None = None) -> KTable: ...

    def left_join(self, other: KTable, *functions: Callable[..., Any], joiner: Callable[..., Any] | None = None,
                  foreign_key_extractor: Callable[[Any], Any] | None = None,
                  foreign_key_from_key_and_value: Callable[[Any, Any], Any] | None = None,
                  materialized: Materialized | str | None = None, name: str | None = None) -> KTable:
        """As ``join``, for every key of this table (``other_value`` None where ``other`` lacks it)."""
        by_value, joiner = _join_functions(functions, foreign_key_extractor, foreign_key_from_key_and_value,
                                           joiner, "left_join()")
        if by_value is not None or foreign_key_from_key_and_value is not None:
            return foreign_key_join(self, other, by_value, foreign_key_from_key_and_value, joiner, True,
                                    materialized, name)
        return join_tables(self, other, joiner, "left", materialized, name)

    def outer_join(self, other: KTable, joiner: Callable[[Any, Any], Any], *,
                   materialized: Materialized | str | None = None, name: str | None = None) -> KTable:
        """As ``join``, for every key of either table (None for the side that lacks it)."""
        return join_tables(self, other, joiner, "outer", materialized, name)

    # The windows of a windowed aggregation's table (``suppress`` closes windows by their grace).
    _windows: TimeWindows | SessionWindows | SlidingWindows | None = None

    def suppress(self, suppressed: Suppressed, *, name: str | None = None) -> KTable:
        """Hold the table's updates back (``Suppressed.until_window_closes``/``until_time_limit``)."""
        return suppress_table(self, suppressed, name)

    def to_stream(self, *, name: str | None = None) -> KStream:
        """The table's updates as a stream (coalesced per key while the record cache holds them)."""
        node = self._builder._name(name, "KTABLE-TOSTREAM")
        self._builder._add_pass_through(node, self._node)
        return self._builder._stream_at(node, key_serde=self._key_serde, value_serde=self._value_serde,
                                        key_kind=self._key_kind)


def _join_functions(functions: tuple[Callable[..., Any], ...], extractor: Callable[[Any], Any] | None,
                    key_value_extractor: Callable[[Any, Any], Any] | None, joiner: Callable[..., Any] | None,
                    what: str) -> tuple[Callable[[Any], Any] | None, Any]:
    """(foreign_key_extractor or None, joiner) from a table join's arguments: ``joiner`` alone (by
    key, or by foreign key with ``foreign_key_from_key_and_value``), or ``foreign_key_extractor,
    joiner`` (by foreign key), positional or by keyword. Given both extractors, the extractor is
    returned too: ``foreign_key_join`` refuses the pair."""
    given = list(functions)
    if extractor is not None:
        given.insert(0, extractor)
    if joiner is not None:
        given.append(joiner)
    if len(given) == 1 and extractor is None:
        return None, given[0]
    if len(given) == 2:
        return given[0], given[1]
    count = len(given) + (key_value_extractor is not None)
    raise TypeError(f"{what} takes a table and a joiner, or a table, a foreign_key_extractor and a joiner, or a "
                    f"table, foreign_key_from_key_and_value= and a joiner; got {count} functions")


def table_source(builder: StreamsBuilder, source: str, materialized: Materialized | str | None,
                 key_serde: Serde | None, value_serde: Serde | None) -> KTable:
    store = builder._store_name(materialized, f"{source}-STATE-STORE")
    spec = materialized if isinstance(materialized, Materialized) else Materialized(store)
    node = builder._name(None, "KTABLE-SOURCE")
    builder._topology.add_processor(node, lambda: TableSourceProcessor(store), source)
    builder._topology.add_state_store(StoreBuilder(
        StoreSupplier(store, spec.persistent),
        _serde(spec.key_serde, f"key serde of store '{store}'") or key_serde,
        _serde(spec.value_serde, f"value serde of store '{store}'") or value_serde,
        caching=spec.caching, logging=spec.logging, ttl=spec.ttl), node)
    return KTable(builder, node, store, key_serde, value_serde)


def stream_to_table(stream: KStream, materialized: Materialized | str | None, name: str | None) -> KTable:
    """``KStream.to_table``: a table source fed by the stream (Kafka Streams' ``KSTREAM-TOTABLE``)."""
    spec = materialized if isinstance(materialized, Materialized) else None
    # The Materialized's serdes, else the stream's: for the store, and (as Kafka Streams) the
    # repartition topic a key-changed stream goes through first.
    ks = (None if spec is None else _serde(spec.key_serde, "key serde of to_table()")) or stream._key_serde
    vs = (None if spec is None else _serde(spec.value_serde, "value serde of to_table()")) or stream._value_serde
    if stream._key_changed:
        stream = stream._repartition(ks, vs, (ks is stream._key_serde and ks is not None,
                                              vs is stream._value_serde and vs is not None), None)
    builder = stream._builder
    node = builder._name(name, "KSTREAM-TOTABLE")
    store = builder._store_name(materialized, "KSTREAM-TOTABLE-STATE-STORE")
    options = spec or Materialized(store)
    builder._topology.add_processor(node, lambda: TableSourceProcessor(store), stream._node)
    store_builder = StoreBuilder(StoreSupplier(store, options.persistent), ks, vs, caching=options.caching,
                                 logging=options.logging)
    builder._topology.add_state_store(store_builder, node)
    return KTable(builder, node, store, ks, vs, key_kind=stream._key_kind)


def stream_table_join(stream: KStream, table: KTable, joiner: Callable[[Any, Any], Any], left: bool,
                      name: str | None) -> KStream:
    _sync(joiner, "join()")
    if not isinstance(table, KTable):
        raise TopologyError(f"join() needs a KTable, got {table!r}")
    if stream._key_changed:
        # The table's records of a key are in the task of the key's partition: bring the
        # stream's records there too, as Kafka Streams does before a join.
        stream = stream._repartition(stream._key_serde, stream._value_serde,
                                     (stream._key_serde is not None, stream._value_serde is not None), None)
    builder = stream._builder
    refuse_join(builder._topology, "left_join()" if left else "join()", stream._node)
    node = builder._name(name, "KSTREAM-LEFTJOIN" if left else "KSTREAM-JOIN")
    store, view = table.queryable_store_name, None
    if store is None:
        # A filter, map_values or join without a store: read through its parents', applied on the fly.
        view = table._view
        if view is None:
            raise TopologyError(f"join() needs a key-value table; '{table._node}' has no store to read")
        store = view.stores[0]
    stores = [store] if view is None else list(view.stores)
    builder._topology.add_processor(node, lambda: StreamTableJoinProcessor(store, joiner, left, view),
                                    stream._node, stores=stores)
    return builder._stream_at(node, stream._key_changed, stream._key_serde, key_kind=stream._key_kind)


def store_name_from(materialized: Materialized | str | None) -> str | None:
    if materialized is None:
        return None
    if isinstance(materialized, str):
        return check_store_name(materialized)
    if isinstance(materialized, Materialized):
        return None if materialized.name is None else check_store_name(materialized.name)
    raise TopologyError(f"materialized must be a store name or a Materialized, got {materialized!r}")
