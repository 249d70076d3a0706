"""The protocols the engine needs from a transport.

Two transports implement them: ``kafka`` (aiokafka against a real broker) and
``memory`` (an in-process broker). The engine never imports either directly; it
asks :func:`streamloop.transport.open_transport` for one by ``bootstrap.servers``.

Every object here belongs to one asyncio event loop (the stream thread's) and is
used only from it. The memory broker behind the memory transport is shared by
many loops and does its own locking.

Records are fetched as raw bytes; deserialization is the engine's business.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from streamloop.records import ConsumerRecord, Headers, TopicPartition


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    """A committed position: the offset of the next record to read, plus metadata."""

    offset: int
    metadata: str = ""


@dataclass(frozen=True, slots=True)
class MemberSubscription:
    """What one group member sends when it joins: its topics and assignor user data."""

    member_id: str
    topics: tuple[str, ...]
    user_data: bytes = b""
    owned: tuple[TopicPartition, ...] = ()
    """The partitions the member holds as it joins: cooperative members keep them through a
    rebalance, and the assignor must not give them to another member until they are revoked."""


@dataclass(frozen=True, slots=True)
class MemberAssignment:
    """What the group leader's assignor gives one member."""

    partitions: tuple[TopicPartition, ...]
    user_data: bytes = b""


class GroupAssignor(Protocol):
    """The engine's partition assignor, independent of the transport.

    The transport calls ``subscription_user_data`` when the member (re)joins,
    ``assign`` on the member the group elected leader, and ``on_assignment`` on
    every member when its assignment arrives, before the rebalance listener's
    ``on_partitions_assigned``.
    """

    name: str

    def subscription_user_data(self, topics: Sequence[str]) -> bytes: ...

    def assign(
        self,
        subscriptions: Mapping[str, MemberSubscription],
        partitions_per_topic: Mapping[str, int],
    ) -> dict[str, MemberAssignment]: ...

    def on_assignment(self, assignment: MemberAssignment) -> None: ...


class RebalanceListener(Protocol):
    """Called on the consumer's loop during a rebalance.

    Eager protocol (``ConsumerSettings.cooperative`` False): ``on_partitions_revoked`` runs
    with every owned partition before the member rejoins; offsets committed in it are
    accepted (the member still belongs to the old generation). Then ``on_partitions_assigned``
    with the new assignment.

    Cooperative protocol (KIP-429): before each (re)join ``on_partitions_revoked`` runs with
    an empty set, and the member keeps its partitions: ``poll`` goes on returning their records
    while the group rebalances, and commits for them are accepted. When the new assignment
    arrives, ``on_partitions_revoked`` runs with only the partitions the member loses (while it
    still owns them), then ``on_partitions_assigned`` with the whole new assignment; partitions
    it keeps keep their positions and pause flags. A member that lost partitions rejoins at once,
    so that a follow-up rebalance can give them to their new owner (the assignor must not give
    a partition away while another member still owns it).
    """

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None: ...

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None: ...

    def on_join_registered(self) -> None:
        """The coordinator has registered this member's join: a rebalance completes only with it now.

        Called (on the consumer's loop, never awaited) when a new member's first JoinGroup is
        answered (Kafka: with MEMBER_ID_REQUIRED, after which the coordinator waits for the member's
        second JoinGroup before it completes a rebalance) and after every join of the memory broker.
        """


@dataclass(frozen=True, slots=True)
class ConsumerSettings:
    """Settings of a group consumer, already validated by ``StreamsConfig``."""

    group_id: str
    client_id: str
    assignor: GroupAssignor
    group_instance_id: str | None = None
    auto_offset_reset: str = "earliest"  # "earliest" | "latest" | "none"
    max_poll_interval_ms: int = 300_000
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 3_000
    request_timeout_ms: int = 40_000
    retry_backoff_ms: int = 100
    fetch_max_bytes: int = 52_428_800
    max_partition_fetch_bytes: int = 1_048_576
    # "read_committed" under exactly-once: records of open or aborted transactions are never returned.
    isolation_level: str = "read_uncommitted"
    # The rebalance protocol the listener sees (``RebalanceListener``): cooperative or eager.
    cooperative: bool = False
    # Raw pass-through of ``consumer.*`` keys for the Kafka transport; not in repr (it may hold secrets).
    extra: Mapping[str, object] = field(default_factory=dict, repr=False)


@dataclass(frozen=True, slots=True)
class ProducerSettings:
    client_id: str
    acks: str = "all"
    linger_ms: int = 5
    batch_size: int = 16_384
    request_timeout_ms: int = 40_000
    delivery_timeout_ms: int = 120_000
    retry_backoff_ms: int = 100
    compression_type: str | None = None
    # Set under exactly-once: the producer is transactional (idempotent, acks=all).
    transactional_id: str | None = None
    transaction_timeout_ms: int = 60_000
    # Raw pass-through of ``producer.*`` keys; not in repr (it may hold secrets).
    extra: Mapping[str, object] = field(default_factory=dict, repr=False)


