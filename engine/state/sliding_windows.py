"""Sliding windows: windows of a fixed time difference defined by the records themselves.

Two records are in a common window when their timestamps differ by at most
``time_difference_ms``. Rather than one window per millisecond, Kafka Streams'
``SlidingWindows`` keeps only the distinct windows: each record's *left* window
``[t - diff, t]`` and, when a later record falls within ``diff`` of it, its *right*
window ``[t + 1, t + 1 + diff]``. Both ends are inclusive; a window's key is
``Windowed(key, start, start + diff)``.

Their store is a window store whose values also carry the largest record
timestamp in the window (what Kafka Streams keeps in a ``TimestampedWindowStore``):
the aggregation needs it to tell which windows a new record must create.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from streamloop.state.store import WindowStore
from streamloop.state.windows import millis

_TIMESTAMP = struct.Struct(">q")


@dataclass(frozen=True)
class SlidingWindows:
    time_difference_ms: int
    grace_ms: int

    @classmethod
    def of_time_difference_with_no_grace(cls, time_difference_ms: int) -> SlidingWindows:
        return cls.of_time_difference_and_grace(time_difference_ms, 0)

    @classmethod
    def of_time_difference_and_grace(cls, time_difference_ms: int, grace_ms: int) -> SlidingWindows:
        return cls(millis(time_difference_ms, "Sliding window time difference", 1),
                   millis(grace_ms, "Sliding window grace", 0))

    @property
    def retention_ms(self) -> int:
        """A new record reads windows starting up to two differences before it, and records up to
        the grace period late are still taken: keep windows that long (plus the inclusive end)."""
        return 2 * self.time_difference_ms + self.grace_ms + 1

    @property
    def close_after_ms(self) -> int:
        """A window is closed once stream time passes its end by the grace period."""
        return self.grace_ms


class TimestampedWindowStore(WindowStore):
    """A window store whose entries also hold the largest record timestamp of their window.

    Reads through the ``WindowStore`` API (queries, the table's updates) see the
    values only; the aggregation uses ``fetch_with_timestamp``/``put_with_timestamp``.
    """

    def put_with_timestamp(self, key: Any, value: Any, window_start: int, timestamp: int) -> None:
        if window_start > self.observed_time:
            self.observed_time = window_start
        data = self.value_serde.serialize(value)
        if data is None:
            raise ValueError(f"State store '{self.name}': value {value!r} serializes to None")
        self._write(self._composite(key, window_start), data + _TIMESTAMP.pack(timestamp))

    def put(self, key: Any, value: Any, window_start: int) -> None:
        if value is None:
            super().put(key, None, window_start)
            return
        self.put_with_timestamp(key, value, window_start, self._timestamp())

    def fetch_with_timestamp(self, key: Any, time_from: int, time_to: int) -> list[tuple[int, Any, int]]:
        """``(window_start, value, max record timestamp)`` of ``key``'s windows starting within
        ``[time_from, time_to]``, oldest first."""
        self._check_open()
        raw_key = self._key(key)
        low = raw_key + _TIMESTAMP.pack(max(time_from, self._live_from(), 0))
        high = raw_key + _TIMESTAMP.pack(max(time_to, 0))
        found = []
        for stored, value in self._range(low, high):
            if len(stored) == len(raw_key) + 8:
                found.append((_TIMESTAMP.unpack(stored[-8:])[0], self.value_serde.deserialize(value[:-8]),
                              _TIMESTAMP.unpack(value[-8:])[0]))
        return found

    def _decode_value(self, value: bytes | None) -> Any:
        return None if value is None else self.value_serde.deserialize(value[:-8])

    def _down(self, key: bytes, value: bytes | None, timestamp: int, source: tuple[str, int] | None,
              key_object: Any = None, value_object: Any = None) -> None:
        # A window's update carries its largest record timestamp, as Kafka Streams forwards it.
        if value is not None:
            timestamp = _TIMESTAMP.unpack(value[-8:])[0]
        super()._down(key, value, timestamp, source)
