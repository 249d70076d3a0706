"""Which instance owns which partitions of each store: the metadata of queries across instances.

Every instance may set ``application.server`` (the host:port its service answers queries at).
The group leader's assignor gathers the endpoints from the members' subscriptions and hands
every member the partitions each endpoint owns (Kafka Streams' ``partitionsByHost`` and
``standbyPartitionByHost``); each member's assignor passes them to its client's
:class:`StreamsMetadataState`, which answers ``query_metadata_for_key``,
``metadata_for_all_clients`` and ``metadata_for_store`` as Kafka Streams'
``StreamsMetadataState`` does:

- a store is on a host when the host owns a partition of one of the source topics of the store's
  sub-topology; a key's partition is the default partitioner's (murmur2 of the serialized key, the
  producer's), modulo the partition count of the store's source topic with the most partitions;
- the partition counts are read off the assignment itself (as Kafka Streams does), so until the
  first assignment that names an endpoint arrives, a key's metadata is
  ``KeyQueryMetadata.NOT_AVAILABLE`` and the lists are empty. Afterwards the metadata is the last
  assignment's: it stays during a rebalance and changes when the next assignment arrives.

Written by the stream threads' assignors (each on its own loop), read from any thread: each
change swaps one immutable snapshot under a lock held for no longer than the swap.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from streamloop.config import split_endpoint
from streamloop.errors import ConfigError
from streamloop.records import TopicPartition
from streamloop.serdes import Serde
from streamloop.transport.partitioner import key_hash

if TYPE_CHECKING:
    from streamloop.topology.topology import Topology

__all__ = ["HostInfo", "HostPartitions", "KeyQueryMetadata", "StreamsMetadata", "StreamsMetadataState"]

HostPartitions = Mapping["HostInfo", Set[TopicPartition]]


@dataclass(frozen=True, slots=True, order=True)
class HostInfo:
    """An instance's ``application.server``: where its service answers queries."""

    host: str
    port: int

    @classmethod
    def build_from_endpoint(cls, endpoint: str | None) -> HostInfo | None:
        """The ``host:port`` of ``endpoint``; None when it is empty. Raises ``ConfigError`` when malformed."""
        if endpoint is None or not endpoint.strip():
            return None
        try:
            host, port = split_endpoint(endpoint)
        except ValueError as exc:
            raise ConfigError("application.server", str(exc)) from None
        return cls(host, port)

    @classmethod
    def unavailable(cls) -> HostInfo:
        """The host of ``KeyQueryMetadata.NOT_AVAILABLE`` and of a key no endpoint owns."""
        return cls("unavailable", -1)

    @property
    def endpoint(self) -> str:
        """``host:port`` again, an IPv6 host in brackets."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def __str__(self) -> str:
        return self.endpoint


UNKNOWN_HOST = HostInfo.unavailable()


@dataclass(frozen=True, slots=True)
class KeyQueryMetadata:
    """Where a key of a store lives: the host of its active task, those of its standbys, its partition."""

    active_host: HostInfo
    standby_hosts: frozenset[HostInfo]
    partition: int

    NOT_AVAILABLE: ClassVar[KeyQueryMetadata]
    """Nothing is known yet: this client has not had an assignment that names an endpoint."""


KeyQueryMetadata.NOT_AVAILABLE = KeyQueryMetadata(UNKNOWN_HOST, frozenset(), -1)


@dataclass(frozen=True, slots=True)
class StreamsMetadata:
    """One instance of the application: its endpoint, the stores and partitions of its tasks."""

    host_info: HostInfo
    state_store_names: frozenset[str]
    topic_partitions: frozenset[TopicPartition]
    standby_state_store_names: frozenset[str] = frozenset()
    standby_topic_partitions: frozenset[TopicPartition] = frozenset()

    @property
    def host(self) -> str:
        return self.host_info.host

    @property
    def port(self) -> int:
        return self.host_info.port


@dataclass(frozen=True, slots=True)
class _Snapshot:
    all_metadata: tuple[StreamsMetadata, ...]
    partition_counts: Mapping[str, int]
    local: StreamsMetadata | None


class StreamsMetadataState:
    """A client's view of which endpoint owns which partitions of each store.

    ``store_sources`` names, for each store, the source topics of the sub-topology that holds it;
    ``global_stores`` the global tables' stores, which every instance holds in full.
    """

    def __init__(self, this_host: HostInfo | None,
                 store_sources: Mapping[str, Iterable[str]] | Callable[[], Mapping[str, Iterable[str]]],
                 global_stores: Iterable[str] = ()) -> None:
        self.this_host = this_host if this_host is not None else UNKNOWN_HOST
        if callable(store_sources):
            # Read when needed: a source by pattern reads the topics of the last assignment.
            self._sources_now = store_sources
        else:
            fixed = {store: tuple(topics) for store, topics in store_sources.items()}
            self._sources_now = lambda: fixed
        self._global_stores = frozenset(global_stores)
        self._lock = threading.Lock()
        self._snapshot = _Snapshot((), {}, None)

    @classmethod
    def for_topology(cls, endpoint: str, topology: Topology) -> StreamsMetadataState:
        """The state of a client (or test driver) with ``application.server`` ``endpoint`` running ``topology``."""
        return cls(HostInfo.build_from_endpoint(endpoint),
                   lambda: {name: topology.subtopology_of_store(name).source_topics for name in topology.store_names},
                   topology.global_stores)

    # -- written by the assignors --------------------------------------------------------
    def on_change(self, active_by_host: HostPartitions, standby_by_host: HostPartitions) -> None:
        """Take on the partitions by host of a new assignment."""
        counts: dict[str, int] = {}
        for partitions in active_by_host.values():
            for tp in partitions:
                counts[tp.topic] = max(counts.get(tp.topic, 0), tp.partition + 1)
        hosts = sorted(set(active_by_host) | set(standby_by_host))
        all_metadata = tuple(
            StreamsMetadata(host, self._stores_on(active), frozenset(active), self._stores_on(standby),
                            frozenset(standby))
            for host in hosts
            for active, standby in [(active_by_host.get(host, ()), standby_by_host.get(host, ()))])
        local = next((m for m in all_metadata if m.host_info == self.this_host),
                     StreamsMetadata(self.this_host, frozenset(), frozenset()))
        with self._lock:
            self._snapshot = _Snapshot(all_metadata, counts, local)

    def _stores_on(self, partitions: Iterable[TopicPartition]) -> frozenset[str]:
        topics = {tp.topic for tp in partitions}
        # Every instance holds the global stores, as Kafka Streams lists them on every host.
        return frozenset(store for store, sources in self._sources_now().items()
                         if topics.intersection(sources)) | self._global_stores

    # -- read from any thread ----------------------------------------------------------------
    def _read(self) -> _Snapshot:
        with self._lock:
            return self._snapshot

    @property
    def is_initialized(self) -> bool:
        snapshot = self._read()
        return bool(snapshot.partition_counts) and snapshot.local is not None

    def all_metadata(self) -> list[StreamsMetadata]:
        """Every instance with an endpoint, in host:port order; empty before the first assignment."""
        return list(self._read().all_metadata)

    def local_metadata(self) -> StreamsMetadata | None:
        """This instance's entry (None before the first assignment)."""
        return self._read().local

    def all_metadata_for_store(self, store_name: str) -> list[StreamsMetadata]:
        """The instances that hold an active or standby copy of a part of ``store_name``."""
        if store_name is None:
            raise TypeError("store_name must not be None")
        if not self.is_initialized:
            return []
        if store_name in self._global_stores:
            return self.all_metadata()
        if store_name not in self._sources_now():
            return []
        return [m for m in self._read().all_metadata
                if store_name in m.state_store_names or store_name in m.standby_state_store_names]

    def key_query_metadata_for_key(self, store_name: str, key: Any, key_serde: Serde) -> KeyQueryMetadata | None:
        """Where ``key`` of ``store_name`` lives (whether or not the store holds it).

        ``NOT_AVAILABLE`` before the first assignment; None for a store the topology lacks.
        """
        if store_name is None or key is None or key_serde is None:
            raise TypeError("store_name, key and key_serde must not be None")
        snapshot = self._read()
        if not snapshot.partition_counts or snapshot.local is None:
            return KeyQueryMetadata.NOT_AVAILABLE
        if store_name in self._global_stores:
            # Every instance has every key: this one (Kafka Streams), with no partition.
            return KeyQueryMetadata(self.this_host, frozenset(), -1)
        sources = self._sources_now().get(store_name)
        if not sources:
            return None
        key_bytes = key_serde.serialize(key)
        if key_bytes is None:
            raise ValueError(f"The key serde {key_serde!r} wrote no bytes for key {key!r}")
        most = max((snapshot.partition_counts.get(t, 0) for t in sources), default=0)
        if most == 0:
            return KeyQueryMetadata.NOT_AVAILABLE  # no endpoint owns a partition of the store's topics
        partition = partition_for(key_bytes, most)
        matching = {TopicPartition(t, partition) for t in sources}
        active = UNKNOWN_HOST
        standbys: set[HostInfo] = set()
        for metadata in snapshot.all_metadata:
            if store_name in metadata.state_store_names and not matching.isdisjoint(metadata.topic_partitions):
                active = metadata.host_info
            if (store_name in metadata.standby_state_store_names
                    and not matching.isdisjoint(metadata.standby_topic_partitions)):
                standbys.add(metadata.host_info)
        return KeyQueryMetadata(active, frozenset(standbys), partition)


def partition_for(key_bytes: bytes, partitions: int) -> int:
    """The partition the producer's default partitioner writes ``key_bytes`` to."""
    return key_hash(key_bytes) % partitions
