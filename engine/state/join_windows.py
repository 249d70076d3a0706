"""Join windows for stream-stream joins (Kafka Streams' ``JoinWindows``).

A record of the left stream at time ``t`` joins the right stream's records of
the same key with timestamps in ``[t - before_ms, t + after_ms]`` (bounds
inclusive); a right record at ``t`` joins left records in ``[t - after_ms, t +
before_ms]``. ``of_time_difference_*(d)`` makes both ``d``. ``grace_ms`` is how
long after a window ends out-of-order records are still joined and a left/outer
join holds back its unmatched records (results with None) before emitting them.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamloop.errors import TopologyError


def _ms(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TopologyError(f"{what} must be an int (ms), got {value!r}")
    return value


@dataclass(frozen=True)
class JoinWindows:
    before_ms: int
    after_ms: int
    grace_ms: int

    def __post_init__(self) -> None:
        _ms(self.before_ms, "Join window before_ms")
        _ms(self.after_ms, "Join window after_ms")
        _ms(self.grace_ms, "Join window grace_ms")
        # As Kafka Streams: one side may be negative, the window itself may not.
        if self.before_ms + self.after_ms < 0:
            raise TopologyError(f"Join window size (before_ms + after_ms) must not be negative, got "
                                f"{self.before_ms} + {self.after_ms}")
        if self.grace_ms < 0:
            raise TopologyError(f"Join window grace must be >= 0 ms, got {self.grace_ms}")

    @classmethod
    def of_time_difference_with_no_grace(cls, time_difference_ms: int) -> JoinWindows:
        """Records join when their timestamps differ by at most ``time_difference_ms``; no grace."""
        return cls.of_time_difference_and_grace(time_difference_ms, 0)

    @classmethod
    def of_time_difference_and_grace(cls, time_difference_ms: int, grace_ms: int) -> JoinWindows:
        """As ``of_time_difference_with_no_grace``, with records up to ``grace_ms`` late still joined."""
        if _ms(time_difference_ms, "Join window time difference") < 0:
            raise TopologyError(f"Join window time difference must be >= 0 ms, got {time_difference_ms}")
        return cls(time_difference_ms, time_difference_ms, grace_ms)

    def before(self, time_difference_ms: int) -> JoinWindows:
        """The same windows, with left records joining right records up to ``time_difference_ms`` older."""
        return JoinWindows(time_difference_ms, self.after_ms, self.grace_ms)

    def after(self, time_difference_ms: int) -> JoinWindows:
        """The same windows, with left records joining right records up to ``time_difference_ms`` newer."""
        return JoinWindows(self.before_ms, time_difference_ms, self.grace_ms)

    @property
    def size_ms(self) -> int:
        return self.before_ms + self.after_ms

    @property
    def retention_ms(self) -> int:
        """How long a record stays in its side's window store: the window plus the grace period."""
        return self.size_ms + self.grace_ms
