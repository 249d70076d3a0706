"""``StreamsBuilder``: the DSL. Each operation adds a node to a ``Topology``.

Node names follow Kafka Streams (``KSTREAM-FILTER-0000000001``) unless a
``name=`` is given. Every function may be plain or ``async def``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

from streamloop.errors import TopologyError
from streamloop.processors.api import ProcessorSupplier
from streamloop.processors.builtin import (
    BranchNode,
    FilterNode,
    FlatMapNode,
    FlatMapValuesNode,
    ForeachNode,
    MapNode,
    MapValuesNode,
    PeekNode,
    SelectKeyNode,
)
from streamloop.processors.fixed_key import FixedKeyProcessorSupplier
from streamloop.processors.nodes import Node, Partitioner, PassThroughNode
from streamloop.processors.partitioners import StreamPartitioner
from streamloop.serdes import Serde, as_serde
from streamloop.state.join_windows import JoinWindows
from streamloop.state.stores import Materialized, StoreBuilder
from streamloop.topology.branches import BranchedKStream
from streamloop.topology.global_tables import GlobalKTable, global_table, stream_global_join
from streamloop.topology.joins import StreamJoined, stream_stream_join
from streamloop.topology.printed import Printed
from streamloop.topology.produced import Produced, sink_options
from streamloop.topology.repartition import Repartitioned, repartition
from streamloop.topology.spark_stages import ROWS, spark_batch_stage, spark_sink_stage
from streamloop.topology.stream_processors import print_stream, process_values
from streamloop.topology.tables import (
    KGroupedStream,
    KTable,
    store_name_from,
    stream_table_join,
    stream_to_table,
    table_source,
)
from streamloop.topology.topology import Topology


class StreamsBuilder:
    def __init__(self) -> None:
        self._topology = Topology()
        self._index = 0
        self._spark_stages: set[str] = set()

    def _name(self, given: str | None, prefix: str) -> str:
        name = given if given is not None else f"{prefix}-{self._index:010d}"
        self._index += 1
        return name

    # The table side of the DSL (streamloop.topology.tables) makes streams through these two, so
    # that it needs no import of this module (which imports it).
    def _stream_at(self, node: str, key_changed: bool = False, key_serde: Serde | None = None,
                   value_serde: Serde | None = None, key_kind: str | None = None,
                   value_kind: str | None = None) -> KStream:
        """A stream of the records that leave ``node``."""
        return KStream(self, node, key_changed, key_serde, value_serde, key_kind=key_kind, value_kind=value_kind)

    def _add_pass_through(self, node: str, parent: str) -> None:
        """A node that forwards what ``parent`` forwards, unchanged."""
        self._topology.add_node(node, _pass_through(node), parent)

    def stream(
        self,
        topics: str | Sequence[str] | re.Pattern[str],
        *,
        key_serde: Serde | type | None = None,
        value_serde: Serde | type | None = None,
        name: str | None = None,
        timestamp_extractor: object = None,
    ) -> KStream:
        """A stream of the records of ``topics`` (one or several, or ``re.compile(...)``: every topic the
        pattern matches in full, those created later too, see ``streamloop.topology.patterns``);
        ``timestamp_extractor`` (see ``streamloop.timestamps``) overrides ``default.timestamp.extractor``."""
        source = self._name(name, "KSTREAM-SOURCE")
        self._topology.add_source(source, topics, key_serde, value_serde, timestamp_extractor=timestamp_extractor)
        spec = self._topology.spec(source)
        return KStream(self, source, key_serde=spec.key_serde, value_serde=spec.value_serde)

    def table(
        self,
        topic: str,
        *,
        key_serde: Serde | type | None = None,
        value_serde: Serde | type | None = None,
        materialized: Materialized | str | None = None,
        name: str | None = None,
        timestamp_extractor: object = None,
    ) -> KTable:
        """The topic as a table: the latest value per key (a None value deletes the key)."""
        source = self._name(name, "KSTREAM-SOURCE")
        self._topology.add_source(source, topic, key_serde, value_serde, timestamp_extractor=timestamp_extractor)
        ks = None if key_serde is None else as_serde(key_serde, f"key serde of '{source}'")
        vs = None if value_serde is None else as_serde(value_serde, f"value serde of '{source}'")
        return table_source(self, source, materialized, ks, vs)

    def global_table(self, topic: str, *, key_serde: Serde | type | None = None,
                     value_serde: Serde | type | None = None, materialized: Materialized | str | None = None,
                     name: str | None = None) -> GlobalKTable:
        """Every partition of ``topic`` as a table on every instance, filled before processing starts
        (streamloop.topology.global_tables); join streams with it by any key, query it by its store name."""
        return global_table(self, topic, key_serde, value_serde, materialized, name)

    def add_state_store(self, builder: StoreBuilder) -> StreamsBuilder:
        """A store for Processor API processors; connect it with ``process(..., stores=[name])``."""
        self._topology.add_state_store(builder)
        return self

    def _store_name(self, materialized: Materialized | str | None, prefix: str) -> str:
        given = store_name_from(materialized)
        return given if given is not None else self._name(None, prefix)

    def build(self) -> Topology:
        """The topology built so far; raises ``TopologyError`` if it is not usable."""
        self._topology.validate()
        return self._topology


class KStream:
    """A stream of records; each method returns the stream after the new node."""

    def __init__(self, builder: StreamsBuilder, node: str, key_changed: bool = False,
                 key_serde: Serde | None = None, value_serde: Serde | None = None,
                 key_kind: str | None = None, value_kind: str | None = None) -> None:
        self._builder = builder
        self._node = node
        # Set after an operation that may change keys: grouping then repartitions first.
        self._key_changed = key_changed
        # The serdes known to fit the keys and values here (from the source, while unchanged);
        # sinks, grouping and tables use them where none are given, as Kafka Streams does.
        self._key_serde = key_serde
        self._value_serde = value_serde
        # What keys or values are known to be when that is never bytes and no serde is known
        # (a windowed table's keys, a Spark stage's rows): a sink without a serde for them fails
        # when the client is created instead of at its first record.
        self._key_kind = key_kind
        self._value_kind = value_kind

    def _after(self, node: str, changes_key: bool, keeps_value: bool) -> KStream:
        """The stream after ``node``: a serde (and kind) is kept only for what the node leaves unchanged."""
        keeps_key = not changes_key
        return KStream(self._builder, node, self._key_changed or changes_key,
                       self._key_serde if keeps_key else None, self._value_serde if keeps_value else None,
                       self._key_kind if keeps_key else None, self._value_kind if keeps_value else None)

    def _then(self, prefix: str, name: str | None, factory: Callable[[str], Node],
              *functions: Callable[..., Any], concurrency: int | None = None,
              ordering: str | None = None, blocking: bool = False, changes_key: bool = False,
              keeps_value: bool = False) -> KStream:
        for fn in functions:
            if not callable(fn):
                raise TypeError(f"{prefix.split('-', 1)[1].lower()}() needs a callable, got {fn!r}")
        node_name = self._builder._name(name, prefix)
        if blocking:
            # Checked now, not when the first task is built on a stream thread.
            factory(node_name).mark_blocking()  # type: ignore[attr-defined]  # only function nodes are made blocking
        self._builder._topology.add_node(node_name, lambda: _made(factory(node_name), blocking), self._node)
        if concurrency is not None or ordering is not None:
            self._builder._topology.set_concurrency(node_name, concurrency, ordering)
        return self._after(node_name, changes_key, keeps_value)

    def filter(self, predicate: Callable[[Any, Any], Any], *, name: str | None = None,
            concurrency: int | None = None, ordering: str | None = None, blocking: bool = False,
    ) -> KStream:
        """Keep the records for which ``predicate(key, value)`` is true."""
        return self._then("KSTREAM-FILTER", name, lambda n: FilterNode(n, predicate), predicate,
                          concurrency=concurrency, ordering=ordering, blocking=blocking, keeps_value=True)

    def filter_not(self, predicate: Callable[[Any, Any], Any], *, name: str | None = None,
            concurrency: int | None = None, ordering: str | None = None, blocking: bool = False,
    ) -> KStream:
        """Drop the records for which ``predicate(key, value)`` is true."""
        return self._then("KSTREAM-FILTER", name, lambda n: FilterNode(n, predicate, negate=True), predicate,
                          concurrency=concurrency, ordering=ordering, blocking=blocking, keeps_value=True)

    def map(self, mapper: Callable[[Any, Any], Any], *, name: str | None = None,
            concurrency: int | None = None, ordering: str | None = None, blocking: bool = False,
    ) -> KStream:
        """Replace each record by ``mapper(key, value) -> (new_key, new_value)``."""
        return self._then("KSTREAM-MAP", name, lambda n: MapNode(n, mapper), mapper,
                          concurrency=concurrency, ordering=ordering, blocking=blocking, changes_key=True)

    def select_key(self, mapper: Callable[[Any, Any], Any], *, name: str | None = None,
            concurrency: int | None = None, ordering: str | None = None, blocking: bool = False,
    ) -> KStream:
        """Give each record the key ``mapper(key, value)``."""
        return self._then("KSTREAM-KEY-SELECT", name, lambda n: SelectKeyNode(n, mapper), mapper,
                          concurrency=concurrency, ordering=ordering, blocking=blocking, changes_key=True,
                          keeps_value=True)

    def map_values(self, mapper: Callable[[Any], Any], *, name: str | None = None,
            concurrency: int | None = None, ordering: str | None = None, blocking: bool = False,
    ) -> KStream:
        """Replace each value by ``mapper(value)``; the key stays."""
        return self._then("KSTREAM-MAPVALUES", name, lambda n: MapValuesNode(n, mapper), mapper,
                          concurrency=concurrency, ordering=ordering, blocking=blocking)

    def flat_map(self, mapper: Callable[[Any, Any], Iterable[tuple[Any, Any]]], *, name: str | None = None,
            concurrency: int | None = None, ordering: str | None = None, blocking: bool = False,
    ) -> KStream:
        """Replace each record by the ``(key, value)`` pairs of ``mapper(key, value)``."""
        return self._then("KSTREAM-FLATMAP", name, lambda n: FlatMapNode(n, mapper), mapper,
                          concurrency=concurrency, ordering=ordering, blocking=blocking, changes_key=True)

    def flat_map_values(self, mapper: Callable[[Any], Iterable[Any]], *, name: str | None = None,
            concurrency: int | None = None, ordering: str | None = None, blocking: bool = False,
    ) -> KStream:
        """Replace each record by one record per value of ``mapper(value)``."""
        return self._then("KSTREAM-FLATMAPVALUES", name, lambda n: FlatMapValuesNode(n, mapper), mapper,
                          concurrency=concurrency, ordering=ordering, blocking=blocking)

    def peek(self, action: Callable[[Any, Any], Any], *, name: str | None = None,
            concurrency: int | None = None, ordering: str | None = None, blocking: bool = False,
    ) -> KStream:
        """Call ``action(key, value)`` for each record and pass it on unchanged."""
        return self._then("KSTREAM-PEEK", name, lambda n: PeekNode(n, action), action,
                          concurrency=concurrency, ordering=ordering, blocking=blocking, keeps_value=True)

    def foreach(self, action: Callable[[Any, Any], Any], *, name: str | None = None,
            concurrency: int | None = None, ordering: str | None = None, blocking: bool = False,
    ) -> None:
        """Call ``action(key, value)`` for each record; a terminal operation."""
        self._then("KSTREAM-FOREACH", name, lambda n: ForeachNode(n, action), action,
                          concurrency=concurrency, ordering=ordering, blocking=blocking)

    def process(self, supplier: ProcessorSupplier, *, name: str | None = None,
                concurrency: int | None = None, ordering: str | None = None,
                stores: Sequence[str] = ()) -> KStream:
        """Run a Processor API processor; ``supplier()`` makes one per task.

        ``concurrency``/``ordering`` (on every function-taking method too) let records of the
        tasks that run this processor be in flight at once, overriding ``num.threads.per.task``
        and ``processing.ordering`` for its whole sub-topology. On the function-taking methods,
        ``blocking=True`` runs a plain function on a bounded worker-thread pool, off the loop.
        ``stores`` names the state stores (``StreamsBuilder.add_state_store``) the processor uses.
        """
        node_name = self._builder._name(name, "KSTREAM-PROCESSOR")
        topology = self._builder._topology
        for store in stores:
            if store not in topology.store_names:
                raise TopologyError(f"Processor '{node_name}' uses state store '{store}', which is not added "
                                    "(StreamsBuilder.add_state_store)")
        topology.add_processor(node_name, supplier, self._node, stores=stores)
        if concurrency is not None or ordering is not None:
            topology.set_concurrency(node_name, concurrency, ordering)
        # A processor may forward keys and values of any type: no serde of this stream is known to fit.
        return KStream(self._builder, node_name, self._key_changed)

    def process_values(self, supplier: FixedKeyProcessorSupplier, *, name: str | None = None,
                       concurrency: int | None = None, ordering: str | None = None,
                       stores: Sequence[str] = ()) -> KStream:
        """Run a processor that cannot change keys (streamloop.processors.fixed_key): it gets and
        forwards ``FixedKeyRecord``s, so the stream stays partitioned by its key (no repartition
        before a later grouping or join). Arguments as for ``process``."""
        return process_values(self, supplier, name, concurrency, ordering, stores)

    def print(self, printed: Printed) -> None:
        """Write each record as ``[label]: key, value`` to standard output or a file (``Printed``); terminal."""
        print_stream(self, printed)

    def to_table(self, *, materialized: Materialized | str | None = None, name: str | None = None) -> KTable:
        """The stream as a table: each record is its key's latest value, a None value deletes the
        key, a record without a key is dropped. After a key-changing operation the records are
        repartitioned first, so that a key's records meet in one task."""
        return stream_to_table(self, materialized, name)

    # -- grouping and joins (the stateful DSL, see streamloop.topology.tables) ----------------
    def group_by_key(self, *, key_serde: Serde | type | None = None,
                     value_serde: Serde | type | None = None) -> KGroupedStream:
        """Group by the current key; after a key-changing operation the records are repartitioned."""
        ks = self._key_serde if key_serde is None else as_serde(key_serde, "key serde of group_by_key()")
        vs = self._value_serde if value_serde is None else as_serde(value_serde, "value serde of group_by_key()")
        inherited = (key_serde is None and ks is not None, value_serde is None and vs is not None)
        stream = self._repartition(ks, vs, inherited, "group_by_key()") if self._key_changed else self
        return KGroupedStream(self._builder, stream._node, ks, vs)

    def group_by(self, selector: Callable[[Any, Any], Any], *, key_serde: Serde | type | None = None,
                 value_serde: Serde | type | None = None, name: str | None = None) -> KGroupedStream:
        """Group by ``selector(key, value)``: records are repartitioned by the new key."""
        return self.select_key(selector, name=name).group_by_key(key_serde=key_serde, value_serde=value_serde)

    def join(self, table: KTable | KStream | GlobalKTable, joiner: Callable[[Any, Any], Any],
             windows: JoinWindows | Callable[[Any, Any], Any] | None = None,
             stream_joined: StreamJoined | None = None, *, name: str | None = None) -> KStream:
        """``joiner(value, table_value)`` for each record whose key the table has (the table's
        topic must have as many partitions as this stream's: they are read by the same tasks).

        With another stream and ``windows``: ``joiner(value, other_value)`` for each pair of
        records of one key within the join windows (streamloop.topology.joins).

        With a ``GlobalKTable``, Kafka Streams' argument order ``join(global_table, key_selector,
        joiner)``: ``joiner(value, table_value)`` where the table has ``key_selector(key, value)``."""
        if isinstance(table, GlobalKTable):
            return stream_global_join(self, table, joiner, windows, False, name)
        if isinstance(table, KStream):
            # (Not JoinWindows: stream_stream_join refuses it, naming what it got.)
            return stream_stream_join(self, table, joiner, cast("JoinWindows | None", windows), False, False,
                                      stream_joined, name)
        return stream_table_join(self, table, joiner, False, name)

    def left_join(self, table: KTable | KStream | GlobalKTable, joiner: Callable[[Any, Any], Any],
                  windows: JoinWindows | Callable[[Any, Any], Any] | None = None,
                  stream_joined: StreamJoined | None = None, *, name: str | None = None) -> KStream:
        """As ``join``, but a record whose key the table lacks is joined with None (with a stream:
        a record that found no partner once its window plus grace closed; with a ``GlobalKTable``,
        ``left_join(global_table, key_selector, joiner)``, also a None lookup key)."""
        if isinstance(table, GlobalKTable):
            return stream_global_join(self, table, joiner, windows, True, name)
        if isinstance(table, KStream):
            return stream_stream_join(self, table, joiner, cast("JoinWindows | None", windows), True, False,
                                      stream_joined, name)
        return stream_table_join(self, table, joiner, True, name)

    def outer_join(self, other: KStream, joiner: Callable[[Any, Any], Any], windows: JoinWindows,
                   stream_joined: StreamJoined | None = None, *, name: str | None = None) -> KStream:
        """As ``left_join`` of two streams, and the other stream's records without partner too."""
        return stream_stream_join(self, other, joiner, windows, True, True, stream_joined, name)

    def repartition(self, repartitioned: Repartitioned | None = None) -> KStream:
        """The stream through an internal topic (``streamloop.topology.repartition``): what follows
        runs by the records' current keys, over ``Repartitioned``'s number of partitions."""
        return repartition(self, repartitioned)

    def _repartition(self, key_serde: Serde | None, value_serde: Serde | None, inherited: tuple[bool, bool],
                     call: str | None) -> KStream:
        """Through an internal topic, written and read with these serdes (None: the defaults).

        ``inherited`` says which are this stream's; ``call`` names the DSL method whose
        ``key_serde=``/``value_serde=`` give the others (None: no method does), for errors.
        """
        builder = self._builder
        base = builder._name(None, "KSTREAM-REPARTITION")
        topic = f"{base}-repartition"
        sink = builder._name(None, "KSTREAM-SINK")
        builder._topology.add_sink(sink, topic, self._node, key_serde=key_serde, value_serde=value_serde,
                                   internal=True, inherited=inherited, kinds=self._kinds(key_serde, value_serde),
                                   call=call)
        source = builder._name(None, "KSTREAM-SOURCE")
        builder._topology.add_source(source, topic, key_serde, value_serde, internal=True)
        return KStream(builder, source, False, key_serde, value_serde, *self._kinds(key_serde, value_serde))

    def _kinds(self, key_serde: object, value_serde: object) -> tuple[str | None, str | None]:
        """The known non-bytes kinds a sink with these serdes has no serde for."""
        return (self._key_kind if key_serde is None else None, self._value_kind if value_serde is None else None)

    def spark_batch(
        self,
        fn: Callable[[Any], Any],
        *,
        max_records: int | None = None,
        max_wait_ms: int | None = None,
        max_batches_in_flight: int | None = None,
        key_column: str = "key",
        value_columns: Sequence[str] | None = None,
        schema: Any = None,
        name: str | None = None,
        read: str | None = None,
    ) -> KStream:
        """Run ``fn(DataFrame) -> DataFrame`` on Spark over micro-batches of each task's records.

        A batch holds up to ``max_records`` records and runs at the latest ``max_wait_ms`` after
        its first; at most ``max_batches_in_flight`` batches of a task run at once (each ``None``
        takes the ``spark.batch.*`` config key). The input has one row per record: the key in
        ``key_column`` and the value's fields as columns (a non-mapping value in ``value``).
        ``schema`` (DDL string or ``StructType``) fixes the columns and types and is matched to
        each record by name: a missing field is null, an extra one dropped, and a record whose
        value does not fit raises ``SparkSchemaError`` alone, through the processing exception
        handler, before Spark is called. Each row of the result becomes a record downstream: key
        from ``key_column``, value a dict of ``value_columns`` (default: every other column).
        Jobs run on worker threads, never on a stream thread's loop; a record's offset is
        committed only after its batch's output is handed on. Needs ``streamloop[spark]``.

        ``read``: ``"driver"`` (this process fetches and decodes the records) or ``"executors"``
        (Spark's executors read each task's offset range from Kafka: only a stage right after its
        source, with ``schema``); None takes ``spark.batch.read``. See docs/spark.md.
        """
        node_name = spark_batch_stage(self, fn, max_records, max_wait_ms, max_batches_in_flight, key_column,
                                      value_columns, schema, name, read)
        return KStream(self._builder, node_name, value_kind=ROWS)

    def to_spark(
        self,
        path: str | None = None,
        *,
        table: str | None = None,
        format: str = "parquet",
        mode: str = "append",
        options: Mapping[str, str] | None = None,
        max_records: int | None = None,
        max_wait_ms: int | None = None,
        max_batches_in_flight: int | None = None,
        key_column: str = "key",
        schema: Any = None,
        name: str | None = None,
        read: str | None = None,
    ) -> None:
        """Write the stream with Spark, one write per micro-batch: files at ``path`` (Parquet
        unless ``format`` says otherwise) or the table ``table``; a terminal operation.

        Batching and ``schema`` are as in ``spark_batch``. A record's offset is committed only after the write
        of its batch finished; a crash before that writes the batch again (at-least-once).
        """
        spark_sink_stage(self, path, table, format, mode, options, max_records, max_wait_ms, max_batches_in_flight,
                         key_column, schema, name, read)

    def branch(self, *predicates: Callable[[Any, Any], Any], name: str | None = None) -> list[KStream]:
        """One stream per predicate; each record goes to the first that matches."""
        if not predicates:
            raise TopologyError("branch() needs at least one predicate")
        branch_node = self._then("KSTREAM-BRANCH", name, lambda n: BranchNode(n, predicates), *predicates)
        streams = []
        for i in range(len(predicates)):
            child = self._builder._name(None if name is None else f"{name}-{i}", "KSTREAM-BRANCHCHILD")
            self._builder._topology.add_node(child, _pass_through(child), branch_node._node)
            streams.append(self._after(child, False, True))
        return streams

    def split(self, *, name: str | None = None) -> BranchedKStream:
        """Kafka Streams' ``split()``: add branches with ``.branch(predicate)``, close with ``default_branch()``."""
        return BranchedKStream(self, name)

    def merge(self, other: KStream, *, name: str | None = None) -> KStream:
        """A stream of the records of both streams."""
        node_name = self._builder._name(name, "KSTREAM-MERGE")
        self._builder._topology.add_node(node_name, _pass_through(node_name), self._node, other._node)
        return KStream(self._builder, node_name, self._key_changed or other._key_changed,
                       _common(self._key_serde, other._key_serde), _common(self._value_serde, other._value_serde),
                       _common(self._key_kind, other._key_kind), _common(self._value_kind, other._value_kind))

    def to(
        self,
        topic: str | Callable[[Any, Any, Any], str],
        produced: Produced | None = None,
        *,
        key_serde: Serde | type | None = None,
        value_serde: Serde | type | None = None,
        partitioner: Partitioner | StreamPartitioner | None = None,
        name: str | None = None,
    ) -> None:
        """Write the stream to ``topic`` (or to the topic a function picks per record).

        Without ``key_serde``/``value_serde`` the sink uses the serde the stream knows at this
        point (the DSL page of the docs lists the rules), else ``default.key.serde`` /
        ``default.value.serde``. A serde that cannot write a record raises ``SerializationError``.
        ``produced`` (``Produced``) gives these options instead of the keywords; its stream
        partitioner may send a record to several partitions (``StreamPartitioner``, KIP-837).
        """
        key_serde, value_serde, partitioner, name = sink_options(produced, key_serde, value_serde, partitioner, name)
        node_name = self._builder._name(name, "KSTREAM-SINK")
        ks = self._key_serde if key_serde is None else as_serde(key_serde, f"key serde of '{node_name}'")
        vs = self._value_serde if value_serde is None else as_serde(value_serde, f"value serde of '{node_name}'")
        self._builder._topology.add_sink(
            node_name, topic, self._node, key_serde=ks, value_serde=vs, partitioner=partitioner,
            inherited=(key_serde is None and ks is not None, value_serde is None and vs is not None),
            kinds=self._kinds(ks, vs), call="to()",
        )


def _common(mine: Any, theirs: Any) -> Any:
    """What both merged streams know alike (the same serde, or equal ones), else None."""
    return mine if mine is theirs or (mine is not None and mine == theirs) else None


def _made(node: Node, blocking: bool) -> Node:
    if blocking:
        node.mark_blocking()  # type: ignore[attr-defined]  # only function nodes are made blocking
    return node


def _pass_through(name: str) -> Callable[[], Node]:
    return lambda: PassThroughNode(name)

