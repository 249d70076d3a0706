"""``Topology``: the processor graph, its sub-topologies, and one graph per task.

A topology is a set of node specs (sources, processors, sinks) with parent
links. Nodes connected through edges form a sub-topology; sub-topologies are
numbered in the order of their first source. A task is (sub-topology,
partition): each task gets its own instances of the sub-topology's nodes, built
by ``build_task_graph``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from streamloop.errors import MissingSerdeError, TopologyError
from streamloop.processors.api import ProcessorSupplier
from streamloop.processors.context import NodeContext, TaskContext
from streamloop.processors.nodes import (
    Node,
    Partitioner,
    PassThroughNode,
    ProcessorNode,
    SinkNode,
    SourceNode,
    processor_node,
)
from streamloop.processors.partitioners import StreamPartitioner, multicast_of
from streamloop.serdes import BytesSerde, Serde, as_serde
from streamloop.state.global_store import GlobalStoreSpec
from streamloop.state.stores import StoreBuilder
from streamloop.timestamps import FailOnInvalidTimestamp, TimestampExtractor, as_extractor
from streamloop.topology.describe import callable_name, describe
from streamloop.topology.internal_topics import internal_topics
from streamloop.topology.patterns import as_pattern, check_not_joined, subscription_pattern
from streamloop.topology.patterns import resolve as resolve_patterns
from streamloop.topology.specs import ORDERINGS, NodeKind, NodeSpec, SubTopology, TaskGraph

if TYPE_CHECKING:
    from streamloop.collector import RecordCollector
    from streamloop.state.task_state import TaskStateManager


class Topology:
    """The low-level topology API; ``StreamsBuilder`` builds one of these."""

    def __init__(self) -> None:
        self._specs: dict[str, NodeSpec] = {}
        self._subtopologies: list[SubTopology] | None = None
        self._stores: dict[str, StoreBuilder] = {}
        # Stores added only once a processor is given access to them (add_state_store_on_demand):
        # the store's builder and the processors it is for.
        self._on_demand: dict[str, tuple[StoreBuilder, tuple[str, ...]]] = {}
        self.application_id: str | None = None
        # Joins whose inputs must be co-partitioned: (operation, nodes); see streamloop.topology.copartition.
        self.copartition_groups: list[tuple[str, tuple[str, ...]]] = []
        # Global tables' stores by name: outside every sub-topology (streamloop.topology.global_tables).
        self.global_stores: dict[str, GlobalStoreSpec] = {}
        # Sub-topologies reading by pattern whose internal topics were created for this many tasks
        # (internal_topics): a matched topic with more partitions would have tasks without them.
        self.pattern_task_limits: dict[int, int] = {}
        # Spark stages' read= and where they sit, by stage (streamloop.spark.kafka_source.StageRead):
        # the client checks them against spark.batch.read when it is created.
        self.spark_reads: dict[str, Any] = {}

    # -- building -----------------------------------------------------------
    def _add(self, spec: NodeSpec) -> None:
        if spec.name in self._specs:
            raise TopologyError(f"Processor '{spec.name}' is already added to the topology")
        for parent in spec.parents:
            if parent not in self._specs:
                raise TopologyError(f"Parent '{parent}' of '{spec.name}' is not in the topology")
            if self._specs[parent].kind is NodeKind.SINK:
                raise TopologyError(f"Sink '{parent}' cannot be the parent of '{spec.name}'")
        for store in spec.stores:
            self._demand(store)
        self._specs[spec.name] = spec
        for parent in spec.parents:
            self._specs[parent].children.append(spec.name)
        self._subtopologies = None

    def add_source(
        self,
        name: str,
        topics: Sequence[str] | str | re.Pattern[str],
        key_serde: Serde | type | None = None,
        value_serde: Serde | type | None = None,
        internal: bool = False,
        timestamp_extractor: object = None,
    ) -> Topology:
        """Add a source of ``topics``: a name, several, or a compiled pattern (every topic it matches
        in full, now and later: streamloop.topology.patterns); ``timestamp_extractor`` (an
        extractor, its class or dotted path) overrides ``default.timestamp.extractor`` for its records."""
        pattern = as_pattern(topics)
        if pattern is not None:
            topics = ()
        else:
            topics = (topics,) if isinstance(topics, str) else tuple(cast("Sequence[str]", topics))
            if not topics:
                raise TopologyError(f"Source '{name}' needs at least one topic")
        for spec in self._specs.values():
            clash = set(spec.topics) & set(topics)
            if clash:
                raise TopologyError(f"Topics {sorted(clash)} are already read by source '{spec.name}'")
        self._check_not_global(name, topics)
        ks = None if key_serde is None else as_serde(key_serde, f"key serde of '{name}'")
        vs = None if value_serde is None else as_serde(value_serde, f"value serde of '{name}'")
        try:
            extractor = None if timestamp_extractor is None else as_extractor(
                timestamp_extractor, f"timestamp extractor of source '{name}'")
        except ValueError as exc:
            raise TopologyError(str(exc)) from exc
        self._add(NodeSpec(name, NodeKind.SOURCE, (), lambda: SourceNode(name, topics, BytesSerde(), BytesSerde()),
                           topics=topics, key_serde=ks, value_serde=vs, internal=internal,
                           timestamp_extractor=extractor, pattern=pattern))
        return self

    # -- sources by pattern (streamloop.topology.patterns) -------------------------
    @property
    def has_patterns(self) -> bool:
        return any(spec.pattern is not None for spec in self._specs.values())

    def resolve_patterns(self, available: Iterable[str]) -> bool:
        """The pattern sources read the topics of ``available`` they match; True if that changed."""
        return resolve_patterns(self, available)

    def subscription_pattern(self) -> re.Pattern[str]:
        """The one pattern a stream thread subscribes with when a source reads by pattern."""
        named = [t for spec in self._specs.values() if spec.pattern is None for t in spec.topics]
        return subscription_pattern(named, [s.pattern for s in self._specs.values() if s.pattern is not None])

    @property
    def required_source_topics(self) -> list[str]:
        """The source topics that must exist: those named (a pattern may match none)."""
        return [t for spec in self._specs.values() if spec.kind is NodeKind.SOURCE and spec.pattern is None
                for t in spec.topics]

    def topics_changed(self) -> None:
        """A pattern source's topics changed: the sub-topologies' topics are derived again."""
        self._subtopologies = None

    def add_processor(self, name: str, supplier: ProcessorSupplier, *parents: str,
                      stores: Sequence[str] = ()) -> Topology:
        """Add a processor; ``stores`` names the state stores it may use (added with ``add_state_store``)."""
        if not parents:
            raise TopologyError(f"Processor '{name}' needs at least one parent")
        if not callable(supplier):
            raise TopologyError(f"Processor '{name}' needs a supplier (a callable returning a Processor)")
        self._add(NodeSpec(name, NodeKind.PROCESSOR, parents, lambda: processor_node(name, supplier()),
                           stores=tuple(stores)))
        return self

    def add_node(self, name: str, factory: Callable[[], Node], *parents: str) -> Topology:
        """Add a built-in node (used by the DSL)."""
        self._add(NodeSpec(name, NodeKind.PROCESSOR, parents, factory))
        return self

    # -- state stores ---------------------------------------------------------------
    def add_state_store(self, builder: StoreBuilder, *processor_names: str) -> Topology:
        """Add a store (one instance per task) and give the named processors access to it."""
        if not isinstance(builder, StoreBuilder):
            raise TopologyError(f"add_state_store needs a StoreBuilder (from Stores), got {builder!r}")
        if builder.name in self._stores or builder.name in self.global_stores or builder.name in self._on_demand:
            raise TopologyError(f"State store '{builder.name}' is already added to the topology")
        self._stores[builder.name] = builder
        self.connect_processor_and_state_stores_all(processor_names, builder.name)
        return self

    def add_state_store_on_demand(self, builder: StoreBuilder, *processor_names: str) -> Callable[[], bool]:
        """Add ``builder``'s store for ``processor_names`` only when another processor is given
        access to it, or ``demand_stores_of`` one of them is called (a table operation downstream
        needs the values its updates replace). Kafka Streams keeps a table that was not asked to be
        materialized (a foreign-key join's result) in a store only then (``KTableSource.materialize``).
        Returns whether the store was added: the processors' factories, called once the topology is
        built, ask it to decide whether they keep the store."""
        if builder.name in self._stores or builder.name in self.global_stores or builder.name in self._on_demand:
            raise TopologyError(f"State store '{builder.name}' is already added to the topology")
        self._on_demand[builder.name] = (builder, processor_names)
        name = builder.name
        return lambda: name in self._stores

    def demand_stores_of(self, processor_name: str) -> None:
        """Add the stores on demand (``add_state_store_on_demand``) that are for ``processor_name``."""
        for store, (_builder, owners) in list(self._on_demand.items()):
            if processor_name in owners:
                self._demand(store)

    def _demand(self, store: str) -> None:
        wanted = self._on_demand.pop(store, None)
        if wanted is not None:
            builder, owners = wanted
            self.add_state_store(builder, *owners)

    def connect_processor_and_state_stores(self, processor_name: str, *store_names: str) -> Topology:
        """Give an existing processor access to existing stores."""
        spec = self._specs.get(processor_name)
        if spec is None or spec.kind is not NodeKind.PROCESSOR:
            raise TopologyError(f"Processor '{processor_name}' is not in the topology")
        for store in store_names:
            self._demand(store)
            if store not in self._stores:
                raise TopologyError(f"State store '{store}' of processor '{processor_name}' is not added "
                                    "to the topology (add_state_store)")
            if store not in spec.stores:
                spec.stores = (*spec.stores, store)
        self._subtopologies = None
        return self

    def connect_processor_and_state_stores_all(self, processor_names: Iterable[str], store: str) -> None:
        for name in processor_names:
            self.connect_processor_and_state_stores(name, store)

    def add_global_store(self, spec: GlobalStoreSpec) -> Topology:
        """A global table's store, filled from ``spec.topic`` by the client's global thread."""
        if spec.name in self._stores or spec.name in self.global_stores:
            raise TopologyError(f"State store '{spec.name}' is already added to the topology")
        if spec.source in self._specs or any(s.source == spec.source for s in self.global_stores.values()):
            raise TopologyError(f"Processor '{spec.source}' is already added to the topology")
        readers = [s.name for s in self._specs.values() if spec.topic in s.topics]
        self._check_not_global(spec.source, (spec.topic,))
        if readers:
            raise TopologyError(f"Topics ['{spec.topic}'] are already read by source '{readers[0]}'")
        self.global_stores[spec.name] = spec
        return self

    def _check_not_global(self, source: str, topics: Iterable[str]) -> None:
        for spec in self.global_stores.values():
            if spec.topic in topics:
                raise TopologyError(f"Topics ['{spec.topic}'] are already read by global source '{spec.source}' "
                                    f"(source '{source}' cannot read them too)")

    @property
    def global_topics(self) -> list[str]:
        return [spec.topic for spec in self.global_stores.values()]

    def store_builder(self, name: str) -> StoreBuilder:
        return self._stores[name]

    @property
    def store_names(self) -> list[str]:
        return list(self._stores)

    def stores_of(self, subtopology: int) -> list[StoreBuilder]:
        """The stores the sub-topology's processors use, in the order they were added."""
        names = {s for n in self.subtopologies[subtopology].node_names for s in self._specs[n].stores}
        return [b for name, b in self._stores.items() if name in names]

    def subtopology_of_store(self, store: str) -> SubTopology:
        for sub in self.subtopologies:
            if any(store in self._specs[n].stores for n in sub.node_names):
                return sub
        raise TopologyError(f"State store '{store}' is not used by any processor")

    # -- internal topics ------------------------------------------------------------
    def set_application_id(self, application_id: str) -> None:
        """Name the internal topics after the application (done by ``KafkaStreams``)."""
        if self.application_id == application_id:
            return
        if self.application_id is not None:
            raise TopologyError(f"This topology is already used by application '{self.application_id}'; "
                                f"build another one for '{application_id}'")
        self.application_id = application_id
        for spec in self._specs.values():
            if spec.internal and spec.pattern is None:
                spec.topics = tuple(f"{application_id}-{t}" for t in spec.topics)
                if isinstance(spec.sink_topic, str):
                    spec.sink_topic = f"{application_id}-{spec.sink_topic}"
        self._subtopologies = None

    def fix_partitions(self, source: str, partitions: int) -> None:
        """The repartition topic ``source`` reads gets ``partitions`` partitions (``repartition()``)."""
        self._specs[source].partitions = partitions

    def fixed_partitions(self) -> dict[str, int]:
        """Repartition topics whose partition count is fixed, with it."""
        return {t: spec.partitions for spec in self._specs.values()
                if spec.internal and spec.kind is NodeKind.SOURCE and spec.partitions is not None for t in spec.topics}

    def repartition_topics(self) -> list[str]:
        return [t for spec in self._specs.values() if spec.internal and spec.kind is NodeKind.SOURCE
                for t in spec.topics]

    def internal_topics(self, source_partitions: Mapping[str, int]) -> dict[str, tuple[int, dict[str, str]]]:
        """Repartition and changelog topics to create: name -> (partitions, topic configs)
        (``streamloop.topology.internal_topics``)."""
        return internal_topics(self, source_partitions)

    def add_sink(
        self,
        name: str,
        topic: str | Callable[..., str],
        *parents: str,
        key_serde: Serde | None = None,
        value_serde: Serde | None = None,
        partitioner: Partitioner | StreamPartitioner | None = None,
        internal: bool = False,
        inherited: tuple[bool, bool] = (False, False),
        kinds: tuple[str | None, str | None] = (None, None),
        call: str | None = "add_sink()",
    ) -> Topology:
        """A sink writing to ``topic``; a serde left None is ``default.key.serde``/``default.value.serde``.

        The DSL passes the stream's known serdes (``inherited`` says which are those), the
        ``kinds`` of keys/values known never to be bytes, and the ``call`` that takes serdes.
        """
        if not parents:
            raise TopologyError(f"Sink '{name}' needs at least one parent")
        if isinstance(topic, str) and not topic:
            raise TopologyError(f"Sink '{name}' needs a topic name")
        ks = None if key_serde is None else as_serde(key_serde, f"key serde of '{name}'")
        vs = None if value_serde is None else as_serde(value_serde, f"value serde of '{name}'")
        multicast_of(partitioner, name)  # a wrong one is refused now, not at the first record
        self._add(NodeSpec(name, NodeKind.SINK, parents,
                           lambda: SinkNode(name, topic, BytesSerde(), BytesSerde(), partitioner),
                           sink_topic=topic, key_serde=ks, value_serde=vs, internal=internal,
                           inherited=inherited, kinds=kinds, serde_call=call))
        return self

    def check_sink_serdes(self, default_key_serde: object, default_value_serde: object) -> None:
        """Raise ``MissingSerdeError`` for a sink that must write keys or values known never to be
        bytes (a windowed table's keys, a Spark stage's rows) with no serde: none given, none
        known for the stream, and the config default (``default_*_serde``) not set (None).

        Caller: ``KafkaStreams`` and ``TopologyTestDriver`` when created, as the defaults are known.
        """
        for spec in self._specs.values():
            if spec.kind is not NodeKind.SINK:
                continue
            for what, serde, default, kind in (("key", spec.key_serde, default_key_serde, spec.kinds[0]),
                                               ("value", spec.value_serde, default_value_serde, spec.kinds[1])):
                if kind is not None and serde is None and default is None:
                    topic = spec.sink_topic if isinstance(spec.sink_topic, str) else callable_name(spec.sink_topic)
                    raise MissingSerdeError(spec.name, topic, what, kind, spec.serde_call)

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
        # Read once: another stream thread resolving the patterns may reset the cache meanwhile.
        subtopologies = self._subtopologies
        if subtopologies is None:
            subtopologies = self._subtopologies = self._group()
        return subtopologies

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
        # Processors that share a store run in the same task, so they share the one instance.
        first_user: dict[str, str] = {}
        for spec in self._specs.values():
            for store in spec.stores:
                if store in first_user:
                    parent_of[root(spec.name)] = root(first_user[store])
                else:
                    first_user[store] = spec.name
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
                topic for n in names if self._specs[n].kind is NodeKind.SINK
                for topic in (self._specs[n].sink_topic,) if isinstance(topic, str)
            )
            result.append(SubTopology(len(result), tuple(names), topics, sinks))
        return result

    @property
    def source_topics(self) -> list[str]:
        return [t for s in self.subtopologies for t in s.source_topics]

    @property
    def sink_topics(self) -> list[str]:
        return sorted({t for s in self.subtopologies for t in s.sink_topics})

    def validate(self) -> None:
        if not self._specs and not self.global_stores:
            raise TopologyError("The topology is empty: add at least one source")
        for spec in self._specs.values():
            for store in spec.stores:
                if store not in self._stores:
                    raise TopologyError(f"Processor '{spec.name}' uses state store '{store}', which is not "
                                        "added to the topology")
        unused = [name for name in self._stores if not any(name in s.stores for s in self._specs.values())]
        if unused:
            raise TopologyError(f"State stores {unused} are not connected to any processor")
        check_not_joined(self)
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
        state: TaskStateManager | None = None,
        default_timestamp_extractor: TimestampExtractor | None = None,
    ) -> TaskGraph:
        """Fresh node instances for one task, wired, initialised and bound to its context.

        ``state`` holds the task's stores (see ``stores_of``); each processor sees only
        the stores it was connected to. ``default_timestamp_extractor``: the config's (None: the
        records' own timestamps, failing on negative ones, as ``FailOnInvalidTimestamp``).
        """
        sub = self.subtopologies[subtopology]
        context.stores = state.stores if state is not None else {}
        context.default_serdes = (default_key_serde, default_value_serde)
        nodes: dict[str, Node] = {}
        for name in sub.node_names:
            spec = self._specs[name]
            node = spec.factory()
            if isinstance(node, SourceNode):
                node.topics = spec.topics  # internal topics are renamed after the factory was made
                node.key_serde = spec.key_serde or default_key_serde
                node.value_serde = _with_default(spec.value_serde, default_value_serde)
                node.timestamp_extractor = _fast_path(spec.timestamp_extractor or default_timestamp_extractor)
            elif isinstance(node, SinkNode):
                if spec.sink_topic is not None:
                    node.topic = spec.sink_topic
                node.key_serde = spec.key_serde or default_key_serde
                node.value_serde = _with_default(spec.value_serde, default_value_serde)
                node.origins = (_origin(spec.key_serde, spec.inherited[0]),
                                _origin(spec.value_serde, spec.inherited[1]))
                node.serde_call = spec.serde_call
                node.collector = collector
            nodes[name] = node
        for name, node in nodes.items():
            node.children = self._forwarded_to(name, nodes)
            node.init(context.forwarder)
        for node in nodes.values():
            if isinstance(node, ProcessorNode):
                node.processor.init(NodeContext(context, node, self._specs[node.name].stores))
        sources = {t: n for n in nodes.values() if isinstance(n, SourceNode) for t in n.topics}
        sinks = [n for n in nodes.values() if isinstance(n, SinkNode)]
        return TaskGraph(sources, list(nodes.values()), sinks)

    def _forwarded_to(self, name: str, nodes: Mapping[str, Node]) -> list[Node]:
        """The nodes ``name`` forwards to: its children, with each pass-through child (a table's
        ``to_stream``, a ``merge``) replaced by what that forwards to. A pass-through forwards every
        record unchanged, so the records reach the same nodes in the same order, one call and one
        forward fewer per record each (it stays in the graph and its description)."""
        children: list[Node] = []
        for child in self._specs[name].children:
            node = nodes[child]
            if type(node) is PassThroughNode:
                children.extend(self._forwarded_to(child, nodes))
            else:
                children.append(node)
        return children

    # -- description ----------------------------------------------------------
    def describe(self) -> str:
        """The topology in Kafka Streams' ``TopologyDescription`` text form (``streamloop.topology.describe``)."""
        return describe(self)

    def __str__(self) -> str:
        return self.describe()

    def node_names(self) -> Iterable[str]:
        return self._specs.keys()

    def spec(self, name: str) -> NodeSpec:
        return self._specs[name]


def _with_default(serde: Serde | None, default: Serde) -> Serde:
    """``serde``, else ``default``; a serde that wraps one it may lack (a regrouped table's
    ``ChangeSerde``) gets ``default`` as that one."""
    if serde is None:
        return default
    complete = getattr(serde, "with_default", None)
    return serde if complete is None else complete(default)


def _origin(serde: Serde | None, inherited: bool) -> str:
    return "default" if serde is None else "stream" if inherited else "sink"


def _fast_path(extractor: TimestampExtractor | None) -> TimestampExtractor | None:
    """None for the default extractor exactly (not a subclass): the task checks its rule inline."""
    return None if type(extractor) is FailOnInvalidTimestamp else extractor
