"""MemoryBroker: an in-process Kafka-like broker shared by every client of one ``memory://`` URL.

It holds topics (append-only partition logs), consumer groups (with their
committed offsets) and the wake-ups of the consumers waiting for records. Clients
of several stream threads, each with its own event loop, call it concurrently:
every method takes one ``threading.Lock`` for a short, non-blocking critical
section and never awaits. Wake-ups collected while the lock is held are delivered
after it is released (:class:`~streamloop.transport.memory.wakeup.LoopWakeup`).

Time comes from an injectable :class:`streamloop.clock.Clock` (liveness deadlines
on ``monotonic_ms()``, record timestamps on ``wall_ms()``), and everything
random from one seeded
``random.Random`` (:attr:`MemoryBroker.random`), so a test can replay a run.

The methods below the admin section are the broker's side of the clients'
requests (produce, fetch, join, heartbeat, sync, commit). Fault injection
(delayed or failed produce and commit, slow partitions) belongs in these same
entry points: each client request passes through exactly one of them.
"""

from __future__ import annotations

import logging
import random
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import ClassVar

from streamloop.clock import SYSTEM_CLOCK, Clock
from streamloop.errors import TransportError
from streamloop.records import FetchedRecord, TopicPartition
from streamloop.transport.base import MemberAssignment, OffsetAndMetadata
from streamloop.transport.memory.group import (
    ConsumerGroup,
    GroupDescription,
    GroupView,
    JoinRequest,
)
from streamloop.transport.memory.log import PartitionLog, ProducedRecord
from streamloop.transport.memory.wakeup import LoopWakeup

log = logging.getLogger(__name__)

URL_SCHEME = "memory://"


@dataclass
class _ProduceFault:
    """An injected produce failure: the next ``times`` produce calls to its topic fail with ``error``."""

    error: BaseException
    times: int


