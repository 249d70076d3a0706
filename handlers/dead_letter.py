"""Dead-letter records (KIP-1034): the failed record's bytes with headers naming the failure.

When ``errors.dead.letter.queue.topic.name`` is set, the engine sends one of
these for every record an error handler was asked about, whatever it answered,
through the failing task's own producer, before the task moves on.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass

from streamloop.handlers.context import ErrorContext

HEADER_PREFIX = "__streams.errors."


@dataclass(frozen=True)
class DeadLetter:
    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


def dead_letter(dlq_topic: str, context: ErrorContext, exception: BaseException) -> DeadLetter:
    """The raw key and value, the original headers, then the error headers."""
    errors = (
        ("exception", type(exception).__qualname__),
        ("message", str(exception)),
        ("stacktrace", "".join(traceback.format_exception(exception))[-8192:]),
        ("topic", context.topic or ""),
        ("partition", "" if context.partition is None else str(context.partition)),
        ("offset", "" if context.offset is None else str(context.offset)),
    )
    headers = tuple(context.headers) + tuple((HEADER_PREFIX + k, v.encode()) for k, v in errors)
    return DeadLetter(dlq_topic, context.raw_key, context.raw_value, headers)
