"""The per-task processor context and the per-node view of it handed to processors."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from streamloop.processors.api import Cancellable, PunctuationType
from streamloop.processors.nodes import Forwarder, Node
from streamloop.processors.punctuation import PunctuationQueue
from streamloop.records import Headers, Record

if TYPE_CHECKING:
    from streamloop.ids import TaskId
    from streamloop.serdes import Serde
    from streamloop.spark.session import SparkSessions


# The record in flight on this coroutine when a task runs several at once (see
# streamloop.tasks.in_flight); None when records of a task are processed one by one.
CURRENT: ContextVar[Any] = ContextVar("streamloop_record_in_flight", default=None)


class TaskContext:
    """What a task knows about the record being processed, shared by its nodes.

    Caller: ``StreamTask`` sets the ``topic``…``headers`` fields before each record.
    """

    __slots__ = (
        "application_id", "task_id", "forwarder", "topic", "partition", "offset",
        "timestamp", "headers", "commit_requested", "stream_time_schedules",
        "wall_clock_schedules", "wall_clock_ms", "stores", "spark", "default_serdes", "global_stores",
        "records_processed",
    )

    def __init__(self, application_id: str, task_id: TaskId, wall_clock_ms: Callable[[], int],
                 spark: SparkSessions | None = None) -> None:
        self.application_id = application_id
        self.task_id = task_id
        self.forwarder = Forwarder()
        self.topic: str | None = None
        self.partition: int | None = None
        self.offset: int | None = None
        self.timestamp: int = -1
        self.headers: Headers = ()
        self.commit_requested = False
        self.stream_time_schedules = PunctuationQueue(PunctuationType.STREAM_TIME)
        self.wall_clock_schedules = PunctuationQueue(PunctuationType.WALL_CLOCK_TIME)
        self.wall_clock_ms = wall_clock_ms
        self.stores: dict[str, Any] = {}
        # The client's global tables' stores, which every processor may read (as in Kafka Streams).
        self.global_stores: Mapping[str, Any] = {}
        # The client's shared SparkSession (made lazily), for Spark stages.
        self.spark = spark
        # default.key.serde and default.value.serde, set when the task's graph is built: a
        # processor that writes bytes itself (a foreign-key join) falls back on them.
        self.default_serdes: tuple[Serde, Serde] | None = None
        # How many records the task has processed (set by the task; read between records).
        self.records_processed: Callable[[], int] = lambda: 0


class NodeContext:
    """The ``ProcessorContext`` of one processor node: ``forward`` reaches that node's children."""

    __slots__ = ("_task", "_node", "_stores")

    def __init__(self, task: TaskContext, node: Node, stores: tuple[str, ...] = ()) -> None:
        self._task = task
        self._node = node
        self._stores = stores

    @property
    def application_id(self) -> str:
        return self._task.application_id

    @property
    def task_id(self) -> TaskId:
        return self._task.task_id

    @property
    def spark(self) -> SparkSessions | None:
        """The client's ``SparkSessions`` (Spark stages use it; None outside a client)."""
        return self._task.spark

    @property
    def default_serdes(self) -> tuple[Serde, Serde] | None:
        """(default.key.serde, default.value.serde) of the client; None before the task is built."""
        return self._task.default_serdes

    @property
    def topic(self) -> str | None:
        slot = CURRENT.get()
        return self._task.topic if slot is None else slot.raw.topic

    @property
    def partition(self) -> int | None:
        slot = CURRENT.get()
        return self._task.partition if slot is None else slot.raw.partition

    @property
    def offset(self) -> int | None:
        slot = CURRENT.get()
        return self._task.offset if slot is None else slot.raw.offset

    @property
    def timestamp(self) -> int:
        slot = CURRENT.get()
        return self._task.timestamp if slot is None else slot.timestamp

    @property
    def headers(self) -> Headers:
        slot = CURRENT.get()
        return self._task.headers if slot is None else slot.raw.headers

    def forward(self, record: Record, to: str | None = None) -> None:
        children = self._node.children
        if to is None:
            self._task.forwarder.forward(children, record)
            return
        children = [c for c in children if c.name == to]
        if not children:
            names = [c.name for c in self._node.children]
            raise ValueError(f"Node '{self._node.name}' has no child named '{to}' (children: {names})")
        self._task.forwarder.forward(children, record)

    def forward_to_children(self) -> Callable[[Record], None]:
        """``forward(record)`` to every child, as one direct call: for a built-in processor that
        forwards each record it gets (a table's updates), bound once at ``init``."""
        return functools.partial(self._task.forwarder.forward, self._node.children)

    def commit(self) -> None:
        self._task.commit_requested = True

    def current_system_time_ms(self) -> int:
        return self._task.wall_clock_ms()

    def records_processed(self) -> int:
        return self._task.records_processed()

    def get_state_store(self, name: str) -> Any:
        if name not in self._stores:
            if name in self._task.global_stores:
                return self._task.global_stores[name]
            from streamloop.errors import StateStoreError
            raise StateStoreError(name, f"processor '{self._node.name}' has no access to it: connect it with "
                                        f"add_state_store(builder, '{self._node.name}') or process(..., stores=[...])")
        return self._task.stores[name]

    def schedule(self, interval_ms: int, kind: PunctuationType, punctuator: Callable[[int], Any]) -> Cancellable:
        if kind is PunctuationType.STREAM_TIME:
            return self._task.stream_time_schedules.schedule(
                max(self._task.timestamp, 0), interval_ms, punctuator, self._node.name
            )
        return self._task.wall_clock_schedules.schedule(
            self._task.wall_clock_ms(), interval_ms, punctuator, self._node.name
        )
