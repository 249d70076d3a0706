"""The processors of a windowed cogroup (``streamloop.topology.cogroup``): one per grouped input,
all updating one window store, and sharing one stream time per task.

A plain cogroup needs nothing of its own (each input's processor is an ``AggregateProcessor``
on the shared store). A windowed one does: a window is closed once stream time passes its end
plus grace, and stream time is the largest timestamp ANY input brought to the aggregate. Each
input's processor is built separately when a task is made, so they find their common stream
time through the one thing they share: the task's instance of the store.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any
from weakref import WeakKeyDictionary

from streamloop.processors.api import ProcessorContext
from streamloop.processors.stateful import WindowedAggregateProcessor
from streamloop.state.windows import TimeWindows


class SharedStreamTime:
    """The stream time of one task's cogroup: the largest timestamp its processors admitted."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = -1


# Keyed by a task's store instance, so a new task (a new store) starts a new stream time and a
# closed one's entry goes with its store. Tasks are built on several stream threads at once.
_TIMES: WeakKeyDictionary[Any, SharedStreamTime] = WeakKeyDictionary()
_TIMES_LOCK = threading.Lock()


def shared_stream_time(store: Any) -> SharedStreamTime:
    with _TIMES_LOCK:
        time = _TIMES.get(store)
        if time is None:
            time = _TIMES[store] = SharedStreamTime()
        return time


class CogroupedWindowAggregateProcessor(WindowedAggregateProcessor):
    """One input of a windowed cogroup: its aggregator, the cogroup's initializer, store and stream time."""

    def __init__(self, store_name: str, windows: TimeWindows, initializer: Callable[[], Any],
                 aggregator: Callable[[Any, Any, Any], Any]) -> None:
        self._shared: SharedStreamTime | None = None
        self._before_init = -1
        super().__init__(store_name, windows, initializer, aggregator)

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._shared = shared_stream_time(self.store)
        # A stream time restored before init (none is, today) is not lost.
        self.observe_stream_time(self._before_init)

    @property  # a shared value where the base keeps its own
    def observed_time(self) -> int:
        return self._before_init if self._shared is None else self._shared.value

    @observed_time.setter
    def observed_time(self, time: int) -> None:
        if self._shared is None:
            self._before_init = time
        else:
            self._shared.value = time
