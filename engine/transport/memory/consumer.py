"""MemoryConsumer: a group consumer (or a groupless reader) of a memory broker.

A consumer belongs to the loop that first uses it (``start`` or ``poll``). A group
consumer joins its group at ``subscribe`` + ``start``, or at its first ``poll``;
from then on each ``poll`` first takes the group protocol as far as it goes (see
``membership.py``: revoke, rejoin, lead, apply an assignment), then fetches. A
reader (``MemoryTransport.reader``) has no group: ``assign``, ``seek``, ``poll``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

import anyio

from streamloop.errors import IllegalStateError, TransportError
from streamloop.records import FetchedRecord, TopicPartition
from streamloop.transport.base import ConsumerSettings, OffsetAndMetadata, RebalanceListener
from streamloop.transport.memory.assignment import AssignmentState
from streamloop.transport.memory.broker import MemoryBroker
from streamloop.transport.memory.membership import GroupMembership, MemberState
from streamloop.transport.memory.wakeup import LoopWakeup

DEFAULT_MAX_POLL_RECORDS = 500


class MemoryConsumer:
    """Implements :class:`streamloop.transport.base.Consumer` on a :class:`MemoryBroker`."""

    def __init__(
        self,
        broker: MemoryBroker,
        client_id: str,
        settings: ConsumerSettings | None = None,
    ) -> None:
        """A group consumer with ``settings``; a groupless reader without them."""
        self._broker = broker
        self._client_id = client_id
        self._name = f"consumer {client_id}" if settings else f"reader {client_id}"
        self._auto_offset_reset = settings.auto_offset_reset if settings else "earliest"
        self._wakeup = LoopWakeup(self._name)
        self._assignment = AssignmentState(self._name)
        self._membership = (
            GroupMembership(broker, settings, self._assignment, self._wakeup) if settings else None
        )
        self._started = False
        self._closed = False
        self._polling = False

    def __repr__(self) -> str:
        return f"MemoryConsumer({self._name} on {self._broker!r})"

    @property
    def member_id(self) -> str | None:
        return self._membership.member_id if self._membership else None

    @property
    def generation(self) -> int | None:
        """The group generation of the assignment in use; None while there is none (or a reader)."""
        return self._membership.generation if self._membership else None

    async def start(self) -> None:
        self._check_open()
        self._wakeup.bind()
        self._started = True
        self._maybe_join()

    def subscribe(self, topics: Sequence[str], listener: RebalanceListener) -> None:
        self._check_open()
        if self._membership is None:
            raise IllegalStateError(f"{self._name} has no group; use assign() instead of subscribe().")
        self._membership.subscribe(topics, listener)
        self._maybe_join()

    def subscribe_pattern(self, pattern: re.Pattern[str], listener: RebalanceListener) -> None:
        self._check_open()
        if self._membership is None:
            raise IllegalStateError(f"{self._name} has no group; use assign() instead of subscribe_pattern().")
        self._membership.subscribe_pattern(pattern, listener)
        self._maybe_join()

    def assign(self, partitions: Sequence[TopicPartition]) -> None:
        """Readers only: fetch exactly these partitions, from the earliest offset unless sought."""
        self._check_open()
        if self._membership is not None:
            raise IllegalStateError(
                f"{self._name} is a group consumer; its partitions come from subscribe()."
            )
        self._assignment.assign(partitions)
        self._broker.register_fetcher(self._wakeup, self._assignment.partitions)

    async def poll(
        self, timeout_ms: int, max_records: int | None = None
    ) -> Mapping[TopicPartition, Sequence[FetchedRecord]]:
        """Records of the assigned, unpaused partitions, in offset order per partition.

        At most ``max_records`` (default 500) in all, shared fairly across the
        partitions that have records. Waits up to ``timeout_ms`` for records or for
        the group to finish a rebalance, and returns ``{}`` when the time is up.
        Rebalance callbacks run here, on the caller's loop. Not reentrant: calling
        it from a rebalance callback or from two tasks at once is an error.
        """
        self._check_open()
        if max_records is None:
            max_records = DEFAULT_MAX_POLL_RECORDS
        if max_records < 1:
            raise ValueError(f"max_records must be at least 1, not {max_records}.")
        if self._polling:
            raise IllegalStateError(
                f"{self._name}: poll() is already running (from a rebalance callback, or another task)."
            )
        if self._membership is not None and not self._membership.subscribed:
            raise IllegalStateError(f"{self._name} is not subscribed to any topic; call subscribe() first.")
        self._wakeup.bind()
        deadline = anyio.current_time() + timeout_ms / 1000
        self._polling = True
        try:
            while True:
                self._wakeup.clear()
                # None: the member is stable and may fetch; else how long to wait at most.
                wait_limit: float | None = None
                if self._membership is not None:
                    wait_limit = await self._membership.coordinate()
                if self._closed:
                    return {}
                if wait_limit is None or (self._membership is not None and self._membership.holding):
                    # Stable, or cooperative and still holding its partitions during the rebalance.
                    wait_limit = math.inf if wait_limit is None else wait_limit
                    records = self._fetch(max_records)
                    if records:
                        return records
                remaining = deadline - anyio.current_time()
                if remaining <= 0:
                    return {}
                with anyio.move_on_after(min(remaining, wait_limit)):
                    await self._wakeup.wait()
        finally:
            self._polling = False
            if self._membership is not None:
                self._membership.poll_done()

    def assignment(self) -> set[TopicPartition]:
        return self._assignment.partitions

    def pause(self, *partitions: TopicPartition) -> None:
        self._assignment.pause(partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self._assignment.resume(partitions)
        self._wakeup.wake()

    def paused(self) -> set[TopicPartition]:
        return self._assignment.paused()

    def take_fetched(self, partition: TopicPartition) -> Sequence[FetchedRecord]:
        return []  # poll reads the log directly: nothing is fetched ahead of it

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """The next ``poll`` returns records of ``partition`` from ``offset`` on.

        Unlike Kafka, an offset past the log end is not reset: the consumer waits there.
        """
        self._assignment.seek(partition, offset)
        self._wakeup.wake()

    async def position(self, partition: TopicPartition) -> int:
        """The offset of the next record ``poll`` returns for an assigned partition."""
        self._check_open()
        position = self._assignment.position(partition)
        if position is None:
            self._resolve_positions()
            position = self._assignment.position(partition)
        if position is None:
            raise TransportError(f"{self._name}: {partition} does not exist, so it has no position.")
        return position

    async def committed(self, partition: TopicPartition) -> OffsetAndMetadata | None:
        self._check_open()
        if self._membership is None:
            return None
        return self._broker.committed(self._membership.group_id, TopicPartition(*partition))

    async def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        """Commit for the group; ``CommitFailedError`` unless this member owns every partition.

        Accepted while the member owns the partitions: in its generation, and in its
        ``on_partitions_revoked`` (until it rejoins). Nothing is stored when refused.
        """
        self._check_open()
        if self._membership is None:
            raise IllegalStateError(f"{self._name} has no group to commit to.")
        if offsets:
            self._membership.commit({TopicPartition(*tp): om for tp, om in offsets.items()})

    async def end_offsets(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        self._check_open()
        return self._broker.end_offsets(TopicPartition(*tp) for tp in partitions)

    def fetched_end(self, partition: TopicPartition) -> int | None:
        # Every read sees the whole log: the end a fetch would report is the log's end.
        self._check_open()
        return self._broker.end_offsets([TopicPartition(*partition)])[TopicPartition(*partition)]

    def fetched_lag(self, partition: TopicPartition) -> int | None:
        self._check_open()
        return self._assignment.lag(TopicPartition(*partition))

    def request_rejoin(self) -> None:
        """The next ``poll`` starts a rebalance of the whole group."""
        self._check_open()
        if self._membership is None:
            raise IllegalStateError(f"{self._name} has no group to rejoin.")
        self._membership.request_rejoin()

    async def check_group(self) -> None:
        """Nothing to do: every ``poll`` heartbeats the broker."""
        self._check_open()

    async def close(self, leave_group: bool = True) -> None:
        """Stop. ``leave_group`` leaves at once, so the rest of the group rebalances now;
        otherwise the member stays in the group until ``session_timeout_ms`` passes, as
        after a crash. The rebalance listener is not called. A second close does nothing.
        """
        if self._closed:
            return
        self._closed = True
        if self._membership is not None:
            self._membership.close(leave_group)
        self._broker.unregister_fetcher(self._wakeup)
        self._assignment.clear()
        self._wakeup.wake()

    # ----------------------------------------------------------------- internals

    def _maybe_join(self) -> None:
        membership = self._membership
        if (
            membership is not None
            and self._started
            and membership.subscribed
            and membership.state is MemberState.UNJOINED
            and membership.member_id is None
        ):
            membership.join()

    def _fetch(self, max_records: int) -> dict[TopicPartition, list[FetchedRecord]]:
        self._resolve_positions()
        requests = self._assignment.fetch_requests()
        if requests:
            self._assignment.fetched(self._broker.log_ends(tp for tp, _ in requests))
        fetched = self._broker.fetch(requests, max_records)
        if fetched:
            self._assignment.advance(fetched)
        return fetched

    def _resolve_positions(self) -> None:
        unknown = self._assignment.unknown_positions()
        if unknown:
            group_id = self._membership.group_id if self._membership else None
            self._assignment.set_positions(
                self._broker.starting_offsets(group_id, unknown, self._auto_offset_reset)
            )

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError(f"{self._name} is closed.")
