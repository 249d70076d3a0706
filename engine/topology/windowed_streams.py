"""Grouped streams cut into session or sliding windows: ``group_by_key().windowed_by(...)``.

Their tables' keys are ``Windowed(key, start, end)``: for sessions the first and
last record timestamps (both inclusive), for sliding windows ``[start, start + diff]``.
The stores are changelogged like the other windowed stores (compacted and deleted
after the retention), so the tables survive restarts and moved tasks.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from streamloop.errors import TopologyError
from streamloop.processors.emit_final import FinalSessionWindowAggregateProcessor, FinalSlidingWindowAggregateProcessor
from streamloop.processors.session_aggregate import SessionWindowAggregateProcessor
from streamloop.processors.sliding_aggregate import SlidingWindowAggregateProcessor
from streamloop.serdes import LongSerde, Serde
from streamloop.state.session_windows import SessionWindows
from streamloop.state.sliding_windows import SlidingWindows
from streamloop.state.stores import Materialized, StoreSupplier, StoreType
from streamloop.topology.emit_strategy import EmitStrategy, StrategyType, check_emit_strategy, final_table

if TYPE_CHECKING:
    from streamloop.topology.tables import KGroupedStream, KTable

Aggregator = Callable[[Any, Any, Any], Any]
ON_WINDOW_UPDATE = EmitStrategy.on_window_update()


def _sync(fn: Any, what: str) -> None:
    if not callable(fn):
        raise TypeError(f"{what} needs a callable, got {fn!r}")
    if inspect.iscoroutinefunction(fn):
        raise TopologyError(f"{what} must be a plain function: a store update cannot wait (got async {fn!r})")


def _count(_key: Any, _value: Any, n: int) -> int:
    return n + 1


def windowed_stream(grouped: KGroupedStream,
                    windows: SessionWindows | SlidingWindows) -> SessionWindowedKStream | SlidingWindowedKStream:
    if isinstance(windows, SessionWindows):
        return SessionWindowedKStream(grouped, windows)
    return SlidingWindowedKStream(grouped, windows)


class SessionWindowedKStream:
    """A grouped stream cut into sessions (Kafka Streams' ``SessionWindowedKStream``)."""

    def __init__(self, grouped: KGroupedStream, windows: SessionWindows,
                 strategy: EmitStrategy = ON_WINDOW_UPDATE) -> None:
        self._grouped = grouped
        self._windows = windows
        self._strategy = strategy

    def emit_strategy(self, strategy: EmitStrategy) -> SessionWindowedKStream:
        """When the aggregation's results go downstream: ``EmitStrategy.on_window_update()`` (the
        default: every update, and a tombstone for each merged session) or
        ``EmitStrategy.on_window_close()``, once per session when it closes."""
        return SessionWindowedKStream(self._grouped, self._windows, check_emit_strategy(strategy))

    def count(self, *, materialized: Materialized | str | None = None, name: str | None = None) -> KTable:
        """Records per session; merged sessions add their counts."""
        return self._aggregate("count", lambda: 0, _count, lambda _k, a, b: a + b, materialized, name,
                               LongSerde())

    def aggregate(self, initializer: Callable[[], Any], aggregator: Aggregator, merger: Aggregator, *,
                  materialized: Materialized | str | None = None, name: str | None = None) -> KTable:
        """``aggregator(key, value, aggregate)`` per session from ``initializer()``; when a record
        joins sessions, ``merger(key, aggregate1, aggregate2)`` combines theirs."""
        return self._aggregate("aggregate", initializer, aggregator, merger, materialized, name, None)

    def reduce(self, reducer: Callable[[Any, Any], Any], *, materialized: Materialized | str | None = None,
               name: str | None = None) -> KTable:
        """``reducer(aggregate, value)`` per session; merged sessions are reduced together too."""
        _sync(reducer, "reduce()")
        return self._aggregate("reduce", lambda: None,
                               lambda _k, v, agg: v if agg is None else reducer(agg, v),
                               lambda _k, one, two: two if one is None else reducer(one, two),
                               materialized, name, self._grouped._value_serde)

    def _aggregate(self, what: str, initializer: Callable[[], Any], aggregator: Aggregator, merger: Aggregator,
                   materialized: Materialized | str | None, name: str | None, value_serde: Serde | None) -> KTable:
        for fn, role in ((initializer, "initializer"), (aggregator, "aggregator"), (merger, "merger")):
            _sync(fn, f"{what}() {role}")
        grouped, windows = self._grouped, self._windows
        store = grouped._builder._store_name(materialized, "KSTREAM-AGGREGATE-STATE-STORE")

        def session_store(persistent: bool | None) -> StoreSupplier:
            return StoreSupplier(store, persistent, StoreType.SESSION, windows.retention_ms)
        if self._strategy.type is StrategyType.ON_WINDOW_CLOSE:
            return final_table(
                grouped, windows, self._strategy, store, materialized, value_serde,
                lambda closing: FinalSessionWindowAggregateProcessor(store, windows, initializer, aggregator,
                                                                     merger, closing),
                "KSTREAM-SESSION-AGGREGATE", name, session_store)
        return grouped._table(
            store, materialized, value_serde,
            lambda: SessionWindowAggregateProcessor(store, windows, initializer, aggregator, merger),
            "KSTREAM-SESSION-AGGREGATE", name, windows, session_store)


class SlidingWindowedKStream:
    """A grouped stream aggregated over sliding windows (Kafka Streams' ``TimeWindowedKStream`` of
    ``SlidingWindows``)."""

    def __init__(self, grouped: KGroupedStream, windows: SlidingWindows,
                 strategy: EmitStrategy = ON_WINDOW_UPDATE) -> None:
        self._grouped = grouped
        self._windows = windows
        self._strategy = strategy

    def emit_strategy(self, strategy: EmitStrategy) -> SlidingWindowedKStream:
        """When the aggregation's results go downstream: ``EmitStrategy.on_window_update()`` (the
        default) or ``EmitStrategy.on_window_close()``, once per window when it closes."""
        return SlidingWindowedKStream(self._grouped, self._windows, check_emit_strategy(strategy))

    def count(self, *, materialized: Materialized | str | None = None, name: str | None = None) -> KTable:
        return self._aggregate("count", lambda: 0, _count, materialized, name, LongSerde())

    def aggregate(self, initializer: Callable[[], Any], aggregator: Aggregator, *,
                  materialized: Materialized | str | None = None, name: str | None = None) -> KTable:
        return self._aggregate("aggregate", initializer, aggregator, materialized, name, None)

    def reduce(self, reducer: Callable[[Any, Any], Any], *, materialized: Materialized | str | None = None,
               name: str | None = None) -> KTable:
        _sync(reducer, "reduce()")
        return self._aggregate("reduce", lambda: None, lambda _k, v, agg: v if agg is None else reducer(agg, v),
                               materialized, name, self._grouped._value_serde)

    def _aggregate(self, what: str, initializer: Callable[[], Any], aggregator: Aggregator,
                   materialized: Materialized | str | None, name: str | None, value_serde: Serde | None) -> KTable:
        _sync(initializer, f"{what}() initializer")
        _sync(aggregator, f"{what}() aggregator")
        grouped, windows = self._grouped, self._windows
        store = grouped._builder._store_name(materialized, "KSTREAM-AGGREGATE-STATE-STORE")

        def sliding_store(persistent: bool | None) -> StoreSupplier:
            return StoreSupplier(store, persistent, StoreType.WINDOW, windows.retention_ms,
                                 windows.time_difference_ms, timestamped=True)
        if self._strategy.type is StrategyType.ON_WINDOW_CLOSE:
            return final_table(
                grouped, windows, self._strategy, store, materialized, value_serde,
                lambda closing: FinalSlidingWindowAggregateProcessor(store, windows, initializer, aggregator,
                                                                     closing),
                "KSTREAM-SLIDINGWINDOWAGGREGATE", name, sliding_store)
        return grouped._table(
            store, materialized, value_serde,
            lambda: SlidingWindowAggregateProcessor(store, windows, initializer, aggregator),
            "KSTREAM-SLIDINGWINDOWAGGREGATE", name, windows, sliding_store)