class Consumer(Protocol):
    """A group consumer with manual commits."""

    async def start(self) -> None:
        """Connect. ``subscribe`` may be called before or after."""

    def subscribe(self, topics: Sequence[str], listener: RebalanceListener) -> None: ...

    def subscribe_pattern(self, pattern: re.Pattern[str], listener: RebalanceListener) -> None:
        """Subscribe to every topic ``pattern.match`` accepts, now and as topics are created or
        deleted: the member finds out on its metadata refresh (Kafka: ``metadata.max.age.ms``;
        the memory broker: at once) and the group rebalances."""

    def assign(self, partitions: Sequence[TopicPartition]) -> None:
        """Groupless manual assignment (readers only; no rebalances, no commits)."""

    async def poll(
        self, timeout_ms: int, max_records: int | None = None
    ) -> Mapping[TopicPartition, Sequence[ConsumerRecord]]:
        """Records from assigned, unpaused partitions, in offset order per partition.

        Waits up to ``timeout_ms`` when nothing is there. Rebalance callbacks run
        on this loop while (or before) it waits, never in another thread.
        """

    def assignment(self) -> set[TopicPartition]: ...

    def pause(self, *partitions: TopicPartition) -> None: ...

    def resume(self, *partitions: TopicPartition) -> None: ...

    def paused(self) -> set[TopicPartition]: ...

    def take_fetched(self, partition: TopicPartition) -> Sequence[ConsumerRecord]:
        """Records of ``partition`` already fetched but not yet returned by ``poll``, without a
        request; they count as returned. Called just before ``pause``, which may discard them."""

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """The next ``poll`` returns records of ``partition`` from ``offset`` on."""

    async def position(self, partition: TopicPartition) -> int: ...

    async def committed(self, partition: TopicPartition) -> OffsetAndMetadata | None: ...

    async def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        """Commit for the group; raises ``CommitFailedError`` if the member lost the partitions."""

    async def end_offsets(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]: ...

    def fetched_end(self, partition: TopicPartition) -> int | None:
        """The log end the last fetch of ``partition`` reported (the high watermark; the last stable
        offset for a ``read_committed`` reader), without a request; None before any fetch."""

    def fetched_lag(self, partition: TopicPartition) -> int | None:
        """How far the consumer's position is behind ``fetched_end`` (records still to fetch);
        None before a fetch of ``partition`` answered."""

    def request_rejoin(self) -> None:
        """Make this member rejoin (a rebalance of the whole group)."""

    async def check_group(self) -> None:
        """Ask the coordinator now whether the group is rebalancing, rather than at the next
        heartbeat (``heartbeat.interval.ms``); if it is, the member joins. It never starts a
        rebalance. Nothing to do on a transport that asks at every poll."""

    @property
    def member_id(self) -> str | None: ...

    @property
    def generation(self) -> int | None:
        """The group generation of the assignment in use (valid in ``on_partitions_assigned``);
        None before the first one, and for a reader."""

    async def close(self, leave_group: bool = True) -> None:
        """Stop. ``leave_group`` sends a leave request so the group rebalances at once."""


class Producer(Protocol):
    """Buffers records per partition and sends them in batches."""

    async def start(self) -> None: ...

    def append(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        timestamp_ms: int | None,
        headers: Headers,
    ) -> None:
        """Buffer one record. Never blocks; ``send_buffered`` hands the buffer on."""

    def buffered(self) -> int:
        """How many appended records have not been handed to ``send_buffered`` yet."""

    async def send_buffered(self) -> None:
        """Hand every buffered record to the network without waiting for acks."""

    async def flush(self) -> None:
        """Wait until every record appended so far is acknowledged.

        Raises ``ProduceError`` (naming topic and partition) for the first failure.
        """

    def acked_ends(self) -> Mapping[TopicPartition, int]:
        """For each partition this producer wrote to, the offset after its last acknowledged
        record (Kafka Streams' ``RecordCollector.offsets()``, plus one): where a checkpoint of a
        changelog goes, known without asking the broker."""

    async def close(self) -> None: ...


class TransactionalProducer(Producer, Protocol):
    """A producer with a ``transactional_id`` (exactly-once). ``start`` initialises the id, which
    fences any older producer with the same id and aborts its open transaction.

    A transaction begins with the first record handed to the network (or with
    ``commit_transaction``'s offsets). Fencing raises ``ProducerFencedError``; any other failure
    leaves the transaction to be aborted.
    """

    @property
    def in_transaction(self) -> bool: ...

    async def commit_transaction(self, offsets: Mapping[TopicPartition, OffsetAndMetadata], group_id: str) -> None:
        """Flush, add ``offsets`` (for ``group_id``) to the transaction and commit it."""

    async def abort_transaction(self) -> None:
        """Drop what was not handed over and abort the open transaction (if any)."""


class Admin(Protocol):
    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def create_topics(
        self, partitions: Mapping[str, int], replication_factor: int = 1,
        configs: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        """Create missing topics (with per-topic ``configs``); existing ones are left as they are."""

    async def delete_topics(self, topics: Sequence[str]) -> None: ...

    async def partition_counts(self, topics: Sequence[str]) -> dict[str, int]:
        """Partition count of each existing topic; missing topics are left out."""

    async def all_partition_counts(self) -> dict[str, int]:
        """Partition count of every topic of the cluster but the broker's own (``__consumer_offsets`` ...)."""


class Transport(Protocol):
    """Makes the clients of one cluster (a Kafka cluster or a memory broker)."""

    name: str

    def consumer(self, settings: ConsumerSettings) -> Consumer: ...

    def producer(self, settings: ProducerSettings) -> Producer: ...

    def admin(self, client_id: str) -> Admin: ...

    def reader(self, client_id: str, read_committed: bool = False) -> Consumer:
        """A consumer with no group, for tests and tools: ``assign`` then ``seek``/``poll``.

        ``read_committed``: skip records of open and aborted transactions (restoring under exactly-once).
        """
