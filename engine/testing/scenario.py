"""The steps of a test scenario: input records and the faults played between them.

``streamloop.testing.strategies`` draws lists of these; ``TopologyTestDriver.play`` plays
them in order. Each step is a frozen dataclass, so a failing example prints as the
exact schedule that made it fail.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from streamloop.ids import TaskId
from streamloop.records import Headers


@dataclass(frozen=True)
class Input:
    """Pipe one record into ``topic`` (into ``partition``, or the one the key hashes to)."""

    topic: str
    key: Any
    value: Any
    timestamp: int
    headers: Headers = ()
    partition: int | None = None


@dataclass(frozen=True)
class BadRecord:
    """Pipe bytes that the topic's serdes cannot read; the deserialization handler decides."""

    topic: str
    value: bytes = b"\xff"
    key: bytes | None = None
    timestamp: int = 0
    partition: int = 0


@dataclass(frozen=True)
class ProcessorTimeout:
    """The next record of ``task`` times out ``times`` times before it gets through (KIP-572)."""

    task: TaskId
    times: int = 1


@dataclass(frozen=True)
class Crash:
    """Every task dies without committing and restarts from the last commit (at-least-once)."""


@dataclass(frozen=True)
class Rebalance:
    """``task`` is revoked (closed cleanly, committed) and assigned again with new processors."""

    task: TaskId


@dataclass(frozen=True)
class AdvanceWallClock:
    """Move the driver's wall clock; due wall-clock punctuations fire."""

    ms: int


Fault = BadRecord | ProcessorTimeout | Crash | Rebalance
Step = Input | BadRecord | ProcessorTimeout | Crash | Rebalance | AdvanceWallClock


def inputs(scenario: Sequence[Step], topic: str | None = None) -> list[Input]:
    """The input records of a scenario (of one ``topic``) in the order they are piped: what a
    model of your topology reads."""
    return [s for s in scenario if isinstance(s, Input) and (topic is None or s.topic == topic)]


def by_key(pairs: Iterable[tuple[Any, Any]]) -> dict[Any, list[Any]]:
    """``(key, value)`` pairs grouped per key, each key's values in order: what Kafka keeps ordered."""
    grouped: dict[Any, list[Any]] = {}
    for key, value in pairs:
        grouped.setdefault(key, []).append(value)
    return grouped
