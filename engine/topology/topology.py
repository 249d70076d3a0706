"""``Topology``: the processor graph, its sub-topologies, and one graph per task.

A topology is a set of node specs (sources, processors, sinks) with parent
links. Nodes connected through edges form a sub-topology; sub-topologies are
numbered in the order of their first source. A task is (sub-topology,
partition): each task gets its own instances of the sub-topology's nodes, built
by ``build_task_graph``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from engine.errors import TopologyError
from engine.processors.api import ProcessorSupplier
from engine.processors.context import NodeContext, TaskContext
from engine.serdes import BytesSerde, Serde, as_serde
from engine.topology.nodes import Node, Partitioner, ProcessorNode, SinkNode, SourceNode

if TYPE_CHECKING:
    from engine.collector import RecordCollector


class NodeKind(Enum):
    SOURCE = "Source"
    PROCESSOR = "Processor"
    SINK = "Sink"


@dataclass
class NodeSpec:
    name: str
    kind: NodeKind
    parents: tuple[str, ...]
    factory: Callable[[], Node]
    topics: tuple[str, ...] = ()
    sink_topic: str | Callable[..., str] | None = None
    key_serde: Serde | None = None
    value_serde: Serde | None = None
    children: list[str] = field(default_factory=list)
    concurrency: int | Callable[[Mapping[str, Any]], int] | None = None
    ordering: str | None = None


ORDERINGS = ("partition", "key", "unordered")  # strictest first


@dataclass(frozen=True)
class SubTopology:
    id: int
    node_names: tuple[str, ...]
    source_topics: tuple[str, ...]
    sink_topics: tuple[str, ...]


@dataclass
class TaskGraph:
    """One task's node instances: sources by topic, every node in build order."""

    sources: dict[str, SourceNode]
    nodes: list[Node]
    sinks: list[SinkNode]

    def close(self) -> None:
        for node in self.nodes:
            node.close()


