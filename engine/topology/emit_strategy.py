"""When a windowed aggregation sends its results downstream: ``windowed_by(...).emit_strategy(...)``.

Kafka Streams' ``EmitStrategy`` (KIP-825), for every kind of window: ``on_window_update()`` (the default)
sends every update of a window (coalesced by the cache, if any);
``on_window_close()`` sends each window once, with its final value, when stream
time passes its end plus the grace period, with no suppression buffer.
``on_window_close().with_wall_clock_close(idle_ms)`` also closes windows on the
wall clock once no record arrived for ``idle_ms`` (see
``streamloop.processors.window_close``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from streamloop.errors import TopologyError
from streamloop.processors.window_close import CloseTime, WallClockClose, close_time_store
from streamloop.serdes import BytesSerde, Serde
from streamloop.state.session_windows import SessionWindows
from streamloop.state.sliding_windows import SlidingWindows
from streamloop.state.stores import Materialized, StoreBuilder, StoreSupplier
from streamloop.state.windows import TimeWindows

if TYPE_CHECKING:
    from streamloop.topology.tables import KGroupedStream, KTable


class StrategyType(Enum):
    ON_WINDOW_UPDATE = "on_window_update"
    ON_WINDOW_CLOSE = "on_window_close"


@dataclass(frozen=True)
class EmitStrategy:
    type: StrategyType
    wall_clock: WallClockClose | None = None

    @classmethod
    def on_window_update(cls) -> EmitStrategy:
        """Every update of a window goes downstream (coalesced per key by the cache, if any)."""
        return cls(StrategyType.ON_WINDOW_UPDATE)

    @classmethod
    def on_window_close(cls) -> EmitStrategy:
        """Each window goes downstream once, with its final value, when it closes."""
        return cls(StrategyType.ON_WINDOW_CLOSE)

    def with_wall_clock_close(self, idle_ms: int, check_interval_ms: int | None = None) -> EmitStrategy:
        """Also close windows whose end plus grace has passed on the wall clock, once no record
        reached the aggregation (in a task) for ``idle_ms``; checked every ``check_interval_ms``
        (default: a quarter of ``idle_ms``, at most a second)."""
        if self.type is not StrategyType.ON_WINDOW_CLOSE:
            raise TopologyError("with_wall_clock_close() needs EmitStrategy.on_window_close(): an "
                                "aggregation that emits on every update has no final result to emit")
        return EmitStrategy(self.type, WallClockClose.after_idle(idle_ms, check_interval_ms))


def check_emit_strategy(strategy: object) -> EmitStrategy:
    if not isinstance(strategy, EmitStrategy):
        raise TopologyError(f"emit_strategy() needs an EmitStrategy (EmitStrategy.on_window_close() or "
                            f".on_window_update()), got {strategy!r}")
    return strategy


def final_table(grouped: KGroupedStream, windows: TimeWindows | SlidingWindows | SessionWindows,
                strategy: EmitStrategy, store: str, materialized: Materialized | str | None,
                value_serde: Serde | None, processor: Callable[[CloseTime], Any], prefix: str, name: str | None,
                store_supplier: Callable[[bool | None], StoreSupplier]) -> KTable:
    """The table of a windowed aggregation that emits on window close: ``processor(close_time)`` over
    the window store of ``store_supplier`` and a second store, with a changelog, holding the close
    time of its last emission."""
    closes = close_time_store(store)
    wall = strategy.wall_clock
    table = grouped._table(store, materialized, value_serde, lambda: processor(CloseTime(closes, wall)), prefix,
                           name, windows, store_supplier)
    grouped._builder._topology.add_state_store(
        StoreBuilder(StoreSupplier(closes, False), BytesSerde(), BytesSerde()), table._node)
    return table
