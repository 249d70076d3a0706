"""Forwarding through a task graph: sync nodes run inline, async ones keep the order of a sequential run.

Each test builds one task's graph with ``Topology.build_task_graph`` and a
collector that records what the sinks send, then pushes records in through
``Forwarder.start`` (and ``drain`` when it says some work was left).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import warnings
from collections.abc import Awaitable, Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamloop.clock import ManualClock
from streamloop.ids import TaskId
from streamloop.processors.api import BaseProcessor, ProcessorContext
from streamloop.processors.context import TaskContext
from streamloop.processors.nodes import SinkNode
from streamloop.records import Record
from streamloop.serdes import BytesSerde, Serde, StringSerde
from streamloop.topology.builder import KStream, StreamsBuilder
from streamloop.topology.topology import Topology

TASK = TaskId(0, 3)


@dataclass(frozen=True)
class Sent:
    topic: str
    key: Any
    value: Any
    node: str


@dataclass
class RecordingCollector:
    """Stands in for ``RecordCollector``: keeps every send, in order."""

    sent: list[Sent] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)

    def send(self, topic: str, record: Record, sink: SinkNode) -> Awaitable[None] | None:
        self.sent.append(Sent(topic, record.key, record.value, sink.name))
        self.records.append(record)
        return None

    def values(self) -> list[Any]:
        return [s.value for s in self.sent]


class TaskHarness:
    """One task's graph of ``topology``'s sub-topology ``sub``, fed record by record."""

    def __init__(self, topology: Topology, sub: int = 0, collector: Any = None) -> None:
        self.collector = collector if collector is not None else RecordingCollector()
        self.context = TaskContext("app", TASK, ManualClock(1_000).wall_ms)
        self.graph = topology.build_task_graph(sub, self.context, self.collector, BytesSerde(), BytesSerde())
        self.forwarder = self.context.forwarder

    def start(self, key: Any, value: Any, topic: str | None = None, timestamp: int = 0) -> bool:
        """Start one record at the source; True when some of its work waits for ``drain``."""
        source = self.graph.sources[topic or next(iter(self.graph.sources))]
        return self.forwarder.start(source, Record(key, value, timestamp))

    async def pipe(self, key: Any, value: Any, topic: str | None = None, timestamp: int = 0) -> None:
        """What a task does per record: start it, and drain if needed."""
        if self.start(key, value, topic, timestamp):
            await self.forwarder.drain()


async def yield_once() -> None:
    """Suspend once so that other work could interleave (not a wait for anything)."""
    await asyncio.sleep(0)


def build(define: Callable[[StreamsBuilder], Any]) -> TaskHarness:
    builder = StreamsBuilder()
    define(builder)
    return TaskHarness(builder.build())


# -- synchronous pipelines ------------------------------------------------------------


def test_sync_pipeline_sends_output_without_drain() -> None:
    harness = build(lambda b: b.stream("in").filter(lambda k, v: v > 0).map_values(lambda v: v * 10).to("out"))

    assert harness.start("k", 1) is False
    assert harness.start("k", -1) is False
    assert harness.collector.sent == [Sent("out", "k", 10, "KSTREAM-SINK-0000000003")]


def test_sink_sends_the_record_with_its_timestamp_and_headers() -> None:
    harness = build(lambda b: b.stream("in").map_values(str.upper).to("out"))
    source = harness.graph.sources["in"]

    harness.forwarder.start(source, Record("k", "v", 42, [("h", b"1")]))

    assert harness.collector.records == [Record("k", "V", 42, [("h", b"1")])]


@pytest.mark.parametrize(
    ("operation", "expected"),
    [
        (lambda s: s.filter(lambda k, v: v % 2 == 0), [("a", 2)]),
        (lambda s: s.filter_not(lambda k, v: v % 2 == 0), [("a", 1), ("a", 3)]),
        (lambda s: s.map(lambda k, v: (v, k)), [(1, "a"), (2, "a"), (3, "a")]),
        (lambda s: s.select_key(lambda k, v: k * v), [("a", 1), ("aa", 2), ("aaa", 3)]),
        (lambda s: s.map_values(lambda v: -v), [("a", -1), ("a", -2), ("a", -3)]),
        (lambda s: s.flat_map(lambda k, v: [(k, v)] * (v - 1)), [("a", 2), ("a", 3), ("a", 3)]),
        (lambda s: s.flat_map_values(lambda v: range(v, 3)), [("a", 1), ("a", 2), ("a", 2)]),
        (lambda s: s.peek(lambda k, v: None), [("a", 1), ("a", 2), ("a", 3)]),
    ],
)
def test_each_dsl_operation_transforms_records_as_documented(
    operation: Callable[[KStream], KStream], expected: list[tuple[Any, Any]]
) -> None:
    harness = build(lambda b: operation(b.stream("in")).to("out"))

    for value in (1, 2, 3):
        harness.start("a", value)

    assert [(s.key, s.value) for s in harness.collector.sent] == expected


def test_map_that_returns_no_pair_raises_type_error_naming_the_node() -> None:
    harness = build(lambda b: b.stream("in").map(lambda k, v: v).to("out"))

    with pytest.raises(TypeError, match="'KSTREAM-MAP-0000000001' must return a \\(key, value\\) pair"):
        harness.start("k", 1)


def test_foreach_calls_its_action_and_forwards_nothing() -> None:
    seen: list[tuple[Any, Any]] = []
    builder = StreamsBuilder()
    builder.stream("in").foreach(lambda k, v: seen.append((k, v)))
    harness = TaskHarness(builder.build())

    harness.start("k", 1)

    assert seen == [("k", 1)]


def test_node_with_two_children_sends_to_them_in_the_order_they_were_added() -> None:
    def define(b: StreamsBuilder) -> None:
        stream = b.stream("in")
        stream.map_values(lambda v: f"first-{v}").to("out")
        stream.map_values(lambda v: f"second-{v}").to("out")

    harness = build(define)
    harness.start("k", 1)
    harness.start("k", 2)

    assert harness.collector.values() == ["first-1", "second-1", "first-2", "second-2"]


def test_merge_forwards_records_from_both_sources() -> None:
    def define(b: StreamsBuilder) -> None:
        b.stream("a").merge(b.stream("b")).to("out")

    harness = build(define)
    harness.start("k", 1, topic="a")
    harness.start("k", 2, topic="b")

    assert harness.collector.values() == [1, 2]


def test_topic_extractor_picks_the_sink_topic_per_record() -> None:
    harness = build(lambda b: b.stream("in").to(lambda key, value, record: f"out-{key}"))

    harness.start("x", 1)
    harness.start("y", 2)

    assert [(s.topic, s.value) for s in harness.collector.sent] == [("out-x", 1), ("out-y", 2)]


def test_sink_hands_its_serdes_and_partitioner_to_the_collector() -> None:
    calls: list[tuple[Serde, Serde, Any]] = []

    class Collector(RecordingCollector):
        def send(self, topic, record, sink):  # type: ignore[no-untyped-def]
            calls.append((sink.key_serde, sink.value_serde, sink.partitioner))

    def partitioner(topic: str, key: Any, value: Any, count: int) -> int:
        return count - 1

    value_serde = StringSerde()
    builder = StreamsBuilder()
    builder.stream("in").to("out", value_serde=value_serde, partitioner=partitioner)
    harness = TaskHarness(builder.build(), collector=Collector())

    harness.start(b"k", "v")

    [(key_serde, sent_value_serde, sent_partitioner)] = calls
    assert isinstance(key_serde, BytesSerde)  # the default given to build_task_graph
    assert sent_value_serde is value_serde
    # In the collector's multicast form (streamloop.processors.partitioners): the one partition chosen.
    assert sent_partitioner("out", b"k", "v", 4) == (3,)


# -- async functions -----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_async_function_leaves_its_work_to_drain() -> None:
    async def double(value: int) -> int:
        await yield_once()
        return value * 2

    harness = build(lambda b: b.stream("in").map_values(double).to("out"))

    assert harness.start("k", 1) is True
    assert harness.collector.sent == []
    await harness.forwarder.drain()
    assert harness.collector.values() == [2]


@pytest.mark.asyncio
async def test_async_callable_object_is_awaited() -> None:
    class Double:
        async def __call__(self, value: int) -> int:
            await yield_once()
            return value * 2

    harness = build(lambda b: b.stream("in").map_values(Double()).to("out"))

    await harness.pipe("k", 4)

    assert harness.collector.values() == [8]


@pytest.mark.asyncio
async def test_forwarder_is_empty_after_drain() -> None:
    async def keep(key: Any, value: Any) -> bool:
        return True

    harness = build(lambda b: b.stream("in").filter(keep).to("out"))

    await harness.pipe("k", 1)
    assert not harness.forwarder.pending
    await harness.pipe("k", 2)

    assert not harness.forwarder.pending
    assert harness.collector.values() == [1, 2]


@pytest.mark.asyncio
async def test_records_after_an_async_sibling_wait_for_it() -> None:
    async def slow_first(value: int) -> str:
        await yield_once()
        return f"async-{value}"

    def define(b: StreamsBuilder) -> None:
        stream = b.stream("in")
        stream.map_values(slow_first).to("out")
        stream.map_values(lambda v: f"sync-{v}").to("out")

    harness = build(define)
    await harness.pipe("k", 1)

    assert harness.collector.values() == ["async-1", "sync-1"]


@pytest.mark.asyncio
async def test_flat_map_outputs_pass_an_async_stage_in_order() -> None:
    async def tag(value: int) -> str:
        await yield_once()
        return f"v{value}"

    harness = build(lambda b: b.stream("in").flat_map_values(lambda v: [v, v + 1, v + 2]).map_values(tag).to("out"))

    await harness.pipe("k", 0)

    assert harness.collector.values() == ["v0", "v1", "v2"]


@pytest.mark.asyncio
async def test_async_processor_forwarding_between_awaits_keeps_order() -> None:
    class Burst(BaseProcessor):
        async def process(self, record: Record) -> None:
            for i in range(3):
                await yield_once()
                self.context.forward(record.with_value(f"{record.value}.{i}"))
                await yield_once()

    async def slow(value: str) -> str:
        await yield_once()
        return value

    harness = build(lambda b: b.stream("in").process(Burst).map_values(slow).to("out"))
    await harness.pipe("k", "a")
    await harness.pipe("k", "b")

    assert harness.collector.values() == ["a.0", "a.1", "a.2", "b.0", "b.1", "b.2"]


@pytest.mark.asyncio
async def test_nested_async_processors_keep_depth_first_order() -> None:
    class Twice(BaseProcessor):
        async def process(self, record: Record) -> None:
            for i in range(2):
                await yield_once()
                self.context.forward(record.with_value(f"{record.value}{i}"))

    harness = build(lambda b: b.stream("in").process(Twice).process(Twice).to("out"))
    await harness.pipe("k", "")

    assert harness.collector.values() == ["00", "01", "10", "11"]


# -- branching ---------------------------------------------------------------------------


def route(b: StreamsBuilder, predicates: Sequence[Callable[[Any, Any], Any]]) -> None:
    split = b.stream("in").split()
    for predicate in predicates:
        split.branch(predicate)
    for name, stream in split.default_branch().items():
        stream.to(f"branch-{name}")


def test_split_sends_each_record_to_the_first_matching_branch_only() -> None:
    harness = build(lambda b: route(b, [lambda k, v: v > 10, lambda k, v: v > 5]))

    for value in (20, 7, 1, 11):
        harness.start("k", value)

    assert [(s.topic, s.value) for s in harness.collector.sent] == [
        ("branch-1", 20), ("branch-2", 7), ("branch-0", 1), ("branch-1", 11)
    ]


def test_split_without_default_branch_drops_records_no_branch_takes() -> None:
    def define(b: StreamsBuilder) -> None:
        branches = b.stream("in").split().branch(lambda k, v: v > 0).no_default_branch()
        branches["1"].to("positive")

    harness = build(define)
    harness.start("k", 1)
    harness.start("k", -1)

    assert harness.collector.values() == [1]


@pytest.mark.asyncio
async def test_split_with_async_predicates_routes_like_sync_ones() -> None:
    async def big(key: Any, value: int) -> bool:
        await yield_once()
        return value > 10

    harness = build(lambda b: route(b, [big, lambda k, v: v > 5]))
    for value in (20, 7, 1):
        await harness.pipe("k", value)

    assert [(s.topic, s.value) for s in harness.collector.sent] == [
        ("branch-1", 20), ("branch-2", 7), ("branch-0", 1)
    ]


def test_legacy_branch_returns_one_stream_per_predicate() -> None:
    def define(b: StreamsBuilder) -> None:
        small, other = b.stream("in").branch(lambda k, v: v < 10, lambda k, v: True)
        small.to("small")
        other.to("other")

    harness = build(define)
    harness.start("k", 3)
    harness.start("k", 30)

    assert [(s.topic, s.value) for s in harness.collector.sent] == [("small", 3), ("other", 30)]


# -- Processor API ------------------------------------------------------------------------


def test_processor_init_gets_a_context_with_the_task_id() -> None:
    contexts: list[ProcessorContext] = []

    class Remember(BaseProcessor):
        def init(self, context: ProcessorContext) -> None:
            contexts.append(context)

        def process(self, record: Record) -> None:
            pass

    builder = StreamsBuilder()
    builder.stream("in").process(Remember)
    TaskHarness(builder.build())

    [context] = contexts
    assert context.task_id == TASK
    assert context.application_id == "app"


def test_each_task_gets_its_own_processor_instances() -> None:
    made: list[BaseProcessor] = []

    class Counted(BaseProcessor):
        def __init__(self) -> None:
            made.append(self)

        def process(self, record: Record) -> None:
            pass

    builder = StreamsBuilder()
    builder.stream("in").process(Counted)
    topology = builder.build()
    TaskHarness(topology)
    TaskHarness(topology)

    assert len(made) == 2
    assert made[0] is not made[1]


def test_context_reports_the_record_being_processed() -> None:
    seen: list[tuple[Any, ...]] = []

    class Where(BaseProcessor):
        def process(self, record: Record) -> None:
            c = self.context
            seen.append((c.topic, c.partition, c.offset, c.timestamp))

    builder = StreamsBuilder()
    builder.stream("in").process(Where)
    harness = TaskHarness(builder.build())
    harness.context.topic, harness.context.partition, harness.context.offset = "in", 3, 17
    harness.context.timestamp = 99

    harness.start("k", "v")

    assert seen == [("in", 3, 17, 99)]


def forward_to(target: str | None) -> Callable[[StreamsBuilder], None]:
    class Router(BaseProcessor):
        def process(self, record: Record) -> None:
            self.context.forward(record, to=target)

    def define(b: StreamsBuilder) -> None:
        stream = b.stream("in").process(Router)
        stream.map_values(lambda v: f"a-{v}", name="a").to("out")
        stream.map_values(lambda v: f"b-{v}", name="b").to("out")

    return define


def test_forward_to_a_named_child_reaches_only_that_child() -> None:
    harness = build(forward_to("b"))

    harness.start("k", 1)

    assert harness.collector.values() == ["b-1"]


def test_forward_without_a_target_reaches_every_child() -> None:
    harness = build(forward_to(None))

    harness.start("k", 1)

    assert harness.collector.values() == ["a-1", "b-1"]


def test_forward_to_an_unknown_child_raises_value_error_listing_the_children() -> None:
    harness = build(forward_to("c"))

    with pytest.raises(ValueError, match=r"has no child named 'c' \(children: \['a', 'b'\]\)"):
        harness.start("k", 1)


def test_commit_from_a_processor_requests_a_commit() -> None:
    class Committing(BaseProcessor):
        def process(self, record: Record) -> None:
            self.context.commit()

    builder = StreamsBuilder()
    builder.stream("in").process(Committing)
    harness = TaskHarness(builder.build())

    harness.start("k", 1)

    assert harness.context.commit_requested is True


def test_closing_the_graph_closes_its_processors() -> None:
    closed: list[str] = []

    class Closing(BaseProcessor):
        def process(self, record: Record) -> None:
            pass

        def close(self) -> None:
            closed.append("closed")

    builder = StreamsBuilder()
    builder.stream("in").process(Closing)
    harness = TaskHarness(builder.build())

    harness.graph.close()

    assert closed == ["closed"]


# -- failures ------------------------------------------------------------------------------------


async def fail_on_one(value: int) -> int:
    await yield_once()
    if value == 1:
        raise ValueError("bad value 1")
    return value


class ForwardThenFail(BaseProcessor):
    def process(self, record: Record) -> None:
        self.context.forward(record)
        raise ValueError("failed after forwarding")


class ForwardThenFailAsync(BaseProcessor):
    async def process(self, record: Record) -> None:
        self.context.forward(record)
        raise ValueError("failed after forwarding")


@pytest.mark.asyncio
async def test_failure_in_an_async_stage_is_raised_by_drain() -> None:
    harness = build(lambda b: b.stream("in").map_values(fail_on_one).to("out"))

    with pytest.raises(ValueError, match="bad value 1"):
        await harness.pipe("k", 1)


def test_forwarder_names_the_sync_node_that_raised() -> None:
    harness = build(lambda b: b.stream("in").map_values(lambda v: 1 // v).to("out"))

    with pytest.raises(ZeroDivisionError):
        harness.start("k", 0)

    assert harness.forwarder.node is not None
    assert harness.forwarder.node.name == "KSTREAM-MAPVALUES-0000000001"


@pytest.mark.asyncio
async def test_forwarder_names_the_async_node_that_raised() -> None:
    harness = build(lambda b: b.stream("in").peek(lambda k, v: None).map_values(fail_on_one).to("out"))

    with pytest.raises(ValueError):
        await harness.pipe("k", 1)

    assert harness.forwarder.node is not None
    assert harness.forwarder.node.name == "KSTREAM-MAPVALUES-0000000002"


def test_forwarder_names_the_processor_that_raised_after_forwarding() -> None:
    builder = StreamsBuilder()
    builder.stream("in").process(ForwardThenFail, name="failing").to("out")
    harness = TaskHarness(builder.build())

    with pytest.raises(ValueError):
        harness.start("k", 1)

    assert harness.forwarder.node is not None
    assert harness.forwarder.node.name == "failing"


@pytest.mark.asyncio
async def test_forwarder_runs_the_next_record_normally_after_a_failure_and_reset() -> None:
    harness = build(lambda b: b.stream("in").flat_map_values(lambda v: [v, v + 1]).map_values(fail_on_one).to("out"))
    with pytest.raises(ValueError):
        await harness.pipe("k", 1)

    harness.forwarder.reset()
    await harness.pipe("k", 5)

    assert not harness.forwarder.pending
    assert harness.collector.values() == [5, 6]


def unawaited_coroutine_warnings(scenario: Callable[[], Awaitable[None]]) -> list[str]:
    """Run ``scenario`` and collect garbage; the "never awaited" warnings it left behind."""
    messages: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(scenario())
        # A recorded warning keeps its coroutine (and what that holds) alive; drop it and collect again.
        for _ in range(3):
            gc.collect()
            messages += [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
            caught.clear()
    return messages


def test_failed_drain_leaves_no_coroutine_unawaited_after_reset() -> None:
    async def scenario() -> None:
        harness = build(lambda b: b.stream("in").process(ForwardThenFailAsync).map_values(fail_on_one).to("out"))
        with contextlib.suppress(ValueError):
            await harness.pipe("k", 2)
        harness.forwarder.reset()

    assert unawaited_coroutine_warnings(scenario) == []


def values_then_failure(value: int) -> Iterator[int]:
    yield value
    raise ValueError("failed on the second value")


def test_reset_after_a_failed_start_leaves_no_coroutine_unawaited() -> None:
    async def scenario() -> None:
        harness = build(lambda b: b.stream("in").flat_map_values(values_then_failure).map_values(fail_on_one).to("out"))
        with contextlib.suppress(ValueError):
            harness.start("k", 2)  # queues the async map of 2, then the generator raises
        harness.forwarder.reset()

    assert unawaited_coroutine_warnings(scenario) == []


# -- a sink whose send needs to wait ----------------------------------------------------------


class LookupSend:
    """What ``RecordCollector.send`` returns for a topic whose partition count it must look up first."""

    def __init__(self, collector: DeferringCollector, sent: Sent) -> None:
        self._collector = collector
        self._sent = sent

    def __await__(self) -> Generator[Any, None, None]:
        self._collector.sent.append(self._sent)
        return
        yield  # pragma: no cover - makes this a generator


class DeferringCollector(RecordingCollector):
    def send(self, topic, record, sink):  # type: ignore[no-untyped-def]
        return LookupSend(self, Sent(topic, record.key, record.value, sink.name))


@pytest.mark.asyncio
async def test_sink_awaits_a_send_that_has_to_look_up_its_topic() -> None:
    builder = StreamsBuilder()
    builder.stream("in").to(lambda key, value, record: "dynamic")
    harness = TaskHarness(builder.build(), collector=DeferringCollector())

    await harness.pipe("k", 1)

    assert harness.collector.values() == [1]


# -- any mix of sync and async stages runs like a plain sequential run ---------------------------


@dataclass(frozen=True)
class Stage:
    """One stage of a random linear pipeline; ``is_async`` picks ``def`` or ``async def``."""

    kind: str
    is_async: bool
    param: int


STAGE = st.builds(
    Stage,
    st.sampled_from(["filter", "map_values", "flat_map", "peek", "process", "split", "fan_out"]),
    st.booleans(),
    st.integers(min_value=0, max_value=3),
)


def model_outputs(stage: Stage, key: int, value: int) -> list[tuple[int, int]]:
    """What one stage emits for one record, per the DSL's documentation."""
    if stage.kind == "filter":
        return [(key, value)] if (value + stage.param) % 3 else []
    if stage.kind == "map_values":
        return [(key, value * 2 + stage.param)]
    if stage.kind == "flat_map":
        return [(key + i, value + i) for i in range(stage.param)]
    if stage.kind == "peek":
        return [(key, value)]
    if stage.kind == "process":
        return [(key, value * 10 + i) for i in range(stage.param)]
    if stage.kind == "split":
        branch = 1 if value % 2 == 0 else 2 if value % 3 == 0 else 0
        return [(key, value * 10 + branch)]
    if stage.kind == "fan_out":
        return [(key, value + 100), (key, value + 200)]
    raise AssertionError(stage.kind)


