"""What is worth retrying under a deadline: the engine's one classification of client errors.

``streamloop.tasks.timeouts.is_timeout`` is :func:`is_retriable`. Retriable: an engine
``TransportError`` marked ``retriable`` (every transport marks what it raises), the builtin
``TimeoutError`` (asyncio timeouts, a slow processor), and a client's own error whose
``retriable`` attribute is set, or whose type its transport registered as retriable
(:func:`register_retriable`: the Kafka transport registers aiokafka's batch-expiry timeout).
Not retriable: a deadline that ran out (``TaskTimeoutError``, ``StartupTimeoutError``,
``StreamsTimeoutError``) or refused credentials, whatever they were raised from, and an error
merely *seen while handling* a retriable one (``__context__`` is not followed).

Transport-neutral on purpose: the core (commits, timeouts, the collector) imports it, and an
application on ``memory://`` must not load the Kafka client.
"""

from __future__ import annotations

from streamloop.errors import (
    AuthenticationError,
    StartupTimeoutError,
    StreamsTimeoutError,
    TaskTimeoutError,
    TransportError,
)

__all__ = ["is_retriable", "register_retriable"]

# The errors that end a retry: never retried themselves, even though what they were raised from
# was (a refused TLS handshake is raised from the connection error it showed up as).
_FINAL_ERRORS: tuple[type[BaseException], ...] = (StreamsTimeoutError, TaskTimeoutError, StartupTimeoutError,
                                                   AuthenticationError)
_retriable_types: tuple[type[BaseException], ...] = (TimeoutError,)


def register_retriable(*types: type[BaseException]) -> None:
    """A transport's client errors that are retriable whatever their ``retriable`` attribute says."""
    global _retriable_types
    _retriable_types = tuple(dict.fromkeys((*_retriable_types, *types)))


def is_retriable(exc: BaseException) -> bool:
    """Whether ``exc``, or the error it was raised from, is worth retrying under a deadline."""
    current: BaseException | None = exc
    for _ in range(6):
        if current is None or isinstance(current, _FINAL_ERRORS):
            return False
        if isinstance(current, TransportError):
            if current.retriable:
                return True
        elif isinstance(current, _retriable_types) or getattr(current, "retriable", False) is True:
            return True
        current = current.__cause__
    return False
