"""``KTable.suppress``: hold a table's updates back and emit only the latest per key, later.

``Suppressed.until_window_closes(BufferConfig.unbounded())`` on a windowed table
emits each window once, with its final value, when stream time passes its end
plus the grace period (for sessions: plus the inactivity gap), as Kafka Streams
does; ``.with_wall_clock_close(idle_ms)`` also closes windows on the wall clock
once the input went quiet (``streamloop.processors.window_close``).
``Suppressed.until_time_limit(ms, buffer)`` emits a key's latest value once
stream time is ``ms`` past its first buffered update. The buffer is a store with
a changelog, so what it holds survives a restart or a moved task.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from streamloop.errors import TopologyError
from streamloop.processors.api import ProcessorContext
from streamloop.processors.change import Getter, TableView, derived_getter
from streamloop.processors.suppress import SuppressProcessor, prior_value
from streamloop.processors.window_close import CloseTime, WallClockClose, close_time_store
from streamloop.serdes import BytesSerde
from streamloop.state.session_windows import SessionWindows
from streamloop.state.sliding_windows import SlidingWindows
from streamloop.state.stores import StoreBuilder, StoreSupplier, check_store_name
from streamloop.state.windows import TimeWindows
from streamloop.topology.table_ops import send_old_values

if TYPE_CHECKING:
    from streamloop.topology.tables import KTable


def _limit(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise TopologyError(f"{what} must be an int > 0, got {value!r}")
    return value


@dataclass(frozen=True)
class BufferConfig:
    """How much a suppression buffer may hold, and what happens when it is full: emit the oldest
    entries early, or stop the application (``shut_down_when_full``)."""

    records_limit: int | None = None
    bytes_limit: int | None = None
    shut_down: bool = False

    @classmethod
    def unbounded(cls) -> BufferConfig:
        return cls(None, None, True)

    @classmethod
    def max_records(cls, records: int) -> BufferConfig:
        return cls(_limit(records, "BufferConfig.max_records"), None, False)

    @classmethod
    def max_bytes(cls, size: int) -> BufferConfig:
        return cls(None, _limit(size, "BufferConfig.max_bytes"), False)

    def with_max_records(self, records: int) -> BufferConfig:
        return replace(self, records_limit=_limit(records, "BufferConfig.with_max_records"))

    def with_max_bytes(self, size: int) -> BufferConfig:
        return replace(self, bytes_limit=_limit(size, "BufferConfig.with_max_bytes"))

    def emit_early_when_full(self) -> BufferConfig:
        return replace(self, shut_down=False)

    def shut_down_when_full(self) -> BufferConfig:
        return replace(self, shut_down=True)

    @property
    def strict(self) -> bool:
        """Never emits early: what a final result needs."""
        return self.shut_down or (self.records_limit is None and self.bytes_limit is None)


def unbounded() -> BufferConfig:
    return BufferConfig.unbounded()


@dataclass(frozen=True)
class Suppressed:
    final_results: bool
    time_limit_ms: int
    buffer: BufferConfig
    name: str | None = None
    wall_clock: WallClockClose | None = None

    @classmethod
    def until_window_closes(cls, buffer: BufferConfig) -> Suppressed:
        """Only each window's final result, once the window closes (a windowed table only)."""
        if not isinstance(buffer, BufferConfig) or not buffer.strict:
            raise TopologyError("until_window_closes() needs a buffer that never emits early: "
                                "BufferConfig.unbounded() or ....shut_down_when_full()")
        return cls(True, 0, buffer)

    @classmethod
    def until_time_limit(cls, time_limit_ms: int, buffer: BufferConfig) -> Suppressed:
        """A key's latest value once stream time is ``time_limit_ms`` past its first held update."""
        if isinstance(time_limit_ms, bool) or not isinstance(time_limit_ms, int) or time_limit_ms < 0:
            raise TopologyError(f"until_time_limit() needs an int >= 0 ms, got {time_limit_ms!r}")
        if not isinstance(buffer, BufferConfig):
            raise TopologyError(f"until_time_limit() needs a BufferConfig, got {buffer!r}")
        return cls(False, time_limit_ms, buffer)

    def with_name(self, name: str) -> Suppressed:
        return replace(self, name=check_store_name(name))

    def with_wall_clock_close(self, idle_ms: int, check_interval_ms: int | None = None) -> Suppressed:
        """Also close windows whose end plus grace has passed on the wall clock, once no record
        reached the suppression (in a task) for ``idle_ms``; checked every ``check_interval_ms``
        (default: a quarter of ``idle_ms``, at most a second). An update for a window closed already is dropped."""
        if not self.final_results:
            raise TopologyError("with_wall_clock_close() needs Suppressed.until_window_closes(...): a time "
                                "limit counts from a key's first held update, not from a window's end")
        return replace(self, wall_clock=WallClockClose.after_idle(idle_ms, check_interval_ms))


