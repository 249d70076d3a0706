"""The one mapping of the Kafka client's (aiokafka's) errors to the engine's.

Every aiokafka error that leaves the Kafka transport is turned into an engine error here. What is
worth retrying under a deadline is :mod:`streamloop.transport.retriable`'s one classification
(re-exported here as :func:`is_retriable`); this module registers aiokafka's batch expiry with it.

Timeouts and retriable errors
    aiokafka signals timeouts as ``KafkaTimeoutError`` (batch expiry after
    ``request_timeout_ms``, ``end_offsets``), ``RequestTimedOutError`` (broker
    side, retriable), ``NodeNotReadyError``/``KafkaConnectionError`` (retriable)
    and builtin ``TimeoutError`` (``asyncio`` timeouts). A produce to a topic
    that does not exist fails after ``request_timeout_ms`` with
    ``UnknownTopicOrPartitionError`` (metadata never shows the topic). While a
    broker restarts, a batch whose request timeout passes before the new
    leader is known fails with ``LeaderNotAvailableError`` or
    ``NotLeaderForPartitionError`` (retriable: aiokafka retries them itself
    only until the batch expires). They reach the engine wrapped
    (``ProduceError``, ``TransportError``) with ``retriable`` set and the
    aiokafka exception as ``__cause__``; :func:`is_retriable` is the one
    place that classifies them (``streamloop.transport.retriable``).

Fencing
    Another producer that initialised the same ``transactional.id`` (or a transaction that
    timed out on the broker) shows up as ``ProducerFenced``, ``InvalidProducerEpoch`` or
    ``TransactionCoordinatorFenced``; a transactional producer reports each as
    ``ProducerFencedError``.
"""

from __future__ import annotations

from collections.abc import Callable

from aiokafka import errors as aioerrors

from streamloop.errors import (
    CommitFailedError,
    IllegalStateError,
    ProduceError,
    ProducerFencedError,
    TransportError,
)
from streamloop.transport import lost_connections
from streamloop.transport.retriable import is_retriable, register_retriable

__all__ = [
    "commit_failed",
    "describe",
    "error_name",
    "fenced_cause",
    "illegal_state",
    "is_retriable",
    "produce_error",
    "request_timeout",
    "stray_request",
    "transaction_error",
    "transport_error",
]

# Another producer initialised our transactional.id (or the transaction timed out on the broker).
_FENCED_ERRORS: tuple[type[BaseException], ...] = (
    aioerrors.ProducerFenced,
    aioerrors.InvalidProducerEpoch,
    aioerrors.TransactionCoordinatorFenced,
)

# aiokafka's batch expiry says retriable=False, yet a batch that expired is what a broker outage
# looks like to a producer: retried under task.timeout.ms like every other timeout.
register_retriable(aioerrors.KafkaTimeoutError)


def describe(exc: BaseException) -> str:
    """``Name: text`` of an error, for messages (just the name when the text says nothing more)."""
    text = str(exc)
    name = type(exc).__name__
    return f"{name}: {text}" if text and text != name else name


def error_name(code: int) -> str:
    """The name of the error a Kafka response's error code stands for."""
    return str(aioerrors.for_code(code).__name__)


def transport_error(exc: BaseException, what: str) -> TransportError:
    """``what`` failed with the client error ``exc``: retriable when ``exc`` is."""
    lost_connections.note()  # a request that failed half-way can lose its connection (aiokafka#715)
    err = TransportError(f"{what} failed: {describe(exc)}")
    err.retriable = is_retriable(exc)
    return err


def stray_request(what: str) -> Callable[[BaseException], TransportError]:
    """For ``streamloop.stray_cancel.reraise_stray``: aiokafka cancelled a request of its own inside
    ``what`` (a connection attempt past its timeout, in a task it gathers): retriable, as the timeout
    it stands for."""
    def error(_cancelled: BaseException) -> TransportError:
        lost_connections.note()
        err = TransportError(f"{what} failed: the Kafka client cancelled a request of its own "
                             "(a connection attempt that timed out)")
        err.retriable = True
        return err
    return error


def illegal_state(exc: BaseException) -> IllegalStateError:
    """aiokafka's ``IllegalStateError`` (a partition not assigned, …) as the engine's."""
    return IllegalStateError(str(exc))


def commit_failed(exc: BaseException, partitions: object) -> CommitFailedError:
    """A commit the group refused: it rebalanced (UnknownMemberId, IllegalGeneration,
    RebalanceInProgress), or the partitions are no longer (or not yet) this member's."""
    return CommitFailedError(f"Commit of {partitions} failed: {describe(exc)}")


def fenced_cause(exc: BaseException) -> BaseException | None:
    """The fencing error ``exc`` is, or was raised from; None if it is no fencing."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, _FENCED_ERRORS):
            return cause
        cause = cause.__cause__
    return None


def produce_error(topic: str, partition: int, cause: BaseException, transactional_id: str | None) -> TransportError:
    """A failed delivery to ``topic``-``partition``: ``ProducerFencedError`` for a fenced
    transactional producer, else ``ProduceError`` (retriable when ``cause`` is)."""
    if transactional_id is not None and isinstance(cause, _FENCED_ERRORS):
        return ProducerFencedError(f"Producing to {topic}-{partition} failed: producer "
                                   f"{transactional_id} was fenced")
    error = ProduceError(topic, partition, describe(cause))
    error.retriable = is_retriable(cause)
    return error


def transaction_error(exc: BaseException, what: str, transactional_id: str | None) -> TransportError:
    """A failed step (``what``) of a transaction: fenced, a delivery that failed, or a client error."""
    fenced = fenced_cause(exc)
    if fenced is not None:
        return ProducerFencedError(f"{what} failed: producer {transactional_id} was fenced: {describe(fenced)}")
    if isinstance(exc, ProduceError):
        return exc
    return transport_error(exc, what)


def request_timeout(message: str) -> Exception:
    """The error the Kafka client raises when a request or a batch times out (to inject one)."""
    error: Exception = aioerrors.KafkaTimeoutError(message)
    return error
