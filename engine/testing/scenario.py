"""The steps of a test scenario: input records and the faults played between them.

``engine.testing.strategies`` draws lists of these; ``TopologyTestDriver.play`` plays
them in order. Each step is a frozen dataclass, so a failing example prints as the
exact schedule that made it fail.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.records import Headers
from engine.tasks.task_id import TaskId


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
