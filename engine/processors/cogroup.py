"""The processors of a windowed cogroup (``streamloop.topology.cogroup``): one per grouped input,
all updating one window (or session) store, and sharing one stream time per task.

A plain cogroup needs nothing of its own (each input's processor is an ``AggregateProcessor``
on the shared store). A windowed one does: a window (or session) is closed once stream time
passes its end plus grace, and stream time is the largest timestamp ANY input brought to the
aggregate. Each kind of window keeps its own processor (time, session, sliding windows), given
the shared stream time by ``_SharesStreamTime``. Each input's processor is built separately when
a task is made, so they find their common stream time through the one thing they share: the
task's instance of the store.
"""

from __future__ import annotations

import threading
from typing import Any
from weakref import WeakKeyDictionary

from streamloop.processors.api import ProcessorContext
from streamloop.processors.session_aggregate import SessionWindowAggregateProcessor
from streamloop.processors.sliding_aggregate import SlidingWindowAggregateProcessor
from streamloop.processors.stateful import WindowedAggregateProcessor, _WindowedAggregate


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


class _SharesStreamTime(_WindowedAggregate):
    """A windowed aggregation whose stream time is its task's cogroup's, shared through the store."""

    _shared: SharedStreamTime | None = None
    _before_init = -1  # the stream time observed before init (none is, today), not lost at init

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._shared = shared_stream_time(self.store)
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


class CogroupedWindowAggregateProcessor(_SharesStreamTime, WindowedAggregateProcessor):
    """One input of a cogroup in time windows: its aggregator, the cogroup's initializer and store."""


class CogroupedSessionAggregateProcessor(_SharesStreamTime, SessionWindowAggregateProcessor):
    """One input of a cogroup in session windows: its aggregator, the cogroup's initializer, merger and store."""


class CogroupedSlidingAggregateProcessor(_SharesStreamTime, SlidingWindowAggregateProcessor):
    """One input of a cogroup in sliding windows: its aggregator, the cogroup's initializer and store."""