def run_sequentially(stages: Sequence[Stage], inputs: Sequence[tuple[int, int]]) -> tuple[list[Any], list[Any]]:
    """The reference: each record runs depth-first to the end before the next one starts."""
    outputs: list[tuple[int, int]] = []
    calls: list[tuple[int, int]] = []

    def run(index: int, key: int, value: int) -> None:
        if index == len(stages):
            outputs.append((key, value))
            return
        calls.append((index, value))
        for out_key, out_value in model_outputs(stages[index], key, value):
            run(index + 1, out_key, out_value)

    for key, value in inputs:
        run(0, key, value)
    return outputs, calls


def add_stage(stream: KStream, index: int, stage: Stage, calls: list[tuple[int, int]]) -> KStream:
    """Append ``stage`` to ``stream`` as DSL nodes, logging each user-function call as ``(index, value)``."""

    def maybe_async(fn: Callable[..., Any]) -> Callable[..., Any]:
        if not stage.is_async:
            return fn

        async def wrapped(*args: Any) -> Any:
            await yield_once()
            return fn(*args)

        return wrapped

    def logged(fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            calls.append((index, args[-1]))
            return fn(*args)

        return call

    def emits(key: Any, value: Any) -> list[tuple[int, int]]:
        return model_outputs(stage, key, value)

    if stage.kind == "filter":
        return stream.filter(maybe_async(logged(lambda k, v: bool(emits(k, v)))))
    if stage.kind == "map_values":
        return stream.map_values(maybe_async(logged(lambda v: emits(0, v)[0][1])))
    if stage.kind == "flat_map":
        return stream.flat_map(maybe_async(logged(emits)))
    if stage.kind == "peek":
        return stream.peek(maybe_async(logged(lambda k, v: None)))
    if stage.kind == "process":
        processor = ForwardEachAsync if stage.is_async else ForwardEach
        return stream.process(lambda: processor(index, stage, calls))
    if stage.kind == "split":
        # The predicates are pure; the call is logged by a peek in front of the split.
        peeked = stream.peek(maybe_async(logged(lambda k, v: None)))
        branches = (
            peeked.split()
            .branch(maybe_async(lambda k, v: v % 2 == 0))
            .branch(maybe_async(lambda k, v: v % 3 == 0))
            .default_branch()
        )
        tagged = [s.map_values(lambda v, tag=int(name): v * 10 + tag) for name, s in branches.items()]
        return tagged[0].merge(tagged[1]).merge(tagged[2])
    if stage.kind == "fan_out":
        peeked = stream.peek(maybe_async(logged(lambda k, v: None)))
        first = peeked.map_values(maybe_async(lambda v: v + 100))
        second = peeked.map_values(maybe_async(lambda v: v + 200))
        return first.merge(second)
    raise AssertionError(stage.kind)


class ForwardEach(BaseProcessor):
    """A Processor API stage with a plain ``process`` that forwards each of its outputs."""

    def __init__(self, index: int, stage: Stage, calls: list[tuple[int, int]]) -> None:
        self.index = index
        self.stage = stage
        self.calls = calls

    def process(self, record: Record) -> None:
        self.calls.append((self.index, record.value))
        for key, value in model_outputs(self.stage, record.key, record.value):
            self.context.forward(Record(key, value, record.timestamp))


class ForwardEachAsync(ForwardEach):
    """The same with ``async def process``, awaiting before, between and after its forwards."""

    async def process(self, record: Record) -> None:  # type: ignore[override]
        self.calls.append((self.index, record.value))
        for key, value in model_outputs(self.stage, record.key, record.value):
            await yield_once()
            self.context.forward(Record(key, value, record.timestamp))
        await yield_once()


async def run_on_the_engine(stages: Sequence[Stage], inputs: Sequence[tuple[int, int]]) -> tuple[list[Any], list[Any]]:
    calls: list[tuple[int, int]] = []
    builder = StreamsBuilder()
    stream = builder.stream("in")
    for index, stage in enumerate(stages):
        stream = add_stage(stream, index, stage, calls)
    stream.to("out")
    harness = TaskHarness(builder.build())
    for key, value in inputs:
        await harness.pipe(key, value)
    return [(s.key, s.value) for s in harness.collector.sent], calls


@settings(max_examples=150, deadline=None)
@given(
    stages=st.lists(STAGE, max_size=6),
    inputs=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 50)), max_size=6),
)
def test_any_mix_of_sync_and_async_stages_keeps_the_order_of_a_sequential_run(
    stages: list[Stage], inputs: list[tuple[int, int]]
) -> None:
    expected = run_sequentially(stages, inputs)

    actual = asyncio.run(run_on_the_engine(stages, inputs))

    assert actual[0] == expected[0], "sink output"
    assert actual[1] == expected[1], "order of the user-function calls"
