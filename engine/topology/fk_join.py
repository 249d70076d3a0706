"""``KTable.join(other, foreign_key_extractor, joiner)`` and ``left_join``: the foreign-key table
join (Kafka Streams' KIP-213); the processors and the flow are in streamloop.processors.fk_join.

The foreign key comes from ``foreign_key_extractor(value)`` or, when it needs the row's key too,
``foreign_key_from_key_and_value(key, value)`` (Kafka Streams 4.0's ``BiFunction`` extractor,
KIP-1104); ``key_value_extractor`` makes one ``(key, value)`` function of either, so that the
processors have a single code path.

The nodes it adds, named as Kafka Streams names them:

- on the left table's sub-topology: ``KTABLE-FK-JOIN-SUBSCRIPTION-REGISTRATION`` (the send
  processor) writing the subscription topic, and the response topic's source with the
  ``KTABLE-FK-JOIN-SUBSCRIPTION-RESPONSE-RESOLVER`` joining answers with the left table;
- on the right table's sub-topology: the subscription topic's source with the
  ``KTABLE-FK-JOIN-SUBSCRIPTION-PROCESSOR`` and its store (with a changelog, so subscriptions
  survive a restart or a move of the task), and ``KTABLE-FK-JOIN-FOREIGN-TABLE`` answering
  subscribers on the right table's updates, both writing the response topic.

The subscription topic is co-partitioned with the right table's topic and the response topic
with the left table's (``streamloop.topology.copartition`` gives them those partition counts); the
two tables themselves need not be co-partitioned.

With ``materialized`` the joined table is kept in that store. Without it, as in Kafka Streams
(``KTableSource.materialize``), in an internal store that is not queryable, and only once an
operation downstream needs it: a join reading the table, or a filter or aggregation needing the
values its updates replace. A join result that only goes on as a stream (``to_stream()``) is
forwarded as it is resolved, without a store write or a changelog record per update.

``name`` names the nodes, the internal topics (``<name>-subscription-registration-topic``,
``<name>-subscription-response-topic``) and the subscription store (``<name>-subscription-store``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from streamloop.errors import TopologyError
from streamloop.processors.fk_join import (
    ForeignTableChangeProcessor,
    JoinSerdes,
    Response,
    ResponseJoinProcessor,
    SubscriptionReceiveProcessor,
    SubscriptionSendProcessor,
)
from streamloop.processors.nodes import Node, PassThroughNode, ProcessorNode
from streamloop.processors.table_ops import MaterializedTableOpProcessor
from streamloop.serdes import BytesSerde
from streamloop.state.stores import Materialized, StoreBuilder, StoreSupplier
from streamloop.topology.copartition import add_copartition_group
from streamloop.topology.table_ops import derived, join_views, plain_function, send_old_values, table_store

if TYPE_CHECKING:
    from streamloop.topology.tables import KTable


def key_value_extractor(by_value: Callable[[Any], Any] | None, by_key_and_value: Callable[[Any, Any], Any] | None,
                        what: str) -> Callable[[Any, Any], Any]:
    """The foreign key as a function of the row's key and value, from exactly one of the two forms
    (the value-only one wrapped): which one the user meant is never guessed."""
    if (by_value is None) == (by_key_and_value is None):
        got = "both" if by_value is not None else "neither"
        raise TopologyError(f"{what} by foreign key takes one of foreign_key_extractor(value) and "
                            f"foreign_key_from_key_and_value(key, value); got {got}")
    if by_key_and_value is not None:
        plain_function(by_key_and_value, f"{what} foreign_key_from_key_and_value")
        return by_key_and_value
    assert by_value is not None  # the other one, as checked above
    plain_function(by_value, f"{what} foreign_key_extractor")
    extract = by_value

    def of_value(_key: Any, value: Any) -> Any:
        return extract(value)
    return of_value


def foreign_key_join(table: KTable, other: KTable, by_value: Callable[[Any], Any] | None,
                     by_key_and_value: Callable[[Any, Any], Any] | None, joiner: Callable[[Any, Any], Any],
                     left_join: bool, materialized: Materialized | str | None, name: str | None) -> KTable:
    what = "left_join()" if left_join else "join()"
    extractor = key_value_extractor(by_value, by_key_and_value, what)
    plain_function(joiner, what)
    left_view, right_view = join_views(table, other, what)
    builder = table._builder
    topology = builder._topology
    serdes = JoinSerdes(table._key_serde, table._value_serde, other._key_serde, other._value_serde)
    raw = BytesSerde()

    # Left: subscribe (the send processor needs each update's old value: its old foreign key).
    send_old_values(table)
    registration = builder._name(name and f"{name}-subscription-registration",
                                 "KTABLE-FK-JOIN-SUBSCRIPTION-REGISTRATION")
    subscription_topic = f"{registration}-topic"
    subscription_sink = builder._name(None, "KTABLE-SINK")
    response_base = builder._name(name and f"{name}-subscription-response", "KTABLE-FK-JOIN-SUBSCRIPTION-RESPONSE")
    response_topic = f"{response_base}-topic"
    response_source = builder._name(None, "KSTREAM-SOURCE")
    resolver = builder._name(name and f"{name}-resolver", "KTABLE-FK-JOIN-SUBSCRIPTION-RESPONSE-RESOLVER")
    topology.add_processor(
        registration,
        lambda: SubscriptionSendProcessor(extractor, left_join, serdes, subscription_sink, resolver),
        table._node)
    topology.add_sink(subscription_sink, subscription_topic, registration, key_serde=raw, value_serde=raw,
                      internal=True, call=None)

    # Right: keep subscriptions, answer them now and on every update of the right table.
    subscription_source = builder._name(None, "KSTREAM-SOURCE")
    topology.add_source(subscription_source, subscription_topic, raw, raw, internal=True)
    # Named as Kafka Streams names them for ``TableJoined.as(name)``.
    store = f"{name}-subscription-store" if name else builder._name(None, "KTABLE-FK-JOIN-SUBSCRIPTION-STATE-STORE")
    receiver = builder._name(name and f"{name}-subscription-processor", "KTABLE-FK-JOIN-SUBSCRIPTION-PROCESSOR")
    foreign = builder._name(name and f"{name}-foreign-table", "KTABLE-FK-JOIN-FOREIGN-TABLE")
    topology.add_processor(receiver, lambda: SubscriptionReceiveProcessor(store, serdes, right_view),
                           subscription_source, stores=right_view.stores)
    topology.add_processor(foreign, lambda: ForeignTableChangeProcessor(store, serdes), other._node)
    # Caching off: a right update scans the store right after a subscription was written.
    topology.add_state_store(StoreBuilder(StoreSupplier(store, None), raw, raw, caching=False), receiver, foreign)
    response_sink = builder._name(None, "KTABLE-SINK")
    # To the partition of the left task that subscribed (carried in the answer), as Kafka Streams does.
    topology.add_sink(response_sink, response_topic, receiver, foreign, key_serde=raw, value_serde=raw,
                      partitioner=Response.partitioner, internal=True, call=None)

    # Left again: join the answers with the left table's current rows.
    topology.add_source(response_source, response_topic, raw, raw, internal=True)
    topology.add_processor(resolver, lambda: ResponseJoinProcessor(left_view, joiner, left_join, serdes),
                           response_source, registration, stores=left_view.stores)
    add_copartition_group(topology, f"{what} (its subscription topic)", (other._node, subscription_source))
    add_copartition_group(topology, f"{what} (its response topic)", (table._node, response_source))

    result_store = builder._store_name(materialized, "KTABLE-FK-JOIN-OUTPUT-STATE-STORE")
    output = builder._name(None, "KTABLE-FK-JOIN-OUTPUT")
    store_builder = table_store(result_store, materialized, table._key_serde, None)
    # Without ``materialized``, as Kafka Streams: kept in a store only once an operation downstream
    # reads the table or needs the values its updates replace; until then each answer goes straight on.
    stored = _always if materialized is not None else topology.add_state_store_on_demand(store_builder, output)

    def output_node() -> Node:
        if stored():
            return ProcessorNode(output, MaterializedTableOpProcessor(result_store, lambda _k, v: v, False))
        return PassThroughNode(output)

    topology.add_node(output, output_node, resolver)
    if materialized is not None:
        topology.add_state_store(store_builder, output)
    result = derived(table, output, result_store, store_builder.value_serde, None)
    if materialized is None:
        result.queryable_store_name = None  # an internal store, as in Kafka Streams: not for queries
    return result


def _always() -> bool:
    return True
