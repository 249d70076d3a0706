"""``KafkaConsumer``: the engine's ``Consumer`` over aiokafka's, a group member or a groupless reader.

Polling across a rebalance
    ``getmany`` returns nothing from the start of a rebalance until the new
    assignment arrives, and it never returns records fetched under an older
    assignment. On top of that :meth:`KafkaConsumer.poll` adds two guarantees:
    it returns after ``timeout_ms`` even while a rebalance is in progress
    (aiokafka's ``getmany`` would wait for the assignment however long it
    takes), and it never returns records of a new assignment before
    ``on_partitions_assigned`` has finished (records fetched too early are put
    back with a seek and fetched again by a later ``poll``). So ``poll`` must
    not be called from inside ``on_partitions_assigned``. How the callbacks run
    is told in :mod:`streamloop.transport.kafka.rebalance`.

Heartbeats and ``max_poll_interval_ms``
    Heartbeats are a coroutine on the same loop, so CPU-bound work on the loop
    delays them. If ``poll`` is not called for ``max_poll_interval_ms``, the
    heartbeat task makes the member leave the group.

Leaving the group on close is told in :mod:`streamloop.transport.kafka.leave_group`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka import errors as aioerrors

from streamloop import redaction
from streamloop.errors import IllegalStateError, RebalanceInProgressError
from streamloop.records import ConsumerRecord, TopicPartition
from streamloop.stray_cancel import reraise_stray
from streamloop.transport.base import ConsumerSettings, OffsetAndMetadata, RebalanceListener
from streamloop.transport.kafka.errors import commit_failed, illegal_state, stray_request, transport_error
from streamloop.transport.kafka.leave_group import replace_leave_step
from streamloop.transport.kafka.options import client_kwargs
from streamloop.transport.kafka.prefetch import take_prefetched
from streamloop.transport.kafka.rebalance import (
    JOIN_TIMEOUT_LAPSE_MS,
    AssignorAdapter,
    ListenerAdapter,
    RebalanceState,
    adapt_join_requests,
)
from streamloop.transport.kafka.security import client_secrets, security_options
from streamloop.transport.kafka.startup import start_or_clean_up
from streamloop.transport.kafka.structs import aio_offsets, aio_tp, our_tps

log = logging.getLogger(__name__)
# Made once: a poll is the consumer's hot path (see streamloop.stray_cancel).
_STRAY_POLL = stray_request("poll")

__all__ = ["KafkaConsumer"]


class KafkaConsumer:
    """A group consumer (``settings`` given) or a groupless reader (``settings`` None)."""

    def __init__(
        self,
        bootstrap_servers: str,
        common: Mapping[str, object],
        settings: ConsumerSettings | None,
        client_id: str,
        read_committed: bool = False,
        security: Sequence[tuple[str, Mapping[str, object]]] = (),
    ) -> None:
        self._read_committed = read_committed
        self._security = tuple(security)
        self._bootstrap = bootstrap_servers
        self._common = dict(common)
        self._settings = settings
        self._client_id = client_id
        self._consumer: Any = None  # AIOKafkaConsumer once started
        self._closed = False
        # Topics, or a pattern (subscribe_pattern), and the listener: applied again on start.
        self._subscription: tuple[list[str] | re.Pattern[str], ListenerAdapter] | None = None
        self._manual: list[Any] | None = None  # aiokafka TopicPartitions
        self._rebalance = RebalanceState(client_id, settings is not None and settings.cooperative,
                                         lambda: self._consumer)
        # Validate pass-through options early (at construction, not at start).
        self._kwargs = self._build_kwargs()
        layers = self._security if settings is None else (*self._security, ("consumer.", settings.extra))
        self._secrets = client_secrets(self._kwargs, *layers)

    @property
    def options(self) -> Mapping[str, object]:
        """The keyword arguments the aiokafka consumer is made with (secrets included: never log them)."""
        return dict(self._kwargs)

    def _build_kwargs(self) -> dict[str, object]:
        s = self._settings
        kwargs: dict[str, object] = {
            "bootstrap_servers": self._bootstrap,
            "client_id": self._client_id,
            "enable_auto_commit": False,
            "auto_offset_reset": "earliest" if s is None else s.auto_offset_reset,
        }
        if s is None and self._read_committed:
            kwargs["isolation_level"] = "read_committed"
        if s is not None:
            kwargs.update(
                group_id=s.group_id,
                group_instance_id=s.group_instance_id,
                max_poll_interval_ms=s.max_poll_interval_ms,
                # As in the Java client: the broker waits up to max.poll.interval.ms
                # for members to rejoin (aiokafka's default is the session timeout).
                rebalance_timeout_ms=s.max_poll_interval_ms,
                session_timeout_ms=s.session_timeout_ms,
                heartbeat_interval_ms=s.heartbeat_interval_ms,
                request_timeout_ms=s.request_timeout_ms,
                retry_backoff_ms=s.retry_backoff_ms,
                fetch_max_bytes=s.fetch_max_bytes,
                max_partition_fetch_bytes=s.max_partition_fetch_bytes,
                isolation_level=s.isolation_level,
            )
        layers = self._security if s is None else (*self._security, ("consumer.", s.extra))
        kwargs.update(security_options(*layers))
        kwargs.update(client_kwargs(AIOKafkaConsumer, self._common))
        if s is not None:
            kwargs.update(client_kwargs(AIOKafkaConsumer, s.extra))
        return kwargs

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        if self._consumer is not None:
            raise IllegalStateError("the consumer is already started")
        if self._closed:
            raise IllegalStateError("the consumer is closed")
        kwargs = dict(self._kwargs)
        if self._settings is not None:
            kwargs["partition_assignment_strategy"] = (
                AssignorAdapter(self._settings.assignor, self._rebalance),
            )
        # Before it connects: aiokafka logs the login's bytes at DEBUG.
        redaction.register(self, self._secrets)
        consumer = AIOKafkaConsumer(**kwargs)
        try:
            await start_or_clean_up(consumer.start, consumer.stop, "starting the consumer", kwargs)
        except BaseException:
            redaction.unregister(self)
            raise
        self._consumer = consumer
        # Applied after start so that start() does not wait for the first
        # rebalance (aiokafka's start() would when subscribed before it).
        if self._settings is not None:
            adapt_join_requests(consumer._coordinator, self._join_registered,
                                self._settings.max_poll_interval_ms + JOIN_TIMEOUT_LAPSE_MS)
        if self._subscription is not None:
            self._apply_subscription(consumer, *self._subscription)
        elif self._manual is not None:
            consumer.assign(self._manual)

    async def close(self, leave_group: bool = True) -> None:
        """Stop; with ``leave_group`` the member leaves at once (a static member too)."""
        if self._closed:
            return
        self._closed = True
        consumer, self._consumer = self._consumer, None
        try:
            if consumer is None:
                return
            instance_id = None if self._settings is None else self._settings.group_instance_id
            replace_leave_step(consumer._coordinator, leave_group, instance_id)
            await consumer.stop()
        finally:
            redaction.unregister(self)
            self._rebalance.assignment_finished()

    def _require(self) -> Any:
        consumer = self._consumer
        if consumer is None:
            raise IllegalStateError(
                "the consumer is closed" if self._closed else "the consumer is not started"
            )
        return consumer

    # -- subscription ----------------------------------------------------------------

    def subscribe(self, topics: Sequence[str], listener: RebalanceListener) -> None:
        self._subscribe(list(topics), listener)

    def subscribe_pattern(self, pattern: re.Pattern[str], listener: RebalanceListener) -> None:
        """aiokafka matches ``pattern`` against the cluster's topics on each metadata refresh
        (``consumer.metadata.max.age.ms``, 5 minutes by default) and rejoins when the match changes."""
        self._subscribe(pattern, listener)

    def _subscribe(self, topics: list[str] | re.Pattern[str], listener: RebalanceListener) -> None:
        if self._settings is None:
            raise IllegalStateError("a reader has no group: use assign()")
        if self._manual is not None:
            raise IllegalStateError("the consumer uses manual assignment")
        adapter = ListenerAdapter(listener, self._rebalance, self._rejoin_later)
        self._subscription = (topics, adapter)
        if self._consumer is not None:
            self._apply_subscription(self._consumer, topics, adapter)

    @staticmethod
    def _apply_subscription(consumer: Any, topics: list[str] | re.Pattern[str], listener: ListenerAdapter) -> None:
        if isinstance(topics, re.Pattern):
            consumer.subscribe(pattern=topics, listener=listener)
            keep_all_topic_metadata(consumer._client)
        else:
            consumer.subscribe(topics=topics, listener=listener)

    def assign(self, partitions: Sequence[TopicPartition]) -> None:
        if self._subscription is not None:
            raise IllegalStateError("the consumer is subscribed to topics")
        self._manual = [aio_tp(tp) for tp in partitions]
        if self._consumer is not None:
            self._consumer.assign(self._manual)

    def assignment(self) -> set[TopicPartition]:
        if self._consumer is None:
            return set()
        return our_tps(self._consumer.assignment())

    @property
    def member_id(self) -> str | None:
        consumer = self._consumer
        if consumer is None or self._settings is None:
            return None
        member = getattr(consumer._coordinator, "member_id", None)
        return member or None

    @property
    def generation(self) -> int | None:
        consumer = self._consumer
        if consumer is None or self._settings is None:
            return None
        # Set from the JoinGroup answer, so in on_partitions_assigned it is the assignment's generation.
        generation = int(consumer._coordinator.generation)
        return generation if generation >= 0 else None

    def request_rejoin(self) -> None:
        # aiokafka has no public enforceRebalance(); the coordinator's
        # request_rejoin() (private API) wakes its coordination task, which
        # revokes and sends JoinGroup. The bumped count changes this member's
        # subscription metadata, so the broker rebalances the whole group even
        # when this member is not the leader.
        consumer = self._require()
        if self._settings is None:
            raise IllegalStateError("a reader has no group to rejoin")
        self._rebalance.rejoin_count += 1
        consumer._coordinator.request_rejoin()

    async def check_group(self) -> None:
        # aiokafka asks only from its heartbeat task, once per heartbeat interval; one more
        # heartbeat (private API) takes the same path: a RebalanceInProgress answer makes its
        # coordination task join, other answers are handled as the heartbeat task handles them.
        consumer = self._consumer
        if consumer is None or self._settings is None:
            return
        coordinator = consumer._coordinator
        if coordinator.coordinator_id is None or coordinator.generation < 0:
            return  # no group yet, or joining: the JoinGroup answer will tell
        try:
            await coordinator._do_heartbeat()
        except aioerrors.KafkaError as exc:
            log.debug("An early heartbeat failed (the heartbeat task asks again): %r", exc)

    def _join_registered(self) -> None:
        if self._subscription is not None:
            self._subscription[1].join_registered()

    def _rejoin_later(self) -> None:
        if self._consumer is not None:
            self.request_rejoin()

    # -- fetching --------------------------------------------------------------------

    async def poll(
        self, timeout_ms: int, max_records: int | None = None
    ) -> Mapping[TopicPartition, Sequence[ConsumerRecord]]:
        consumer = self._require()
        rebalance = self._rebalance
        rebalance.raise_callback_error()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        try:
            # getmany() waits for a pending assignment without a time limit. An asyncio deadline
            # cancels aiokafka's coroutine once (see the package's docstring).
            async with asyncio.timeout_at(deadline):
                with reraise_stray(_STRAY_POLL):
                    records: dict[Any, list[Any]] = await consumer.getmany(timeout_ms=timeout_ms,
                                                                           max_records=max_records)
        except TimeoutError:
            records = {}
        except aioerrors.KafkaError as exc:
            rebalance.raise_callback_error()
            raise transport_error(exc, "poll") from exc
        if records and rebalance.assigning:
            # Records of a new assignment while the engine's on_partitions_assigned
            # is still running: put them back (seek to the first one of each
            # partition, so nothing is lost) and wait for the callback, at most
            # until the deadline.
            for tp, batch in records.items():
                if batch:
                    with contextlib.suppress(aioerrors.IllegalStateError):  # no longer assigned: nothing to put back
                        consumer.seek(tp, batch[0].offset)
            records = {}
            remaining = deadline - loop.time()
            if remaining > 0:
                await rebalance.assigned(remaining)
        rebalance.raise_callback_error()
        return records  # aiokafka's ConsumerRecord fits the engine's protocol

    def pause(self, *partitions: TopicPartition) -> None:
        try:
            self._require().pause(*(aio_tp(tp) for tp in partitions))
        except aioerrors.IllegalStateError as exc:
            raise illegal_state(exc) from exc

    def take_fetched(self, partition: TopicPartition) -> Sequence[ConsumerRecord]:
        if self._consumer is None or self._rebalance.assigning:
            return []  # a new assignment's records wait for its callback (see ``poll``)
        return take_prefetched(self._consumer, aio_tp(partition))

    def resume(self, *partitions: TopicPartition) -> None:
        try:
            self._require().resume(*(aio_tp(tp) for tp in partitions))
        except aioerrors.IllegalStateError as exc:
            raise illegal_state(exc) from exc

    def paused(self) -> set[TopicPartition]:
        if self._consumer is None:
            return set()
        return our_tps(self._consumer.paused())

    def seek(self, partition: TopicPartition, offset: int) -> None:
        try:
            self._require().seek(aio_tp(partition), offset)
        except aioerrors.IllegalStateError as exc:
            raise illegal_state(exc) from exc

    async def position(self, partition: TopicPartition) -> int:
        consumer = self._require()
        try:
            with reraise_stray(stray_request(f"position of {partition}")):
                return int(await consumer.position(aio_tp(partition)))
        except aioerrors.IllegalStateError as exc:
            raise illegal_state(exc) from exc
        except aioerrors.KafkaError as exc:
            raise transport_error(exc, f"position of {partition}") from exc

    async def end_offsets(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        consumer = self._require()
        if not partitions:
            return {}
        try:
            # aiokafka asks each leader in a task it gathers: see streamloop.stray_cancel.
            with reraise_stray(stray_request("end_offsets")):
                offsets = await consumer.end_offsets([aio_tp(tp) for tp in partitions])
        except aioerrors.KafkaError as exc:
            raise transport_error(exc, "end_offsets") from exc
        return {TopicPartition(tp.topic, tp.partition): int(off) for tp, off in offsets.items()}

    def fetched_end(self, partition: TopicPartition) -> int | None:
        consumer = self._consumer
        if consumer is None:
            return None
        tp = aio_tp(partition)
        try:
            end = consumer.last_stable_offset(tp) if self._read_committed else consumer.highwater(tp)
        except (AssertionError, aioerrors.IllegalStateError):
            return None  # not assigned
        return None if end is None else int(end)

    def fetched_lag(self, partition: TopicPartition) -> int | None:
        end = self.fetched_end(partition)
        if end is None or self._consumer is None:
            return None
        # aiokafka keeps the position (past what getmany returned) only in its private subscription
        # state, read defensively: without it the lag stays unknown (the task waits its idle time).
        try:
            state = self._consumer._subscription.subscription.assignment.state_value(aio_tp(partition))
            position = state.position if state is not None and state.has_valid_position else None
        except (AttributeError, AssertionError, KeyError):
            return None
        return None if position is None else max(0, end - int(position))

    # -- commits ---------------------------------------------------------------------

    async def committed(self, partition: TopicPartition) -> OffsetAndMetadata | None:
        consumer = self._require()
        if self._settings is None:
            raise IllegalStateError("a reader has no group and no committed offsets")
        tp = aio_tp(partition)
        try:
            # Consumer.committed() drops the metadata; the coordinator keeps it.
            with reraise_stray(stray_request(f"committed offset of {partition}")):
                found = await asyncio.wait_for(consumer._coordinator.fetch_committed_offsets([tp]),
                                               self._settings.request_timeout_ms / 1000)
        except (aioerrors.KafkaError, TimeoutError) as exc:
            raise transport_error(exc, f"committed offset of {partition}") from exc
        entry = found.get(tp)
        if entry is None or entry.offset < 0:
            return None
        return OffsetAndMetadata(int(entry.offset), entry.metadata or "")

    async def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        consumer = self._require()
        if self._settings is None:
            raise IllegalStateError("a reader has no group to commit for")
        if not offsets:
            return
        if self._rebalance.held is not None:
            # As Java's consumer under the cooperative protocol: no commit between JoinGroup and the
            # new assignment. One sent under the old generation can reach the broker after the join
            # completed, and its IllegalGeneration answer would make aiokafka drop the membership.
            raise RebalanceInProgressError(f"Commit of {sorted(map(str, offsets))} waits: the group is rebalancing")
        payload = aio_offsets(offsets)
        revoking = self._rebalance.revoking
        # Cooperative: partitions being revoked left aiokafka's assignment already, and its commit()
        # refuses them; the coordinator takes them (the broker checks the member and generation).
        commit = (consumer._coordinator.commit_offsets(None, payload) if not revoking.isdisjoint(offsets)
                  else consumer.commit(payload))
        try:
            # aiokafka retries a commit with no deadline of its own (a stalled coordinator
            # hangs it for good); bound it like Java's commitSync is bounded by its API timeout.
            with reraise_stray(stray_request("commit")):
                await asyncio.wait_for(commit, self._settings.request_timeout_ms / 1000)
        except TimeoutError as exc:
            raise transport_error(exc, "commit") from exc
        except (aioerrors.CommitFailedError, aioerrors.IllegalStateError) as exc:
            if self._rebalance.cooperative and isinstance(exc.__cause__, aioerrors.RebalanceInProgressError):
                # Cooperative: the member still owns its partitions while the group completes a
                # rebalance (KIP-429); the commit is retried, as Kafka Streams does.
                raise RebalanceInProgressError(f"Commit of {sorted(map(str, offsets))} waits: "
                                               "the group is completing a rebalance") from exc
            # The group rebalanced, or the partitions are no longer (or not yet) this member's.
            raise commit_failed(exc, sorted(str(tp) for tp in offsets)) from exc
        except aioerrors.KafkaError as exc:
            raise transport_error(exc, "commit") from exc


def keep_all_topic_metadata(client: Any) -> None:
    """A pattern subscription must see every topic on each metadata refresh, but aiokafka's fetcher
    adds a topic whose partition leader it does not know (a deleted topic's, while its task still
    asks for offsets) to the topics the client tracks, and from then on the client asks for those
    alone: the pattern matches nothing and the member rejoins with no topics for good. Here a
    lookup of an unknown topic refreshes the metadata of all topics instead."""
    if getattr(client, "_keeps_all_topics", False):
        return

    def add_topic(_topic: str) -> Any:
        return client.force_metadata_update()

    client.add_topic = add_topic
    client._keeps_all_topics = True
