"""What the convergence tests watch: a client's state transitions and its threads' rebalances.

"RUNNING means settled": one membership change moves the client from RUNNING to REBALANCING and
back at most once per rebalance round it needs, and once the group has settled our client starts
no generation by itself. ``ClientWatch`` records the transitions from the client's own state
listener and reads the threads' rebalance counts from the client's metrics.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from streamloop import ClientState, KafkaStreams, StreamsBuilder, StreamThreadState, Topology
from streamloop.handlers import StreamThreadExceptionResponse
from streamloop.records import TopicPartition
from streamloop.serdes import IntegerSerde, JsonSerde
from streamloop.testing import eventually_async
from tests.support.apps import streams_config
from tests.support.cluster import Cluster

INT, JSON = IntegerSerde(), JsonSerde()


@dataclass(frozen=True)
class Topics:
    source: str
    sink: str
    partitions: int


async def create_topics(cluster: Cluster, names: Any, partitions: int) -> Topics:
    topics = Topics(names("in"), names("out"), partitions)
    await cluster.create_topics({topics.source: partitions, topics.sink: partitions})
    return topics


def relay(topics: Topics) -> Topology:
    """The README's first application, shortened: filter, map_values, to."""
    builder = StreamsBuilder()
    (builder.stream(topics.source, key_serde=INT, value_serde=JSON)
            .filter(lambda _key, value: value["n"] >= 0)
            .map_values(lambda value: {**value, "thread": threading.current_thread().name})
            .to(topics.sink, key_serde=INT, value_serde=JSON))
    return builder.build()


def new_client(cluster: Cluster, names: Any, topics: Topics, threads: int, **overrides: Any) -> KafkaStreams:
    overrides.setdefault("client_id", names("client"))
    return KafkaStreams(relay(topics), streams_config(cluster.bootstrap, names.app, num_stream_threads=threads,
                                                      **overrides))


def replacing_client(cluster: Cluster, names: Any, topics: Topics, failed: list[int],
                     **overrides: Any) -> KafkaStreams:
    """Two threads whose processor fails once, at ``{"n": 3}`` (noted in ``failed``); the handler
    answers REPLACE_THREAD, so the failed thread leaves and its replacement joins."""
    def fail_once(value: dict[str, Any]) -> dict[str, Any]:
        if value["n"] == 3 and not failed:
            failed.append(3)
            raise RuntimeError("injected failure")
        return value

    builder = StreamsBuilder()
    (builder.stream(topics.source, key_serde=INT, value_serde=JSON).map_values(fail_once)
            .to(topics.sink, key_serde=INT, value_serde=JSON))
    overrides.setdefault("client_id", names("client"))
    streams = KafkaStreams(builder.build(), streams_config(cluster.bootstrap, names.app, num_stream_threads=2,
                                                           **overrides))
    streams.set_uncaught_exception_handler(lambda _exc: StreamThreadExceptionResponse.REPLACE_THREAD)
    return streams


class IgnoreRebalances:
    """A rebalance listener that does nothing (a bare group member in a test)."""

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        pass

    def on_join_registered(self) -> None:
        pass

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        pass


class ClientWatch:
    """The transitions of one client (from its state listener) and its threads' rebalance totals."""

    def __init__(self, streams: KafkaStreams) -> None:
        self.streams = streams
        self._lock = threading.Lock()
        self._transitions: list[tuple[ClientState, ClientState]] = []
        streams.set_state_listener(self._record)

    def _record(self, new: ClientState, old: ClientState) -> None:
        with self._lock:
            self._transitions.append((old, new))

    @property
    def transitions(self) -> list[tuple[ClientState, ClientState]]:
        with self._lock:
            return list(self._transitions)

    def rebalancing_periods(self) -> int:
        """How often the client went into REBALANCING (from CREATED or RUNNING)."""
        return sum(new is ClientState.REBALANCING for _old, new in self.transitions)

    def rebalances(self) -> dict[str, float]:
        """Each alive thread's completed rebalances (``rebalance-total``)."""
        return {m.tags["thread-id"]: m.value for m in self.streams.metrics() if m.name == "rebalance-total"}

    def owned(self, threads: int) -> list[str] | None:
        """The tasks of a RUNNING client whose ``threads`` threads all run; None otherwise."""
        if self.streams.state is not ClientState.RUNNING:
            return None
        meta = self.streams.metadata_for_local_threads()
        if len(meta) != threads or any(t.thread_state is not StreamThreadState.RUNNING for t in meta):
            return None
        return [str(task.task_id) for t in meta for task in t.active_tasks]

    def settled(self, threads: int, partitions: int) -> bool:
        """RUNNING, ``threads`` RUNNING threads, and every task owned by exactly one of them."""
        return group_settled([self], threads, partitions)

    async def wait_settled(self, threads: int, partitions: int, timeout: float, what: str = "") -> None:
        await eventually_async(lambda: self.settled(threads, partitions), timeout,
                               what or f"RUNNING with {threads} threads owning all {partitions} tasks", interval=0.05)


def group_settled(watches: Iterable[ClientWatch], threads: int, partitions: int) -> bool:
    """Every client RUNNING with ``threads`` RUNNING threads, and each task owned by exactly one thread."""
    owned: list[str] = []
    for watch in watches:
        tasks = watch.owned(threads)
        if tasks is None:
            return False
        owned += tasks
    return sorted(owned) == sorted(f"0_{p}" for p in range(partitions))


async def produce(cluster: Cluster, topics: Topics, start: int, count: int) -> None:
    """Values ``{"n": i}`` with key ``i`` (partition ``i % partitions``) for ``i`` in ``start..start+count``."""
    await cluster.produce(topics.source, [(i, {"n": i}) for i in range(start, start + count)], INT, JSON,
                          partitions=topics.partitions)


async def processed(cluster: Cluster, topics: Topics) -> set[int]:
    return {JSON.deserialize(r.value)["n"] for r in await cluster.read_all(topics.sink)}


async def wait_processed(cluster: Cluster, topics: Topics, wanted: Iterable[int], timeout: float) -> None:
    wanted = set(wanted)

    async def done() -> bool:
        return wanted <= await processed(cluster, topics)
    await eventually_async(done, timeout, f"{len(wanted)} records processed", interval=0.2)
