"""``ErrorContext``: what every error handler is told about the record that failed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ErrorContext:
    """The failing record's origin. ``raw_key``/``raw_value`` are the bytes as fetched.

    ``attempt``: which run of the record failed (1: its first). A processing handler that answered
    ``RETRY`` before is asked again with the next attempt, so it may answer otherwise then.
    """

    task_id: Any  # engine.TaskId; typed loosely so handlers need not import the engine
    topic: str | None
    partition: int | None
    offset: int | None
    timestamp: int
    headers: Sequence[tuple[str, bytes]]
    raw_key: bytes | None
    raw_value: bytes | None
    processor_node: str | None = None
    attempt: int = 1
