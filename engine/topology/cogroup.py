"""``KGroupedStream.cogroup(aggregator)``: several grouped streams aggregated into one table
(Kafka Streams' CogroupedKStream, KIP-150).

Each grouped stream brings its own aggregator; all of them update one aggregate per key,
which starts from the one ``initializer()`` given to ``aggregate``. As in Kafka Streams the
result has ONE store (and so one changelog): every input gets an aggregate processor
(``COGROUPKSTREAM-AGGREGATE-…``, or ``<name>-cogroup-agg-<i>``) connected to that store, and
their updates meet in a pass-through ``COGROUPKSTREAM-MERGE-…`` (``<name>-cogroup-merge``), the
table's node. A grouped stream whose key changed before grouping was already repartitioned by
``group_by``/``group_by_key``; the inputs are one co-partition group, so the client refuses to
start when their topics differ in partition counts (and sizes their repartition topics alike).

With ``windowed_by(TimeWindows | SlidingWindows | SessionWindows)`` the shared store is a window
(or session) store and every input's records update the windows they fall in (the sessions they
join); all inputs share one stream time, so a window that one input's records closed is closed
for the others too (Kafka Streams' per-input processors each keep their own stream time, so a
window closed by one input there still takes another input's late record).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, overload

from streamloop.errors import TopologyError
from streamloop.processors.builtin import PeekNode
from streamloop.processors.cogroup import (
    CogroupedSessionAggregateProcessor,
    CogroupedSlidingAggregateProcessor,
    CogroupedWindowAggregateProcessor,
)
from streamloop.processors.stateful import AggregateProcessor
from streamloop.serdes import Serde, as_serde
from streamloop.state.session_windows import SessionWindows
from streamloop.state.sliding_windows import SlidingWindows
from streamloop.state.stores import Materialized, StoreBuilder, StoreSupplier, StoreType
from streamloop.state.windows import TimeWindows
from streamloop.topology.copartition import add_copartition_group
from streamloop.topology.table_ops import plain_function

if TYPE_CHECKING:
    from streamloop.topology.tables import KGroupedStream, KTable

Aggregator = Callable[[Any, Any, Any], Any]


def cogroup(grouped: KGroupedStream, aggregator: Aggregator, table_class: type[KTable]) -> CogroupedKStream:
    """``table_class``: KTable (streamloop.topology.tables imports this module)."""
    plain_function(aggregator, "cogroup() aggregator")
    return CogroupedKStream(((grouped, aggregator),), table_class)


class CogroupedKStream:
    """Grouped streams to aggregate together: add more with ``cogroup``, finish with ``aggregate``
    (or ``windowed_by(TimeWindows).aggregate``). Each call returns a new ``CogroupedKStream``."""

    def __init__(self, inputs: tuple[tuple[KGroupedStream, Aggregator], ...], table_class: type[KTable]) -> None:
        self._inputs = inputs
        self._table_class = table_class

    def cogroup(self, grouped: KGroupedStream, aggregator: Aggregator) -> CogroupedKStream:
        """Add ``grouped``, aggregated with ``aggregator(key, value, aggregate)``.

        Unlike Kafka Streams, which keeps the last aggregator given for a grouped stream, adding
        one grouped stream twice raises ``TopologyError``: its records would be aggregated once.
        """
        first = self._inputs[0][0]
        if not isinstance(grouped, type(first)):
            raise TopologyError(f"cogroup() needs a KGroupedStream (from group_by/group_by_key), got {grouped!r}")
        if grouped._builder is not first._builder:
            raise TopologyError("cogroup(): every grouped stream must come from the same StreamsBuilder")
        if any(existing is grouped for existing, _ in self._inputs):
            raise TopologyError(f"cogroup(): the grouped stream after '{grouped._node}' is in this cogroup already; "
                                "give each grouped stream one aggregator")
        plain_function(aggregator, "cogroup() aggregator")
        return CogroupedKStream((*self._inputs, (grouped, aggregator)), self._table_class)

    @overload
    def windowed_by(self, windows: TimeWindows | SlidingWindows) -> TimeWindowedCogroupedKStream: ...
    @overload
    def windowed_by(self, windows: SessionWindows) -> SessionWindowedCogroupedKStream: ...

    def windowed_by(self, windows: TimeWindows | SlidingWindows | SessionWindows,
                    ) -> TimeWindowedCogroupedKStream | SessionWindowedCogroupedKStream:
        """The cogrouped streams cut into time, sliding or session windows; the table's keys are
        ``Windowed(key, start, end)``."""
        if isinstance(windows, SessionWindows):
            return SessionWindowedCogroupedKStream(self._inputs, windows, self._table_class)
        if not isinstance(windows, (TimeWindows, SlidingWindows)):
            raise TopologyError("CogroupedKStream.windowed_by() needs TimeWindows, SlidingWindows or SessionWindows, "
                                f"got {windows!r}")
        return TimeWindowedCogroupedKStream(self._inputs, windows, self._table_class)

    def aggregate(self, initializer: Callable[[], Any], *, materialized: Materialized | str | None = None,
                  name: str | None = None) -> KTable:
        """One aggregate per key over all the grouped streams: a record of any of them updates it
        with its stream's aggregator; a key's first record starts from ``initializer()``. Records
        without a key or a value are dropped (and counted), as in every aggregation."""
        plain_function(initializer, "cogroup aggregate() initializer")
        aggregators = [aggregator for _, aggregator in self._inputs]

        def processors(store: str) -> list[Callable[[], Any]]:
            return [_supplier(AggregateProcessor, store, initializer, a) for a in aggregators]
        return _build(self._table_class, self._inputs, materialized, name, processors, None,
                      lambda store, persistent: StoreSupplier(store, persistent))


class TimeWindowedCogroupedKStream:
    """Cogrouped streams in time or sliding windows (Kafka Streams' TimeWindowedCogroupedKStream)."""

    def __init__(self, inputs: tuple[tuple[KGroupedStream, Aggregator], ...],
                 windows: TimeWindows | SlidingWindows, table_class: type[KTable]) -> None:
        self._inputs = inputs
        self._windows = windows
        self._table_class = table_class

    def aggregate(self, initializer: Callable[[], Any], *, materialized: Materialized | str | None = None,
                  name: str | None = None) -> KTable:
        """As ``CogroupedKStream.aggregate``, per window: a record updates every window it falls in
        that its grace period has not closed (late records are dropped and counted)."""
        plain_function(initializer, "cogroup aggregate() initializer")
        windows = self._windows
        aggregators = [aggregator for _, aggregator in self._inputs]

        if isinstance(windows, SlidingWindows):
            sliding = windows

            def processors(store: str) -> list[Callable[[], Any]]:
                return [_supplier(CogroupedSlidingAggregateProcessor, store, sliding, initializer, a)
                        for a in aggregators]
            return _build(self._table_class, self._inputs, materialized, name, processors, windows,
                          lambda store, persistent: StoreSupplier(store, persistent, StoreType.WINDOW,
                                                                  sliding.retention_ms, sliding.time_difference_ms,
                                                                  timestamped=True))
        timed = windows

        def time_processors(store: str) -> list[Callable[[], Any]]:
            return [_supplier(CogroupedWindowAggregateProcessor, store, timed, initializer, a) for a in aggregators]
        return _build(self._table_class, self._inputs, materialized, name, time_processors, windows,
                      lambda store, persistent: StoreSupplier(store, persistent, StoreType.WINDOW,
                                                              timed.retention_ms, timed.size_ms))


class SessionWindowedCogroupedKStream:
    """Cogrouped streams in session windows (Kafka Streams' SessionWindowedCogroupedKStream)."""

    def __init__(self, inputs: tuple[tuple[KGroupedStream, Aggregator], ...], windows: SessionWindows,
                 table_class: type[KTable]) -> None:
        self._inputs = inputs
        self._windows = windows
        self._table_class = table_class

    def aggregate(self, initializer: Callable[[], Any], merger: Aggregator, *,
                  materialized: Materialized | str | None = None, name: str | None = None) -> KTable:
        """As ``CogroupedKStream.aggregate``, per session: a record of any input joins (or starts)
        its key's session, ``merger(key, aggregate1, aggregate2)`` combining the sessions it joins;
        a record for a session closed by stream time (gap plus grace) is dropped."""
        plain_function(initializer, "cogroup aggregate() initializer")
        plain_function(merger, "cogroup aggregate() merger")
        windows = self._windows
        aggregators = [aggregator for _, aggregator in self._inputs]

        def processors(store: str) -> list[Callable[[], Any]]:
            return [_supplier(CogroupedSessionAggregateProcessor, store, windows, initializer, a, merger)
                    for a in aggregators]
        return _build(self._table_class, self._inputs, materialized, name, processors, windows,
                      lambda store, persistent: StoreSupplier(store, persistent, StoreType.SESSION,
                                                              windows.retention_ms))


def _build(table_class: type[KTable], inputs: tuple[tuple[KGroupedStream, Aggregator], ...],
           materialized: Materialized | str | None,
           name: str | None, processors: Callable[[str], list[Callable[[], Any]]],
           windows: TimeWindows | SlidingWindows | SessionWindows | None,
           store_supplier: Callable[[str, bool | None], StoreSupplier]) -> KTable:
    first = inputs[0][0]
    builder = first._builder
    topology = builder._topology
    store = builder._store_name(materialized, "COGROUPKSTREAM-AGGREGATE-STATE-STORE")
    spec = materialized if isinstance(materialized, Materialized) else Materialized(store)
    key_serde = _key_serde(inputs)
    store_builder = StoreBuilder(
        store_supplier(store, spec.persistent),
        (None if spec.key_serde is None else as_serde(spec.key_serde, f"key serde of store '{store}'")) or key_serde,
        None if spec.value_serde is None else as_serde(spec.value_serde, f"value serde of store '{store}'"),
        caching=spec.caching, logging=spec.logging)
    agg_nodes = []
    for index, ((grouped, _aggregator), supplier_of) in enumerate(zip(inputs, processors(store), strict=True)):
        node = f"{name}-cogroup-agg-{index}" if name is not None else builder._name(None, "COGROUPKSTREAM-AGGREGATE")
        topology.add_processor(node, supplier_of, grouped._node)
        agg_nodes.append(node)
    topology.add_state_store(store_builder, *agg_nodes)
    merge = f"{name}-cogroup-merge" if name is not None else builder._name(None, "COGROUPKSTREAM-MERGE")
    topology.add_node(merge, lambda: PeekNode(merge, _ignore), *agg_nodes)
    if len(agg_nodes) > 1:
        add_copartition_group(topology, "cogroup()", tuple(agg_nodes))
    if windows is not None:
        table = table_class(builder, merge, store, None, store_builder.value_serde,
                            key_kind="Windowed (a windowed table's keys)")
        table._windows = windows
    else:
        table = table_class(builder, merge, store, store_builder.key_serde, store_builder.value_serde)
    # The aggregate processors forward the table's updates (the merge only passes them on).
    table._change_nodes = tuple(agg_nodes)
    return table


def _supplier(kind: Callable[..., Any], *args: Any) -> Callable[[], Any]:
    """A processor supplier: ``kind(*args)``, a new processor per task."""
    return lambda: kind(*args)


def _key_serde(inputs: tuple[tuple[KGroupedStream, Aggregator], ...]) -> Serde | None:
    """The key serde the grouped streams know (the first that knows one)."""
    for grouped, _ in inputs:
        if grouped._key_serde is not None:
            return grouped._key_serde
    return None


def _ignore(_key: Any, _value: Any) -> None:
    return None
