"""``GlobalKTable``: ``builder.global_table(topic)`` and the stream joins that read one.

A global table is a full copy of every partition of its topic on every instance
(Kafka Streams' ``GlobalKTable``). It is not part of any sub-topology: no task reads
its topic and it has no changelog (the topic is its log). The client's global thread
(``streamloop.threads.global_thread``) fills its store from the topic's beginning before
any stream thread processes, then keeps it up to date; the test driver writes it as
records are piped to the topic. Joins look a key up in it from any task, so the
stream needs no co-partitioning with the topic and no repartition after a key change.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from streamloop.errors import TopologyError
from streamloop.processors.global_join import GlobalTableJoinProcessor
from streamloop.serdes import Serde, as_serde
from streamloop.state.global_store import GlobalStoreSpec
from streamloop.state.stores import Materialized, StoreBuilder, StoreSupplier

if TYPE_CHECKING:
    from streamloop.topology.builder import KStream, StreamsBuilder


class GlobalKTable:
    """A table of every partition of a topic, on every instance; queryable by ``queryable_store_name``."""

    def __init__(self, topic: str, store: str, key_serde: Serde | None, value_serde: Serde | None) -> None:
        self.topic = topic
        self.queryable_store_name = store
        self._key_serde = key_serde
        self._value_serde = value_serde

    def __repr__(self) -> str:
        return f"GlobalKTable(topic={self.topic!r}, store={self.queryable_store_name!r})"


def global_table(builder: StreamsBuilder, topic: str, key_serde: Serde | type | None,
                 value_serde: Serde | type | None, materialized: Materialized | str | None,
                 name: str | None) -> GlobalKTable:
    """Body of ``StreamsBuilder.global_table``: Kafka Streams' node names (a source and a
    ``KTABLE-SOURCE`` per global table) and a store that is never logged."""
    if not isinstance(topic, str) or not topic:
        raise TopologyError(f"global_table() needs a topic name, got {topic!r}")
    source = builder._name(name, "KSTREAM-SOURCE")
    store = builder._store_name(materialized, f"{source}-STATE-STORE")
    processor = builder._name(None, "KTABLE-SOURCE")
    spec = materialized if isinstance(materialized, Materialized) else Materialized(store)
    if spec.ttl is not None:
        raise TopologyError(f"Store '{store}' of a global table cannot have a time to live (with_ttl): it is "
                            "the topic's copy on every client; expire a table's rows (builder.table) instead")
    # Materialized serdes, where given, are the ones the topic is read with (Kafka Streams'
    # ``globalTable(topic, Materialized.with(...))``): the store keeps the topic's bytes as they are.
    ks = _serde(spec.key_serde, f"key serde of store '{store}'") or _serde(key_serde, f"key serde of '{source}'")
    vs = (_serde(spec.value_serde, f"value serde of store '{store}'")
          or _serde(value_serde, f"value serde of '{source}'"))
    store_builder = StoreBuilder(StoreSupplier(store, spec.persistent), ks, vs, caching=False, logging=False)
    builder._topology.add_global_store(GlobalStoreSpec(store_builder, topic, source, processor))
    return GlobalKTable(topic, store, ks, vs)


def stream_global_join(stream: KStream, table: GlobalKTable, key_selector: Any, joiner: Any, left: bool,
                       name: str | None) -> KStream:
    """Body of ``KStream.join``/``left_join`` with a ``GlobalKTable``; the stream keeps its keys."""
    for fn, what in ((key_selector, "key_selector"), (joiner, "joiner")):
        _plain(fn, f"{'left_join' if left else 'join'}() {what}")
    builder = stream._builder
    node = builder._name(name, "KSTREAM-LEFTJOIN" if left else "KSTREAM-JOIN")
    store = table.queryable_store_name
    builder._topology.add_processor(
        node, lambda: GlobalTableJoinProcessor(store, key_selector, joiner, left), stream._node)
    return builder._stream_at(node, stream._key_changed, stream._key_serde, key_kind=stream._key_kind)


def describe_global_store(spec: GlobalStoreSpec, subtopology: int) -> list[str]:
    """A global table in ``Topology.describe``, as Kafka Streams' ``TopologyDescription`` shows one."""
    return [f"   Sub-topology: {subtopology} for global store (will not generate tasks)",
            f"    Source: {spec.source} (topics: [{spec.topic}])",
            f"      --> {spec.processor}",
            f"    Processor: {spec.processor} (stores: [{spec.name}])",
            "      --> none",
            f"      <-- {spec.source}",
            ""]


def _plain(fn: Callable[..., Any] | Any, what: str) -> None:
    if not callable(fn):
        raise TypeError(f"{what} needs a callable, got {fn!r}")
    if inspect.iscoroutinefunction(fn):
        raise TopologyError(f"{what} must be a plain function (got async {fn!r})")


def _serde(value: Serde | type | None, what: str) -> Serde | None:
    return None if value is None else as_serde(value, what)
