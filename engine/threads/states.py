"""A stream thread's states and their allowed moves, as in Kafka Streams::

    CREATED ──> STARTING ──> PARTITIONS_REVOKED <──> PARTITIONS_ASSIGNED ──> RUNNING
       │            │               │                       │     ^            │
       │            │               │                       │     └────────────┤ (rebalance)
       └────────────┴───────────────┴───────────> PENDING_SHUTDOWN <───────────┘
                                                        │
                                                        v
                                                      DEAD

The one record of whether a thread is asked to stop: PENDING_SHUTDOWN (no flag beside it).
"""

from __future__ import annotations

from enum import Enum


class StreamThreadState(Enum):
    CREATED = "CREATED"
    STARTING = "STARTING"
    PARTITIONS_REVOKED = "PARTITIONS_REVOKED"
    PARTITIONS_ASSIGNED = "PARTITIONS_ASSIGNED"
    RUNNING = "RUNNING"
    PENDING_SHUTDOWN = "PENDING_SHUTDOWN"
    DEAD = "DEAD"

    def is_alive(self) -> bool:
        return self not in (StreamThreadState.PENDING_SHUTDOWN, StreamThreadState.DEAD)


_T = StreamThreadState
THREAD_TRANSITIONS: dict[StreamThreadState, frozenset[StreamThreadState]] = {
    _T.CREATED: frozenset({_T.STARTING, _T.PENDING_SHUTDOWN}),
    _T.STARTING: frozenset({_T.PARTITIONS_REVOKED, _T.PARTITIONS_ASSIGNED, _T.PENDING_SHUTDOWN}),
    _T.PARTITIONS_REVOKED: frozenset({_T.PARTITIONS_REVOKED, _T.PARTITIONS_ASSIGNED, _T.PENDING_SHUTDOWN}),
    _T.PARTITIONS_ASSIGNED: frozenset({_T.PARTITIONS_REVOKED, _T.PARTITIONS_ASSIGNED, _T.RUNNING, _T.PENDING_SHUTDOWN}),
    _T.RUNNING: frozenset({_T.PARTITIONS_REVOKED, _T.PARTITIONS_ASSIGNED, _T.PENDING_SHUTDOWN}),
    _T.PENDING_SHUTDOWN: frozenset({_T.DEAD}),
    _T.DEAD: frozenset(),
}
