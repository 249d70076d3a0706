"""Time windows for windowed aggregations: tumbling and hopping, with a grace period.

A record with timestamp ``t`` belongs to every window ``[start, start + size)``
with ``start`` a multiple of ``advance`` and ``start <= t < start + size``. A
window closes when stream time passes ``end + grace``; records arriving for a
closed window are dropped as late (Kafka Streams' ``TimeWindows``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streamloop.errors import TopologyError


def millis(value: object, what: str, minimum: int) -> int:
    """``value`` if it is an int (not a bool) of at least ``minimum`` ms; else a ``TopologyError`` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TopologyError(f"{what} must be an int >= {minimum} ms, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class Windowed:
    """The key of a windowed table: the record key and its window ``[start, end)``."""

    key: Any
    start: int
    end: int


@dataclass(frozen=True)
class TimeWindows:
    size_ms: int
    advance_ms: int
    grace_ms: int

    @classmethod
    def of_size_with_no_grace(cls, size_ms: int) -> TimeWindows:
        return cls.of_size_and_grace(size_ms, 0)

    @classmethod
    def of_size_and_grace(cls, size_ms: int, grace_ms: int) -> TimeWindows:
        if isinstance(size_ms, bool) or not isinstance(size_ms, int) or size_ms <= 0:
            raise TopologyError(f"Window size must be an int > 0 ms, got {size_ms!r}")
        if isinstance(grace_ms, bool) or not isinstance(grace_ms, int) or grace_ms < 0:
            raise TopologyError(f"Window grace must be an int >= 0 ms, got {grace_ms!r}")
        return cls(size_ms, size_ms, grace_ms)

    def advance_by(self, advance_ms: int) -> TimeWindows:
        """Hopping windows: a new window starts every ``advance_ms`` (at most the size)."""
        if isinstance(advance_ms, bool) or not isinstance(advance_ms, int) or not 0 < advance_ms <= self.size_ms:
            raise TopologyError(f"Window advance must be an int in 1..{self.size_ms} ms, got {advance_ms!r}")
        return TimeWindows(self.size_ms, advance_ms, self.grace_ms)

    def windows_for(self, timestamp: int) -> list[int]:
        """Starts of the windows that contain ``timestamp``, oldest first."""
        advance = self.advance_ms
        last = timestamp - timestamp % advance
        # The oldest window still containing ``timestamp``: its start is on the advance grid.
        earliest = max(0, timestamp - self.size_ms + 1)
        first = -(-earliest // advance) * advance
        return list(range(first, last + 1, advance))

    @property
    def retention_ms(self) -> int:
        """How long a window must stay in its store: until it closes."""
        return self.size_ms + self.grace_ms