class MemoryBroker:
    """Topics, partition logs, consumer groups and committed offsets of one memory cluster.

    Brokers are found by URL through a process-wide registry (:meth:`for_url`), so
    several clients in one process that use the same ``memory://name`` share one
    broker. A test that needs its own clock or seed builds a broker and
    :meth:`install`\\ s it before the clients look it up, or hands it to
    ``MemoryTransport`` directly.
    """

    _registry: ClassVar[dict[str, MemoryBroker]] = {}
    _registry_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, name: str = "", *, clock: Clock = SYSTEM_CLOCK, seed: int = 0) -> None:
        self.name = name
        self.clock = clock
        self.random = random.Random(seed)
        self._lock = threading.Lock()
        self._pending_wakeups: set[LoopWakeup] = set()
        self._topics: dict[str, list[PartitionLog]] = {}
        self._groups: dict[str, ConsumerGroup] = {}
        self._fetchers: dict[LoopWakeup, frozenset[TopicPartition]] = {}
        # Fault injection for tests: topic → [error, produce calls left to fail].
        self._produce_faults: dict[str, _ProduceFault] = {}

    def __repr__(self) -> str:
        return f"MemoryBroker({URL_SCHEME}{self.name})"

    # ------------------------------------------------------------------ registry

    @staticmethod
    def name_from_url(url: str) -> str:
        """``memory://name`` → ``name``; ``memory://`` → ``""`` (the default broker)."""
        if not url.startswith(URL_SCHEME):
            raise ValueError(f"Not a memory broker URL: {url!r}; expected 'memory://<name>'.")
        return url[len(URL_SCHEME) :]

    @classmethod
    def for_url(cls, url: str) -> MemoryBroker:
        """The broker registered for ``url``, created (system clock, seed 0) on first use."""
        name = cls.name_from_url(url)
        with cls._registry_lock:
            broker = cls._registry.get(name)
            if broker is None:
                broker = cls._registry[name] = cls(name)
            return broker

    @classmethod
    def install(cls, broker: MemoryBroker) -> MemoryBroker:
        """Register ``broker`` under its name, replacing any broker registered there."""
        with cls._registry_lock:
            cls._registry[broker.name] = broker
        return broker

    @classmethod
    def reset(cls, name: str = "") -> None:
        """Forget the broker registered as ``name``; the next :meth:`for_url` makes a fresh one."""
        with cls._registry_lock:
            cls._registry.pop(name, None)

    # ------------------------------------------------------------------ topics

    def now_ms(self) -> int:
        """The broker's wall clock in ms, the timestamp of records produced without one."""
        return self.clock.wall_ms()

    def create_topics(self, partitions: Mapping[str, int]) -> None:
        """Create missing topics; existing ones keep their partitions."""
        for topic, count in partitions.items():
            if count < 1:
                raise TransportError(f"Cannot create topic '{topic}' with {count} partitions; it needs at least 1.")
        with self._locked():
            created = [t for t in partitions if t not in self._topics]
            for topic in created:
                self._topics[topic] = [
                    PartitionLog(TopicPartition(topic, p)) for p in range(partitions[topic])
                ]
            if created:
                log.debug("%r: created topics %s", self, created)
                self._topics_changed(created)

    def delete_topics(self, topics: Sequence[str]) -> None:
        """Delete topics with their records and committed offsets; missing topics are ignored."""
        with self._locked():
            deleted = [t for t in topics if self._topics.pop(t, None) is not None]
            if not deleted:
                return
            log.debug("%r: deleted topics %s", self, deleted)
            for group in self._groups.values():
                for tp in [tp for tp in group.offsets if tp.topic in deleted]:
                    del group.offsets[tp]
            self._topics_changed(deleted)

    def topic_names(self) -> list[str]:
        with self._locked():
            return list(self._topics)

    def partition_counts(self, topics: Sequence[str]) -> dict[str, int]:
        with self._locked():
            return {t: len(self._topics[t]) for t in topics if t in self._topics}

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Log end offsets; raises ``TransportError`` naming a partition that does not exist."""
        with self._locked():
            return {tp: self._log(tp).end_offset for tp in partitions}

    def records(self, partition: TopicPartition) -> list[FetchedRecord]:
        """Every record of one partition, in offset order (for tests and tools)."""
        with self._locked():
            partition_log = self._log(partition)
            return partition_log.read(0, partition_log.end_offset)

    # ------------------------------------------------------------------ produce and fetch

    def fail_produce(self, topic: str, error: BaseException, times: int) -> None:
        """Fault injection: the next ``times`` produce calls to ``topic`` fail with ``error``
        (nothing of that batch is written), as a broker outage would make them."""
        with self._locked():
            self._produce_faults[topic] = _ProduceFault(error, times)

    def produce(
        self, batches: Mapping[TopicPartition, Sequence[ProducedRecord]],
        ends: dict[TopicPartition, int] | None = None,
    ) -> dict[TopicPartition, str | BaseException]:
        """Append each batch to its partition, atomically and in order, and wake its fetchers.

        Returns the partitions whose batch was not written, with the reason (a
        partition that does not exist), like the per-partition errors of a Kafka
        produce response; ``ends`` gets the offset after each written batch (its acks).
        Caller: ``MemoryProducer.send_buffered``.
        """
        failed: dict[TopicPartition, str | BaseException] = {}
        with self._locked():
            written: set[TopicPartition] = set()
            for tp, batch in batches.items():
                partition_log = self._log_or_none(tp)
                if partition_log is None:
                    failed[tp] = self._unknown(tp)
                    continue
                fault = self._produce_faults.get(tp.topic)
                if fault is not None and fault.times > 0:
                    fault.times -= 1
                    failed[tp] = fault.error
                    continue
                for record in batch:
                    partition_log.append(record)
                written.add(tp)
                if ends is not None:
                    ends[tp] = partition_log.end_offset
            for wakeup, fetched in self._fetchers.items():
                if not written.isdisjoint(fetched):
                    self._pending_wakeups.add(wakeup)
        return failed

    def log_ends(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The end of each of ``partitions`` that exists: what a fetch reports as the high watermark."""
        with self._locked():
            return {tp: log.end_offset for tp in partitions if (log := self._log_or_none(tp)) is not None}

    def fetch(
        self, requests: Sequence[tuple[TopicPartition, int]], max_records: int
    ) -> dict[TopicPartition, list[FetchedRecord]]:
        """Records from each ``(partition, position)``, at most ``max_records`` in all.

        Partitions get an equal share first, in the order given (the caller rotates
        it), then the rest fills up in the same order. Positions at or past the log
        end, and partitions that do not exist, give nothing.
        Caller: ``MemoryConsumer.poll``.
        """
        with self._locked():
            available = [
                (tp, position, partition_log)
                for tp, position in requests
                if (partition_log := self._log_or_none(tp)) is not None
                and position < partition_log.end_offset
            ]
            if not available:
                return {}
            fetched: dict[TopicPartition, list[FetchedRecord]] = {}
            remaining = max_records
            share = max(1, max_records // len(available))
            for tp, position, partition_log in available:
                if remaining <= 0:
                    break
                batch = partition_log.read(position, min(share, remaining))
                fetched[tp] = batch
                remaining -= len(batch)
            for tp, position, partition_log in available:
                if remaining <= 0:
                    break
                batch = fetched.setdefault(tp, [])
                more = partition_log.read(position + len(batch), remaining)
                batch.extend(more)
                remaining -= len(more)
        return {tp: batch for tp, batch in fetched.items() if batch}

    def register_fetcher(self, wakeup: LoopWakeup, partitions: Iterable[TopicPartition]) -> None:
        """Wake ``wakeup`` when records are appended to ``partitions`` (replaces the last set)."""
        with self._locked():
            self._fetchers[wakeup] = frozenset(partitions)

    def unregister_fetcher(self, wakeup: LoopWakeup) -> None:
        with self._locked():
            self._fetchers.pop(wakeup, None)

    def starting_offsets(
        self, group_id: str | None, partitions: Iterable[TopicPartition], auto_offset_reset: str
    ) -> dict[TopicPartition, int]:
        """Where a consumer starts on each partition: the group's committed offset, else the reset.

        ``auto_offset_reset`` is ``"earliest"``, ``"latest"`` or ``"none"`` (a
        ``TransportError`` when there is no committed offset). A committed offset
        past the log end is reset as well. Partitions that do not exist are left out.
        """
        with self._locked():
            group = self._groups.get(group_id) if group_id is not None else None
            offsets: dict[TopicPartition, int] = {}
            for tp in partitions:
                partition_log = self._log_or_none(tp)
                if partition_log is None:
                    continue
                committed = group.offsets.get(tp) if group is not None else None
                if committed is not None and committed.offset <= partition_log.end_offset:
                    offsets[tp] = committed.offset
                elif auto_offset_reset == "earliest":
                    offsets[tp] = 0
                elif auto_offset_reset == "latest":
                    offsets[tp] = partition_log.end_offset
                else:
                    raise TransportError(
                        f"Group '{group_id}' has no valid committed offset for {tp} and "
                        f"auto.offset.reset is '{auto_offset_reset}'. Commit an offset for it, "
                        "or set auto.offset.reset to 'earliest' or 'latest'."
                    )
            return offsets

    # ------------------------------------------------------------------ groups

    def join_group(self, group_id: str, request: JoinRequest) -> str:
        with self._locked():
            return self._group(group_id).join(request, self.clock.monotonic_ms())

    def heartbeat(self, group_id: str, member_id: str | None, *, rejoin: bool) -> GroupView:
        with self._locked():
            return self._group(group_id).heartbeat(member_id, self.clock.monotonic_ms(), rejoin=rejoin)

    def poll_done(self, group_id: str, member_id: str | None) -> None:
        with self._locked():
            self._group(group_id).poll_done(member_id, self.clock.monotonic_ms())

    def sync_group(
        self,
        group_id: str,
        member_id: str | None,
        generation: int,
        assignments: Mapping[str, MemberAssignment],
    ) -> bool:
        with self._locked():
            return self._group(group_id).sync(
                member_id, generation, assignments, self.clock.monotonic_ms()
            )

    def assignment_applied(self, group_id: str, member_id: str | None, generation: int,
                           partitions: Iterable[TopicPartition]) -> None:
        with self._locked():
            self._group(group_id).applied(member_id, generation, partitions)

    def leave_group(self, group_id: str, member_id: str | None) -> None:
        with self._locked():
            self._group(group_id).leave(member_id, self.clock.monotonic_ms())

    def stop_member(self, group_id: str, member_id: str | None) -> None:
        with self._locked():
            self._group(group_id).stop(member_id, self.clock.monotonic_ms())

    def commit(
        self,
        group_id: str,
        member_id: str | None,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
    ) -> None:
        with self._locked():
            self._group(group_id).commit(member_id, offsets, self.clock.monotonic_ms())

    def committed(self, group_id: str, partition: TopicPartition) -> OffsetAndMetadata | None:
        with self._locked():
            group = self._groups.get(group_id)
            return group.offsets.get(partition) if group is not None else None

    def describe_group(self, group_id: str) -> GroupDescription | None:
        """A snapshot of the group (state, generation, leader, owned partitions), or None."""
        with self._locked():
            group = self._groups.get(group_id)
            return group.describe() if group is not None else None

    # ------------------------------------------------------------------ internals

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the lock, then deliver the wake-ups collected meanwhile, after releasing it."""
        self._lock.acquire()
        try:
            yield
        finally:
            wakeups, self._pending_wakeups = self._pending_wakeups, set()
            self._lock.release()
            for wakeup in wakeups:
                wakeup.wake()

    def _defer_wakeup(self, wakeup: LoopWakeup) -> None:
        # Look the set up on each call: ``_locked`` swaps in a new one every time.
        self._pending_wakeups.add(wakeup)

    def _group(self, group_id: str) -> ConsumerGroup:
        group = self._groups.get(group_id)
        if group is None:
            group = self._groups[group_id] = ConsumerGroup(
                group_id,
                wake=self._defer_wakeup,
                partition_count=self._partition_count,
                topic_names=lambda: list(self._topics),
                new_member_id=self._new_member_id,
            )
        return group

    def _partition_count(self, topic: str) -> int | None:
        partitions = self._topics.get(topic)
        return None if partitions is None else len(partitions)

    def _new_member_id(self, client_id: str) -> str:
        return f"{client_id}-{uuid.UUID(int=self.random.getrandbits(128), version=4)}"

    def _topics_changed(self, topics: Sequence[str]) -> None:
        now = self.clock.monotonic_ms()
        for group in self._groups.values():
            group.topics_changed(topics, now)

    def _log_or_none(self, tp: TopicPartition) -> PartitionLog | None:
        partitions = self._topics.get(tp.topic)
        if partitions is None or not 0 <= tp.partition < len(partitions):
            return None
        return partitions[tp.partition]

    def _log(self, tp: TopicPartition) -> PartitionLog:
        partition_log = self._log_or_none(tp)
        if partition_log is None:
            raise TransportError(f"{self!r}: {self._unknown(tp)}")
        return partition_log

    def _unknown(self, tp: TopicPartition) -> str:
        partitions = self._topics.get(tp.topic)
        if partitions is None:
            return f"topic '{tp.topic}' does not exist"
        return f"topic '{tp.topic}' has {len(partitions)} partitions, so partition {tp.partition} does not exist"