class Topology:
    """The low-level topology API; ``StreamsBuilder`` builds one of these."""

    def __init__(self) -> None:
        self._specs: dict[str, NodeSpec] = {}
        self._subtopologies: list[SubTopology] | None = None

    # -- building -----------------------------------------------------------
    def _add(self, spec: NodeSpec) -> None:
        if spec.name in self._specs:
            raise TopologyError(f"Processor '{spec.name}' is already added to the topology")
        for parent in spec.parents:
            if parent not in self._specs:
                raise TopologyError(f"Parent '{parent}' of '{spec.name}' is not in the topology")
            if self._specs[parent].kind is NodeKind.SINK:
                raise TopologyError(f"Sink '{parent}' cannot be the parent of '{spec.name}'")
        self._specs[spec.name] = spec
        for parent in spec.parents:
            self._specs[parent].children.append(spec.name)
        self._subtopologies = None

    def add_source(
        self,
        name: str,
        topics: Sequence[str] | str,
        key_serde: Serde | None = None,
        value_serde: Serde | None = None,
    ) -> Topology:
        topics = (topics,) if isinstance(topics, str) else tuple(topics)
        if not topics:
            raise TopologyError(f"Source '{name}' needs at least one topic")
        for spec in self._specs.values():
            clash = set(spec.topics) & set(topics)
            if clash:
                raise TopologyError(f"Topics {sorted(clash)} are already read by source '{spec.name}'")
        ks = None if key_serde is None else as_serde(key_serde, f"key serde of '{name}'")
        vs = None if value_serde is None else as_serde(value_serde, f"value serde of '{name}'")
        self._add(NodeSpec(name, NodeKind.SOURCE, (), lambda: SourceNode(name, topics, BytesSerde(), BytesSerde()),
                           topics=topics, key_serde=ks, value_serde=vs))
        return self

    def add_processor(self, name: str, supplier: ProcessorSupplier, *parents: str) -> Topology:
        if not parents:
            raise TopologyError(f"Processor '{name}' needs at least one parent")
        if not callable(supplier):
            raise TopologyError(f"Processor '{name}' needs a supplier (a callable returning a Processor)")
        self._add(NodeSpec(name, NodeKind.PROCESSOR, parents, lambda: ProcessorNode(name, supplier())))
        return self

    def add_node(self, name: str, factory: Callable[[], Node], *parents: str) -> Topology:
        """Add a built-in node (used by the DSL)."""
        self._add(NodeSpec(name, NodeKind.PROCESSOR, parents, factory))
        return self

    def add_sink(
        self,
        name: str,
        topic: str | Callable[..., str],
        *parents: str,
        key_serde: Serde | None = None,
        value_serde: Serde | None = None,
        partitioner: Partitioner | None = None,
    ) -> Topology:
        if not parents:
            raise TopologyError(f"Sink '{name}' needs at least one parent")
        if isinstance(topic, str) and not topic:
            raise TopologyError(f"Sink '{name}' needs a topic name")
        ks = None if key_serde is None else as_serde(key_serde, f"key serde of '{name}'")
        vs = None if value_serde is None else as_serde(value_serde, f"value serde of '{name}'")
        self._add(NodeSpec(name, NodeKind.SINK, parents,
                           lambda: SinkNode(name, topic, BytesSerde(), BytesSerde(), partitioner),
                           sink_topic=topic, key_serde=ks, value_serde=vs))
        return self

    def set_concurrency(self, name: str, concurrency: int | Callable[[Mapping[str, Any]], int] | None,
                        ordering: str | None) -> None:
        """Records of the tasks running ``name`` in flight at once (a per-processor override of
        ``num.threads.per.task`` / ``processing.ordering``, applied to its whole sub-topology).

        ``concurrency`` may be a function of the client's config (a Spark stage's window
        depends on ``spark.batch.*`` keys), resolved when a task is created."""
        if concurrency is not None and not callable(concurrency) and (
                isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1):
            raise TopologyError(f"concurrency of '{name}' must be an int >= 1, got {concurrency!r}")
        if ordering is not None and ordering not in ORDERINGS:
            raise TopologyError(f"ordering of '{name}' must be one of {list(ORDERINGS)}, got {ordering!r}")
        spec = self._specs[name]
        spec.concurrency = concurrency
        spec.ordering = ordering

    def concurrency_of(self, subtopology: int,
                       config: Mapping[str, Any] | None = None) -> tuple[int | None, str | None]:
        """The largest concurrency and the strictest ordering its processors ask for (None: config)."""
        specs = [self._specs[n] for n in self.subtopologies[subtopology].node_names]
        counts = [s.concurrency(config or {}) if callable(s.concurrency) else s.concurrency
                  for s in specs if s.concurrency is not None]
        orders = [s.ordering for s in specs if s.ordering is not None]
        ordering = min(orders, key=ORDERINGS.index) if orders else None
        return (max(counts) if counts else None), ordering

    # -- structure ----------------------------------------------------------
    @property
    def subtopologies(self) -> list[SubTopology]:
        if self._subtopologies is None:
            self._subtopologies = self._group()
        return self._subtopologies

    def _group(self) -> list[SubTopology]:
        parent_of: dict[str, str] = {name: name for name in self._specs}

        def root(name: str) -> str:
            while parent_of[name] != name:
                parent_of[name] = parent_of[parent_of[name]]
                name = parent_of[name]
            return name

        for spec in self._specs.values():
            for parent in spec.parents:
                parent_of[root(spec.name)] = root(parent)
        groups: dict[str, list[str]] = {}
        for name in self._specs:  # insertion order = creation order
            groups.setdefault(root(name), []).append(name)
        result: list[SubTopology] = []
        for names in groups.values():
            sources = [n for n in names if self._specs[n].kind is NodeKind.SOURCE]
            if not sources:
                raise TopologyError(f"Nodes {names} are not connected to any source")
            topics = tuple(t for n in sources for t in self._specs[n].topics)
            sinks = tuple(
                self._specs[n].sink_topic for n in names
                if self._specs[n].kind is NodeKind.SINK and isinstance(self._specs[n].sink_topic, str)
            )
            result.append(SubTopology(len(result), tuple(names), topics, sinks))  # type: ignore[arg-type]
        return result

    @property
    def source_topics(self) -> list[str]:
        return [t for s in self.subtopologies for t in s.source_topics]

    @property
    def sink_topics(self) -> list[str]:
        return sorted({t for s in self.subtopologies for t in s.sink_topics})

    def validate(self) -> None:
        if not self._specs:
            raise TopologyError("The topology is empty: add at least one source")
        _ = self.subtopologies

    def subtopology_of(self, topic: str) -> SubTopology:
        for sub in self.subtopologies:
            if topic in sub.source_topics:
                return sub
        raise TopologyError(f"Topic '{topic}' is not a source of this topology")

    def build_task_graph(
        self,
        subtopology: int,
        context: TaskContext,
        collector: RecordCollector,
        default_key_serde: Serde,
        default_value_serde: Serde,
    ) -> TaskGraph:
        """Fresh node instances for one task, wired, initialised and bound to its context."""
        sub = self.subtopologies[subtopology]
        nodes: dict[str, Node] = {}
        for name in sub.node_names:
            spec = self._specs[name]
            node = spec.factory()
            if isinstance(node, SourceNode):
                node.key_serde = spec.key_serde or default_key_serde
                node.value_serde = spec.value_serde or default_value_serde
            elif isinstance(node, SinkNode):
                node.key_serde = spec.key_serde or default_key_serde
                node.value_serde = spec.value_serde or default_value_serde
                node.collector = collector
            nodes[name] = node
        for name, node in nodes.items():
            node.children = [nodes[c] for c in self._specs[name].children]
            node.init(context.forwarder)
        for node in nodes.values():
            if isinstance(node, ProcessorNode):
                node.processor.init(NodeContext(context, node))
        sources = {t: n for n in nodes.values() if isinstance(n, SourceNode) for t in n.topics}
        sinks = [n for n in nodes.values() if isinstance(n, SinkNode)]
        return TaskGraph(sources, list(nodes.values()), sinks)

    # -- description ----------------------------------------------------------
    def describe(self) -> str:
        """The topology in Kafka Streams' ``TopologyDescription`` text form."""
        lines = ["Topologies:"]
        for sub in self.subtopologies:
            lines.append(f"   Sub-topology: {sub.id}")
            for name in sub.node_names:
                spec = self._specs[name]
                if spec.kind is NodeKind.SOURCE:
                    lines.append(f"    Source: {name} (topics: [{', '.join(spec.topics)}])")
                elif spec.kind is NodeKind.SINK:
                    topic = spec.sink_topic if isinstance(spec.sink_topic, str) else "<extractor>"
                    lines.append(f"    Sink: {name} (topic: {topic})")
                else:
                    lines.append(f"    Processor: {name} (stores: [])")
                if spec.kind is not NodeKind.SINK:
                    lines.append(f"      --> {', '.join(spec.children) or 'none'}")
                if spec.parents:
                    lines.append(f"      <-- {', '.join(spec.parents)}")
            lines.append("")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()

    def node_names(self) -> Iterable[str]:
        return self._specs.keys()

    def spec(self, name: str) -> NodeSpec:
        return self._specs[name]


def check_copartitioning(topology: Topology, partition_counts: Mapping[str, int]) -> dict[int, int]:
    """Partitions (= tasks) per sub-topology; its source topics must have equal counts."""
    result: dict[int, int] = {}
    for sub in topology.subtopologies:
        counts = {t: partition_counts[t] for t in sub.source_topics if t in partition_counts}
        if len(set(counts.values())) > 1:
            raise TopologyError(
                f"Source topics of sub-topology {sub.id} must have the same number of partitions, got {counts}"
            )
        result[sub.id] = max(counts.values(), default=0)
    return result


