"""The nodes of a task's processor graph and how a record moves between them.

Forwarding is a direct call while everything downstream is synchronous. When a
node answers with an awaitable (an ``async def`` processor), the task's
``Forwarder`` queues that awaitable and defers every later forward behind it, so
output order is the order of a plain sequential run. The task then drains the
queue; forwards made while an item runs go to a nested queue that is drained
before the next item, which keeps depth-first order.
"""

from __future__ import annotations

import functools
import inspect
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from streamloop.processors.api import Processor
from streamloop.processors.partitioners import StreamPartitioner, multicast_of
from streamloop.records import Record
from streamloop.serdes import BytesSerde, Serde
from streamloop.timestamps import TimestampExtractor


class Collector(Protocol):
    """What a sink hands its records to (``streamloop.collector.RecordCollector``, or a task's
    wrapper of it). A protocol, so that the collector, which reads a sink's serdes, and the
    sink need not import each other."""

    def send(self, topic: str, record: Record, sink: SinkNode) -> Awaitable[None] | None: ...

    async def partition_count(self, topic: str) -> int: ...

Partitioner = Callable[[str, Any, Any, int], "int | None"]


class Node:
    """A vertex of the graph; ``process`` returns None or an awaitable to finish later."""

    __slots__ = ("children", "forwarder", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.children: list[Node] = []
        self.forwarder: Forwarder | None = None

    def process(self, record: Record) -> Awaitable[None] | None:  # pragma: no cover
        raise NotImplementedError

    def init(self, forwarder: Forwarder) -> None:
        self.forwarder = forwarder

    def close(self) -> None:
        pass


class Forwarder:
    """Moves records along the edges of one task's graph, keeping order (see module doc).

    Queue items are ``(child, record)`` for a deferred call and
    ``(node, awaitable, None)`` for work a node left to finish; ``node`` always
    names the node that ran last, for error reports.
    """

    __slots__ = ("node", "pending")

    def __init__(self) -> None:
        self.pending: deque[Any] = deque()
        self.node: Node | None = None

    def forward(self, children: Sequence[Node], record: Record) -> None:
        if len(children) == 1 and not self.pending:
            # The common case, kept short: one child and nothing queued ahead.
            child = children[0]
            parent = self.node
            self.node = child
            result = child.process(record)
            self.node = parent
            if result is not None:
                self.pending.append((child, result, None))
            return
        for child in children:
            pending = self.pending
            if pending:
                pending.append((child, record))
                continue
            parent = self.node
            self.node = child
            result = child.process(record)
            if result is not None:
                pending.append((child, result, None))
            self.node = parent

    def start(self, node: Node, record: Record) -> bool:
        """Run ``record`` into ``node``; True when some of the work is left to ``drain``."""
        pending = self.pending
        self.node = node
        result = node.process(record)
        if result is not None:
            pending.append((node, result, None))
        return bool(pending)

    async def drain(self) -> None:
        top = self.pending
        try:
            await self._drain(top)
        finally:
            top.clear()
            self.pending = top

    async def _drain(self, queue: deque[Any]) -> None:
        while queue:
            item = queue.popleft()
            inner: deque[Any] = deque()
            self.pending = inner
            try:
                if len(item) == 2:
                    child, record = item
                    self.node = child
                    result = child.process(record)
                    if result is not None:
                        inner.append((child, result, None))
                else:
                    self.node = item[0]
                    await item[1]
                if inner:
                    await self._drain(inner)
            except BaseException:
                _close_all(inner)
                _close_all(queue)
                raise

    def reset(self) -> None:
        """Drop queued work (after a failure), closing coroutines that never ran."""
        _close_all(self.pending)
        self.pending = deque()


def _close_all(queue: deque[Any]) -> None:
    for item in queue:
        if len(item) == 3 and inspect.iscoroutine(item[1]):
            item[1].close()
    queue.clear()


class SourceNode(Node):
    # ``process`` is a slot, set at ``init``: forwarding to the children is all a source does, so a
    # record's first call goes straight to ``Forwarder.forward`` (no frame of the source's own).
    __slots__ = ("key_serde", "process", "raw_keys", "raw_values", "timestamp_extractor", "topics", "value_serde")

    def __init__(self, name: str, topics: Sequence[str], key_serde: Serde, value_serde: Serde) -> None:
        super().__init__(name)
        self.topics = tuple(topics)
        self.key_serde = key_serde
        self.value_serde = value_serde
        # None: the record's own timestamp, failing on a negative one (FailOnInvalidTimestamp, the
        # default), checked inline so that the common case costs no call per record.
        self.timestamp_extractor: TimestampExtractor | None = None
        # Decided at ``init`` (below); a source never initialised decodes through its serdes.
        self.raw_keys = self.raw_values = False

    def init(self, forwarder: Forwarder) -> None:
        super().init(forwarder)
        # The children are final by now (``Topology`` sets them before ``init``).
        self.process = functools.partial(forwarder.forward, self.children)  # type: ignore[method-assign]  # the slot
        # Bytes in, bytes out: the per-record path skips a ``BytesSerde`` (exactly that class: a
        # subclass may decode) instead of calling it. The serdes are final by now too.
        self.raw_keys = type(self.key_serde) is BytesSerde
        self.raw_values = type(self.value_serde) is BytesSerde


class PassThroughNode(Node):
    """Forwards each record unchanged (a table's ``to_stream``, a stream's ``merge``): a direct
    forward, without the user-function call of a peek."""

    __slots__ = ()

    def process(self, record: Record) -> None:
        self.forwarder.forward(self.children, record)  # type: ignore[union-attr]  # set by init() before any record
        return None


class ProcessorNode(Node):
    """Runs a user (or built-in) ``Processor``; its ``context.forward`` goes to this node's children."""

    __slots__ = ("processor",)

    def __init__(self, name: str, processor: Processor) -> None:
        super().__init__(name)
        self.processor = processor

    def process(self, record: Record) -> Awaitable[None] | None:
        result = self.processor.process(record)
        if result is None:
            return None
        if inspect.isawaitable(result):
            return result
        return None

    def close(self) -> None:
        self.processor.close()


class _SyncProcessorNode(ProcessorNode):
    """A ``ProcessorNode`` whose processor never answers with an awaitable (a built-in one that says
    so, ``synchronous = True``): forwarding calls the processor's own ``process``, one call and one
    check fewer per record. The slot shadows ``ProcessorNode.process`` for this class only."""

    __slots__ = ("process",)

    def __init__(self, name: str, processor: Processor) -> None:
        super().__init__(name, processor)
        self.process = processor.process  # type: ignore[method-assign]  # the slot above, by design


def processor_node(name: str, processor: Processor) -> ProcessorNode:
    """The node that runs ``processor``: a direct one when it declares itself synchronous."""
    if getattr(processor, "synchronous", False):
        return _SyncProcessorNode(name, processor)
    return ProcessorNode(name, processor)


class SinkNode(Node):
    """Hands each record to the collector, which writes it with ``key_serde``/``value_serde``.

    ``origins`` says where each serde came from ("sink": given to it, "stream": known for the
    stream, "default": the config's), and ``serde_call`` the call that takes the sink's serdes,
    so that a serialization error can say how to fix it.
    """

    __slots__ = ("collector", "key_serde", "origins", "partitioner", "serde_call", "topic", "value_serde")

    def __init__(
        self,
        name: str,
        topic: str | Callable[[Any, Any, Record], str],
        key_serde: Serde,
        value_serde: Serde,
        partitioner: Partitioner | StreamPartitioner | None,
    ) -> None:
        super().__init__(name)
        self.topic = topic
        self.key_serde = key_serde
        self.value_serde = value_serde
        # The collector's form (streamloop.processors.partitioners): None or the partitions to write.
        self.partitioner = multicast_of(partitioner, name)
        self.collector: Collector | None = None
        self.origins = ("sink", "sink")
        self.serde_call: str | None = "add_sink()"

    def process(self, record: Record) -> Awaitable[None] | None:
        topic = self.topic if isinstance(self.topic, str) else self.topic(record.key, record.value, record)
        # Not None only when the topic's partition count must be looked up first.
        return self.collector.send(topic, record, self)  # type: ignore[union-attr]  # set when the task is built, before any record
