"""A client's states and their allowed moves, as in Kafka Streams::

            +--------------+
    +<----- | CREATED      |
    |       +------+-------+
    |              v
    |       +--------------+ <-----+
    +<----- | REBALANCING  |       |
    |       +------+-------+ ------+
    |              v ^
    |       +--------------+
    +<----- | RUNNING      | ---> PENDING_ERROR ---> ERROR
    |       +--------------+
    v
    PENDING_SHUTDOWN ---> NOT_RUNNING

Whether the client is closing is its state (``is_closing``), not a flag beside it.
"""

from __future__ import annotations

from enum import Enum


class ClientState(Enum):
    CREATED = "CREATED"
    REBALANCING = "REBALANCING"
    RUNNING = "RUNNING"
    PENDING_SHUTDOWN = "PENDING_SHUTDOWN"
    NOT_RUNNING = "NOT_RUNNING"
    PENDING_ERROR = "PENDING_ERROR"
    ERROR = "ERROR"

    def is_running_or_rebalancing(self) -> bool:
        return self in (ClientState.RUNNING, ClientState.REBALANCING)

    def is_closing(self) -> bool:
        """Shutting down or shut down: no thread is added, replaced or resized any more."""
        return self in CLOSING_STATES


_C = ClientState
CLIENT_TRANSITIONS: dict[ClientState, frozenset[ClientState]] = {
    _C.CREATED: frozenset({_C.REBALANCING, _C.PENDING_SHUTDOWN}),
    _C.REBALANCING: frozenset({_C.RUNNING, _C.PENDING_SHUTDOWN, _C.PENDING_ERROR}),
    _C.RUNNING: frozenset({_C.REBALANCING, _C.PENDING_SHUTDOWN, _C.PENDING_ERROR}),
    _C.PENDING_SHUTDOWN: frozenset({_C.NOT_RUNNING}),
    _C.NOT_RUNNING: frozenset(),
    _C.PENDING_ERROR: frozenset({_C.ERROR}),
    _C.ERROR: frozenset(),
}
CLOSING_STATES = frozenset({_C.PENDING_SHUTDOWN, _C.NOT_RUNNING, _C.PENDING_ERROR, _C.ERROR})