def _close_after(windows: TimeWindows | SessionWindows | SlidingWindows) -> int:
    if isinstance(windows, TimeWindows):
        return windows.grace_ms
    return windows.close_after_ms


def suppress_table(table: KTable, suppressed: Suppressed, name: str | None) -> KTable:
    if not isinstance(suppressed, Suppressed):
        raise TopologyError(f"suppress() needs a Suppressed, got {suppressed!r}")
    windows = table._windows
    if suppressed.final_results and windows is None:
        raise TopologyError("Suppressed.until_window_closes() needs a windowed table (from windowed_by(...))")
    builder = table._builder
    node = builder._name(name or suppressed.name, "KTABLE-SUPPRESS")
    given = name or suppressed.name
    store = f"{given}-store" if given is not None else builder._name(None, "KTABLE-SUPPRESS-STATE-STORE")
    # A suppressed table has no store of its own (its reads go through its view), but its buffer
    # keeps the bytes of the store it suppresses, which a suppression after it keeps too.
    upstream = table.queryable_store_name or getattr(table, "_suppressed_store", None)
    if upstream is None:
        # The buffer keeps the table store's own bytes; a filter, map_values or join without
        # ``materialized=`` has no store of its own.
        raise TopologyError("suppress() needs a table with a store: give the operation before it "
                            "materialized=\"<store name>\"")
    delay = _close_after(windows) if suppressed.final_results and windows is not None else suppressed.time_limit_ms
    final, config, wall = suppressed.final_results, suppressed.buffer, suppressed.wall_clock
    closes = close_time_store(store)
    builder._topology.add_processor(
        node, lambda: SuppressProcessor(store, upstream, final, delay, config.records_limit, config.bytes_limit,
                                        config.shut_down, None if wall is None else CloseTime(closes, wall)),
        table._node, stores=[upstream])
    # The buffer holds the table store's own key and value bytes (see SuppressProcessor).
    builder._topology.add_state_store(StoreBuilder(StoreSupplier(store, False), BytesSerde(), BytesSerde()), node)
    if wall is not None:
        builder._topology.add_state_store(StoreBuilder(StoreSupplier(closes, False), BytesSerde(), BytesSerde()),
                                          node)
    result = type(table)(builder, node, upstream, table._key_serde, table._value_serde, table._key_kind)
    result._windows = windows
    # A table operation after the suppression needs the values its updates replace: the buffer's
    # prior values, which come from the parent's old values.
    result._change_nodes = (node, *table._change_nodes)
    if table._view is not None:
        # A join reads a held-back key as it was let through (the buffer's prior value), so the
        # parent sends its old values from the start.
        send_old_values(table)
        result._view = _held_back_view(table._view, store, upstream)
        # As Kafka Streams, whose suppressed KTable has no queryable store: a stream joined with it
        # reads through the view, not the parent's store, which holds the values not let through yet.
        result.queryable_store_name = None
        result._suppressed_store = upstream  # type: ignore[attr-defined]  # read above, by a later suppress
    return result


def _held_back_view(parent: TableView, buffer_store: str, table_store: str) -> TableView:
    """Kafka Streams' ``KTableSuppressProcessorSupplier.view()``: a key the buffer holds reads as
    its prior value, any other key as the parent table reads it."""
    def make(context: ProcessorContext) -> Getter:
        parent_get = parent.make(context)
        buffer = context.get_state_store(buffer_store)
        table = context.get_state_store(table_store)

        def get(key: Any) -> Any:
            held, value = prior_value(buffer, table._key(key), table.value_serde)
            return value if held else parent_get(key)
        return derived_getter(get, parent_get)
    return TableView(tuple(dict.fromkeys((*parent.stores, table_store, buffer_store))), make)
