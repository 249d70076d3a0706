"""The Processor API: what a user processor implements and what it may call.

A processor's ``process`` may be a plain method or ``async def``. It emits
records with ``context.forward``; the engine keeps the order of everything a
record causes downstream, even when some processors on the way are async.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from streamloop.records import Headers, Record

if TYPE_CHECKING:
    from streamloop.ids import TaskId


class PunctuationType(Enum):
    """What drives a punctuation: the records' timestamps or the wall clock."""

    STREAM_TIME = "stream_time"
    WALL_CLOCK_TIME = "wall_clock_time"


Punctuator = Callable[[int], "Awaitable[None] | None"]


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class ProcessorContext(Protocol):
    """The per-task context a processor gets in ``init``.

    The ``topic``/``partition``/``offset``/``timestamp``/``headers`` describe the
    source record being processed; they are ``None`` inside a wall-clock
    punctuation.
    """

    @property
    def application_id(self) -> str: ...
    @property
    def task_id(self) -> TaskId: ...
    @property
    def topic(self) -> str | None: ...
    @property
    def partition(self) -> int | None: ...
    @property
    def offset(self) -> int | None: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def headers(self) -> Headers: ...

    def forward(self, record: Record, to: str | None = None) -> None:
        """Send ``record`` to every child (or only the child named ``to``)."""

    def commit(self) -> None:
        """Ask for a commit as soon as possible (after this record)."""

    def current_system_time_ms(self) -> int:
        """The wall clock in ms (the test driver's own clock under ``TopologyTestDriver``)."""

    def records_processed(self) -> int:
        """How many records the task has processed so far (whether or not they reached this node)."""

    def get_state_store(self, name: str) -> Any:
        """The task's instance of the store ``name``; the processor must be connected to it."""

    def schedule(
        self, interval_ms: int, kind: PunctuationType, punctuator: Punctuator
    ) -> Cancellable:
        """Call ``punctuator(timestamp)`` every ``interval_ms`` of stream or wall-clock time."""


@runtime_checkable
class Processor(Protocol):
    def init(self, context: ProcessorContext) -> None: ...

    def process(self, record: Record) -> Any:
        """Handle one record; may be ``async def``."""

    def close(self) -> None: ...


@runtime_checkable
class ObservesStreamTime(Protocol):
    """A processor that keeps the stream time it observed (windowed aggregations, suppress). A task
    that starts from a commit starts it at the restored stream time (Kafka Streams'
    ``initializeTaskTime``), so a window closed before a restart stays closed after it."""

    def observe_stream_time(self, time: int) -> None: ...


class BaseProcessor:
    """A convenience base: keeps the context and has no-op ``init``/``close``."""

    context: ProcessorContext

    def init(self, context: ProcessorContext) -> None:
        self.context = context

    def process(self, record: Record) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def close(self) -> None:
        pass


ProcessorSupplier = Callable[[], Processor]
