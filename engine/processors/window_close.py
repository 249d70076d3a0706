"""When windows close: by stream time, and (opt-in) by the wall clock once the input went quiet.

A window operation (``suppress(until_window_closes)``, a windowed aggregation that
emits on window close) closes a window when its *close time* passes the window's
end plus the grace period. The close time is the operation's stream time (the
largest record timestamp it has seen), and with a ``WallClockClose`` also the
wall clock: at a wall-clock check at time ``now``, when the operation's task took
no record for ``idle_ms``, the close time moves up to ``now``. Record
timestamps and the wall clock are both epoch milliseconds, so "the window's end
plus grace has passed on the wall clock" is ``end + grace <= now``.

A record that arrives later for a window closed this way is late, as for a window
closed by stream time: it is dropped and counted.

``CloseTime`` keeps the close time of an operation's last emission in a store of
its own with a changelog (Kafka Streams keeps the last emitted window close time
in the commit's processor metadata), so that after a restart or a moved task a
window that was emitted is not emitted again, and stays closed.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from streamloop.errors import TopologyError
from streamloop.processors.api import ProcessorContext, PunctuationType
from streamloop.state.store import KeyValueStore
from streamloop.state.windows import millis

_KEY = b"close-time"
_TIME = struct.Struct(">q")
_MAX_CHECK_INTERVAL_MS = 1000


@dataclass(frozen=True)
class WallClockClose:
    """Close windows on the wall clock once no record arrived for ``idle_ms``, checked every
    ``check_interval_ms`` of wall-clock time (default: a quarter of ``idle_ms``, at most a second).

    A record that reaches the operation is timed exactly; one the task took that did not reach it
    (filtered out before it, or held in an upstream cache) is seen at the next check, so the quiet
    starts there at the latest."""

    idle_ms: int
    check_interval_ms: int

    @classmethod
    def after_idle(cls, idle_ms: int, check_interval_ms: int | None = None) -> WallClockClose:
        idle = millis(idle_ms, "with_wall_clock_close() idle_ms", 1)
        if check_interval_ms is None:
            return cls(idle, min(max(idle // 4, 1), _MAX_CHECK_INTERVAL_MS))
        return cls(idle, millis(check_interval_ms, "with_wall_clock_close() check_interval_ms", 1))


def close_time_store(store: str) -> str:
    """The name of the store that keeps the close time of the operation whose store is ``store``."""
    return f"{store}-close-time"


class CloseTime:
    """An operation's persisted close time and the wall clock's part in it (see the module docstring).

    Caller: the operation's processor, which ``init``s it, calls ``arrived()`` for each record,
    ``restored()`` when it (re)loads its index of the store and ``save()`` after it emitted.
    """

    def __init__(self, store_name: str, wall_clock: WallClockClose | None) -> None:
        if wall_clock is not None and not isinstance(wall_clock, WallClockClose):
            raise TopologyError(f"a wall-clock close needs a WallClockClose, got {wall_clock!r}")
        self.store_name = store_name
        self.wall_clock = wall_clock

    def init(self, context: ProcessorContext, on_wall_clock: Callable[[int], Any],
             on_undo: Callable[[], None]) -> None:
        """``on_wall_clock(now)`` runs at each check when the input has been quiet for the idle time."""
        self._context = context
        self.store: KeyValueStore = context.get_state_store(self.store_name)
        self.store.undo_listener = on_undo
        wall = self.wall_clock
        if wall is None:
            return
        # A task that starts (or restarts) waits the idle time before it closes anything.
        self._quiet_since = context.current_system_time_ms()
        self._task_records = context.records_processed()
        self._own_records = self._seen = 0

        def check(now: int) -> None:
            task_records = context.records_processed()
            if task_records - self._task_records > self._own_records - self._seen:
                # Records the task took that did not reach this operation (filtered out, or held in a
                # cache before it): when they came is not known, so the quiet starts now.
                self._quiet_since = max(self._quiet_since, now)
            self._task_records, self._seen = task_records, self._own_records
            if now - self._quiet_since >= wall.idle_ms:
                on_wall_clock(now)
        context.schedule(wall.check_interval_ms, PunctuationType.WALL_CLOCK_TIME, check)

    def arrived(self) -> None:
        """A record reached the operation: the quiet starts again (one clock read, with a wall-clock
        close only)."""
        if self.wall_clock is not None:
            self._quiet_since = self._context.current_system_time_ms()
            self._own_records += 1

    def restored(self) -> int:
        """The close time of the last emission (-1 if none), from the store (and its changelog)."""
        data = self.store.get(_KEY)
        return -1 if data is None else int(_TIME.unpack(data)[0])

    def save(self, time: int) -> None:
        self.store.put(_KEY, _TIME.pack(time))
