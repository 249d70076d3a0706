"""The answers handlers give; the engine acts on them (handlers never act themselves)."""

from __future__ import annotations

from enum import Enum


class Answer(Enum):
    """What a deserialization or processing exception handler answers about a failed record.

    One enum for both kinds of handler, used by the engine as it is: the answers mean the
    same for both (see ``streamloop.handlers.deserialization`` and ``streamloop.handlers.processing``).
    """

    CONTINUE = "continue"
    """Drop the record, log it, count it; its offset is committed past."""
    FAIL = "fail"
    """Fail the stream thread; its uncaught-exception handler decides next."""
    PAUSE = "pause"
    """Pause only the failing task until ``KafkaStreams.resume(task_id)``."""
    RETRY = "retry"
    """Processing only: run the record again after an exponential back-off with jitter
    (``processing.retry.backoff.ms``, ``processing.retry.backoff.max.ms``). Nothing commits past
    it while it waits. Once ``processing.retry.max.attempts`` ran, ``processing.retry.exhausted.answer``
    applies instead (with ``errors.dead.letter.queue.topic.name`` set, the record goes there then)."""


# The names Kafka Streams users know; each is the one enum above.
DeserializationHandlerResponse = Answer
ProcessingHandlerResponse = Answer


class StreamThreadExceptionResponse(Enum):
    """What to do when a stream thread dies of an exception (KIP-671)."""

    REPLACE_THREAD = "replace_thread"
    """Start a new thread in place of the failed one (the failed record is read again)."""
    SHUTDOWN_THREAD = "shutdown_thread"
    """Let only this thread die; the client goes to ERROR when no thread is left alive."""
    SHUTDOWN_CLIENT = "shutdown_client"
    """Shut down every thread of this client; the client goes to ERROR."""
    SHUTDOWN_APPLICATION = "shutdown_application"
    """Shut down every client of the application, in every process (via the group protocol)."""
