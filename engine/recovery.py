"""What a stream thread must recover from, reported where it is found and handled in one place.

A task's transaction that cannot commit, a fenced producer, output lost to a producer timeout, a
shutdown request from the group: each is found deep inside a task, a send or a commit, on the
thread's loop, and each needs the thread's poll loop to act between polls (revive tasks from their
last commit, rejoin, stop). They go through one typed inbox (``RecoveryInbox``) that the poll loop
drains after each poll, instead of flags beside the things that found them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streamloop.errors import TaskCorruptedError, TaskMigratedError
    from streamloop.tasks.task import StreamTask

__all__ = ["ProducerLost", "Recovery", "RecoveryInbox", "ShutdownRequested", "TaskCorrupted", "TaskMigrated"]


@dataclass(frozen=True, slots=True)
class TaskCorrupted:
    """Exactly-once: the task's transaction cannot commit; it is revived from its last commit."""

    task: StreamTask
    error: TaskCorruptedError


@dataclass(frozen=True, slots=True)
class TaskMigrated:
    """Exactly-once: another producer took the task's transactional.id; every task of the thread
    closes dirty and the thread rejoins the group."""

    task: StreamTask
    error: TaskMigratedError


@dataclass(frozen=True, slots=True)
class ProducerLost:
    """At-least-once: output buffered in the thread's producer was lost to a timeout; every task is
    revived from its last commit with a new producer."""

    cause: BaseException


@dataclass(frozen=True, slots=True)
class ShutdownRequested:
    """The group answered that the application shuts down (KIP-671 SHUTDOWN_APPLICATION)."""


Recovery = TaskCorrupted | TaskMigrated | ProducerLost | ShutdownRequested


class RecoveryInbox:
    """Written and drained on one stream thread's loop."""

    def __init__(self) -> None:
        self._events: deque[Recovery] = deque()

    def report(self, event: Recovery) -> None:
        if isinstance(event, ProducerLost) and any(isinstance(e, ProducerLost) for e in self._events):
            return  # one revival covers every loss of the same producer until it is drained
        self._events.append(event)

    def __bool__(self) -> bool:
        return bool(self._events)

    @property
    def output_lost(self) -> bool:
        """A ``ProducerLost`` waits for its revival: no offset may be committed until then."""
        return any(isinstance(e, ProducerLost) for e in self._events)

    def drain(self) -> list[Recovery]:
        events = list(self._events)
        self._events.clear()
        return events
