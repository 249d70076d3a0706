"""Stream-stream windowed joins in the DSL: ``stream.join(other, joiner, JoinWindows...)``,
``left_join`` and ``outer_join``.

As in Kafka Streams, a join adds one processor per side (``KSTREAM-JOINTHIS``/
``KSTREAM-JOINOTHER``, ``OUTERTHIS``/``OUTEROTHER`` for the sides that emit
unmatched records) and a merge of their results, with a window store per side
(changelogged, restored like every store) and, for left and outer joins, the
shared outer store. Both sides' records of a key must be in the same task: a side
whose key changed is repartitioned first, and the two sides' topics must have the
same number of partitions (checked when the topics are known).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from streamloop.errors import TopologyError
from streamloop.processors.builtin import PeekNode
from streamloop.processors.stream_joins import SharedTime, StreamJoinProcessor
from streamloop.serdes import BytesSerde, Serde, as_serde
from streamloop.state.join_windows import JoinWindows
from streamloop.state.stores import StoreBuilder, StoreSupplier, StoreType, check_store_name
from streamloop.topology.copartition import add_copartition_group

if TYPE_CHECKING:
    from streamloop.topology.builder import KStream


@dataclass(frozen=True)
class StreamJoined:
    """The stores of a stream-stream join (Kafka Streams' ``StreamJoined``).

    ``store_name`` names them as Kafka Streams does: ``<store_name>-this-join-store`` and
    ``-other-join-store`` for a join; ``-this-join-store``, ``-outer-other-join-store`` and
    ``-left-shared-join-store`` for a left join; ``-outer-this-join-store``,
    ``-outer-other-join-store`` and ``-outer-shared-join-store`` for an outer join (their
    changelogs follow). Without it they are named after the join's processors. Serdes left
    None are the streams' known ones, else the defaults.
    ``persistent=None`` follows ``default.dsl.store``; ``logging=False`` keeps no changelogs.
    """

    key_serde: Serde | type | None = None
    value_serde: Serde | type | None = None
    other_value_serde: Serde | type | None = None
    store_name: str | None = None
    persistent: bool | None = None
    logging: bool = True

    @classmethod
    def with_(cls, key_serde: Serde | type | None = None, value_serde: Serde | type | None = None,
              other_value_serde: Serde | type | None = None) -> StreamJoined:
        return cls(key_serde, value_serde, other_value_serde)

    def with_store_name(self, name: str) -> StreamJoined:
        return replace(self, store_name=check_store_name(name))

    def with_logging_disabled(self) -> StreamJoined:
        return replace(self, logging=False)


def stream_stream_join(this: KStream, other: KStream, joiner: Callable[[Any, Any], Any],
                       windows: JoinWindows | None, left_outer: bool, right_outer: bool,
                       joined: StreamJoined | None, name: str | None) -> KStream:
    """The join of ``this`` (left) and ``other`` (right); see the module doc."""
    what = "outer_join()" if right_outer else "left_join()" if left_outer else "join()"
    if not callable(joiner):
        raise TypeError(f"{what} needs a callable joiner, got {joiner!r}")
    if inspect.iscoroutinefunction(joiner):
        raise TopologyError(f"{what} joiner must be a plain function: a join's store update cannot wait "
                            f"(got async {joiner!r})")
    if not isinstance(windows, JoinWindows):
        raise TopologyError(f"{what} of two streams needs JoinWindows (e.g. "
                            f"JoinWindows.of_time_difference_with_no_grace(ms)), got {windows!r}")
    if other._builder is not this._builder:
        raise TopologyError(f"{what} needs two streams of the same StreamsBuilder")
    joined = joined or StreamJoined()
    builder = this._builder
    key_serde = _serde(joined.key_serde, f"key serde of {what}") or this._key_serde or other._key_serde
    left_values = _serde(joined.value_serde, f"value serde of {what}") or this._value_serde
    right_values = _serde(joined.other_value_serde, f"other value serde of {what}") or other._value_serde
    # Records of a key must meet in one task, as Kafka Streams repartitions a side before a join.
    if this._key_changed:
        this = this._repartition(key_serde, left_values, (joined.key_serde is None, joined.value_serde is None), None)
    if other._key_changed:
        other = other._repartition(key_serde, right_values,
                                 (joined.key_serde is None, joined.other_value_serde is None), None)

    this_name = _processor_name(builder, name, "outer-this-join" if right_outer else "this-join",
                                "KSTREAM-OUTERTHIS" if right_outer else "KSTREAM-JOINTHIS")
    other_name = _processor_name(builder, name, "outer-other-join" if left_outer else "other-join",
                                 "KSTREAM-OUTEROTHER" if left_outer else "KSTREAM-JOINOTHER")
    merge_name = _processor_name(builder, name, "merge", "KSTREAM-MERGE")
    base = joined.store_name
    # From a base name as Kafka Streams' KStreamImplJoin: each side's store follows its processor
    # ("-outer-" where the processor is OUTERTHIS/OUTEROTHER), a left join's shared store is
    # "-left-shared-join". The names name the changelog topics.
    left_store = f"{base}{'-outer-this-join' if right_outer else '-this-join'}-store" if base \
        else f"{this_name}-store"
    right_store = f"{base}{'-outer-other-join' if left_outer else '-other-join'}-store" if base \
        else f"{other_name}-store"
    shared_suffix = "-outer-shared-join" if right_outer else "-left-shared-join"
    outer_store = (f"{base}{shared_suffix}-store" if base else f"{this_name}-outer-shared-join-store"
                   ) if left_outer else None

    topology = builder._topology
    for store, values in ((left_store, left_values), (right_store, right_values)):
        supplier = StoreSupplier(store, joined.persistent, StoreType.WINDOW, windows.retention_ms,
                                 windows.size_ms, retain_duplicates=True)
        topology.add_state_store(StoreBuilder(supplier, key_serde, values, caching=False, logging=joined.logging))
    stores = [left_store, right_store]
    if outer_store is not None:
        topology.add_state_store(StoreBuilder(StoreSupplier(outer_store, joined.persistent), BytesSerde(),
                                              BytesSerde(), caching=False, logging=joined.logging))
        stores.append(outer_store)
    shared = SharedTime()
    topology.add_processor(this_name, lambda: StreamJoinProcessor(
        True, left_store, right_store, outer_store, windows, joiner, left_outer, shared), this._node, stores=stores)
    topology.add_processor(other_name, lambda: StreamJoinProcessor(
        False, left_store, right_store, outer_store, windows, joiner, right_outer, shared), other._node,
        stores=stores)
    add_copartition_group(topology, what, (this._node, other._node))
    topology.add_node(merge_name, lambda: PeekNode(merge_name, _ignore), this_name, other_name)
    # The joined values are new: no value serde is known for them; the key stays.
    return builder._stream_at(merge_name, False, key_serde)


def _processor_name(builder: Any, name: str | None, suffix: str, prefix: str) -> str:
    return builder._name(None if name is None else f"{name}-{suffix}", prefix)  # type: ignore[no-any-return]


def _serde(value: Serde | type | None, what: str) -> Serde | None:
    return None if value is None else as_serde(value, what)


def _ignore(_key: Any, _value: Any) -> None:
    return None
