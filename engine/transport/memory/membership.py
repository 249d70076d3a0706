"""One consumer's side of the group protocol, run on the consumer's loop inside ``poll``.

Member states (the group's side is drawn in ``group.py``)::

               join                    assignment arrives              callback done
    UNJOINED ────────▶ JOINING ───────────────────────────▶ ASSIGNING ───────────────▶ STABLE
       ▲  ▲               │ (in the join barrier, then                                  │
       │  │               │  waiting for the leader; the                                │ a rebalance
       │  └───────────────┘  leader runs its assignor)                                  │ starts, or the
       │   a new rebalance                                                              │ member was removed
       │   started first                                                                ▼
       └──────────────────────────────── on_partitions_revoked done ───────────── REVOKING

    UNJOINED, JOINING ──another member took over our group.instance.id──▶ FENCED
    any ──close()──▶ CLOSED

Every step happens in :meth:`GroupMembership.coordinate`, which ``poll`` calls each
time before it fetches: it heartbeats the broker, then does what the group view
asks (revoke and rejoin, run the leader's assignor, apply an assignment), and
returns when the member is STABLE (fetch) or has to wait for the rest of the group.
Rebalance callbacks therefore always run on the consumer's own loop, inside poll.

A cooperative member (``ConsumerSettings.cooperative``) goes through the same states but
keeps its assignment from STABLE through REVOKING, UNJOINED and JOINING (``holding``):
``poll`` fetches its partitions meanwhile. ASSIGNING revokes only what the new assignment
lost, keeps the positions of what stays, tells the broker (``assignment_applied``), and
rejoins at once when it lost partitions, for the follow-up rebalance. A member the group
removed has lost everything and revokes it all, as an eager one.

Caller: ``MemoryConsumer``. Affects: the consumer's ``AssignmentState``.
"""

from __future__ import annotations

import enum
import logging
import math
import re
from collections.abc import Mapping, Sequence

from streamloop.errors import IllegalStateError, TransportError
from streamloop.lifecycle import StateMachine
from streamloop.logcontext import LogContext
from streamloop.records import TopicPartition
from streamloop.transport.base import (
    ConsumerSettings,
    MemberAssignment,
    OffsetAndMetadata,
    RebalanceListener,
)
from streamloop.transport.memory.assignment import AssignmentState
from streamloop.transport.memory.broker import MemoryBroker
from streamloop.transport.memory.group import GroupState, JoinRequest, LeaderTask
from streamloop.transport.memory.wakeup import LoopWakeup

log = logging.getLogger(__name__)


# A waiter looks at the group again at least this long after a liveness deadline
# came due, so that a deadline on a manual clock does not make it spin.
_MIN_WAIT_MS = 10


class MemberState(enum.Enum):
    UNJOINED = "UNJOINED"
    JOINING = "JOINING"
    ASSIGNING = "ASSIGNING"
    STABLE = "STABLE"
    REVOKING = "REVOKING"
    FENCED = "FENCED"
    CLOSED = "CLOSED"

    def __str__(self) -> str:
        return self.value


_MEMBER_TRANSITIONS: dict[MemberState, frozenset[MemberState]] = {
    MemberState.UNJOINED: frozenset({MemberState.JOINING, MemberState.FENCED, MemberState.CLOSED}),
    MemberState.JOINING: frozenset(
        {MemberState.ASSIGNING, MemberState.UNJOINED, MemberState.CLOSED}
    ),
    MemberState.ASSIGNING: frozenset({MemberState.STABLE, MemberState.CLOSED}),
    MemberState.STABLE: frozenset({MemberState.REVOKING, MemberState.CLOSED}),
    MemberState.REVOKING: frozenset({MemberState.UNJOINED, MemberState.CLOSED}),
    MemberState.FENCED: frozenset({MemberState.CLOSED}),
    MemberState.CLOSED: frozenset(),
}


class GroupMembership:
    def __init__(
        self,
        broker: MemoryBroker,
        settings: ConsumerSettings,
        assignment: AssignmentState,
        wakeup: LoopWakeup,
    ) -> None:
        self._broker = broker
        self._settings = settings
        self._assignment = assignment
        self._wakeup = wakeup
        self._topics: tuple[str, ...] = ()
        self._pattern: re.Pattern[str] | None = None
        self._listener: RebalanceListener | None = None
        self._rejoin_requested = False
        self._log = LogContext(log, f"consumer [{settings.client_id}] group [{settings.group_id}] ")
        self._state = StateMachine(
            f"consumer {settings.client_id}", MemberState.UNJOINED, _MEMBER_TRANSITIONS, self._log, logging.DEBUG
        )
        self.member_id: str | None = None
        self.generation: int | None = None

    @property
    def state(self) -> MemberState:
        return self._state.state

    @property
    def group_id(self) -> str:
        return self._settings.group_id

    @property
    def subscribed(self) -> bool:
        return bool(self._topics) or self._pattern is not None

    def subscribe_pattern(self, pattern: re.Pattern[str], listener: RebalanceListener) -> None:
        """Subscribe to the topics ``pattern.match`` accepts: resolved at each join, and the group
        rebalances when a topic it matches is created or deleted (the broker tells it at once)."""
        changed = pattern != self._pattern or bool(self._topics)
        self._topics = ()
        self._pattern = pattern
        self._listener = listener
        if changed and self.state is not MemberState.UNJOINED:
            self.request_rejoin()

    def subscribe(self, topics: Sequence[str], listener: RebalanceListener) -> None:
        """Set topics and listener; a member already in the group rejoins with them."""
        topics = tuple(dict.fromkeys(topics))
        if not topics:
            raise ValueError(f"Consumer {self._settings.client_id}: subscribe needs at least one topic.")
        changed = topics != self._topics or self._pattern is not None
        self._topics = topics
        self._pattern = None
        self._listener = listener
        if changed and self.state is not MemberState.UNJOINED:
            self.request_rejoin()

    def request_rejoin(self) -> None:
        """The next ``coordinate`` asks the group for a rebalance."""
        self._rejoin_requested = True
        self._wakeup.wake()

    def join(self) -> None:
        """Send a join with a fresh subscription (from UNJOINED)."""
        pattern = self._pattern
        topics = self._topics if pattern is None else tuple(
            sorted(t for t in self._broker.topic_names() if pattern.match(t)))
        user_data = self._settings.assignor.subscription_user_data(topics)
        self.member_id = self._broker.join_group(
            self.group_id,
            JoinRequest(
                member_id=self.member_id,
                client_id=self._settings.client_id,
                group_instance_id=self._settings.group_instance_id,
                topics=topics,
                user_data=user_data,
                assignor_name=self._settings.assignor.name,
                max_poll_interval_ms=self._settings.max_poll_interval_ms,
                session_timeout_ms=self._settings.session_timeout_ms,
                wakeup=self._wakeup,
                cooperative=self._settings.cooperative,
                owned=tuple(sorted(self._assignment.partitions)),
                pattern=pattern,
            ),
        )
        self._transition_to(MemberState.JOINING)
        if self._listener is not None:
            self._listener.on_join_registered()

    async def coordinate(self) -> float | None:
        """Advance the protocol as far as it goes without waiting for other members.

        Returns None when the member is STABLE (``poll`` may fetch), otherwise the
        longest ``poll`` should wait for a wake-up before calling again (math.inf
        for "until woken"). Raises what a rebalance callback or the assignor raised;
        the next call carries on from where the protocol stands.
        """
        while self.state is not MemberState.CLOSED:
            if self.state is MemberState.FENCED:
                raise self._fenced_error()
            rejoin, self._rejoin_requested = self._rejoin_requested, False
            view = self._broker.heartbeat(self.group_id, self.member_id, rejoin=rejoin)
            must_join = view.fenced or not view.member_known or (
                view.state is GroupState.PREPARING_REBALANCE and not view.joined
            )
            keep = self._settings.cooperative and view.member_known and not view.fenced
            if must_join and (self.state is not MemberState.UNJOINED or (not keep and self._assignment.partitions)):
                if not view.member_known:
                    self._log.info("Member %s is no longer in the group", self.member_id)
                await self._drop_assignment(keep)
                continue  # look again: the group (or this consumer) moved on during the callback
            if view.fenced:
                self._transition_to(MemberState.FENCED)
                raise self._fenced_error()
            if must_join:
                if not view.member_known:
                    self.member_id = None
                self.join()
            elif view.state is GroupState.STABLE and view.assignment is not None:
                if self.state is MemberState.STABLE and self.generation == view.generation:
                    return None
                await self._apply(view.generation, view.assignment)
            elif view.leader_task is not None:
                self._lead(view.leader_task)
            else:
                # In the join barrier, or waiting for the leader's assignment.
                if view.next_deadline_in_ms is None:
                    return math.inf
                return max(view.next_deadline_in_ms, _MIN_WAIT_MS) / 1000
        return None

    def poll_done(self) -> None:
        if self.member_id is not None and self.state is not MemberState.CLOSED:
            self._broker.poll_done(self.group_id, self.member_id)

    def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        self._broker.commit(self.group_id, self.member_id, offsets)

    def close(self, leave_group: bool) -> None:
        """Leave the group at once, or just stop (removed after ``session_timeout_ms``)."""
        if self.state is MemberState.CLOSED:
            return
        if self.member_id is not None and self.state is not MemberState.FENCED:
            if leave_group:
                self._broker.leave_group(self.group_id, self.member_id)
            else:
                self._broker.stop_member(self.group_id, self.member_id)
        self._transition_to(MemberState.CLOSED)

    # ----------------------------------------------------------------- steps

    @property
    def holding(self) -> bool:
        """Cooperative, between a rebalance's start and its assignment: ``poll`` may fetch."""
        return self._settings.cooperative and self.state in (MemberState.UNJOINED, MemberState.JOINING) \
            and bool(self._assignment.partitions)

    async def _drop_assignment(self, keep: bool) -> None:
        """Before (re)joining: revoke what the member holds (STABLE), or just forget the join.

        ``keep``: cooperative, the member stays in the group and keeps its partitions."""
        rejoining = self.state in (MemberState.UNJOINED, MemberState.JOINING)
        if rejoining and not keep and self._assignment.partitions:
            # A cooperative member removed while it was rejoining: it lost what it held.
            await self._require_listener().on_partitions_revoked(self._assignment.partitions)
            self._release()
        if self.state is MemberState.JOINING:
            self._transition_to(MemberState.UNJOINED)
        elif self.state is MemberState.STABLE:
            await self._revoke(keep)

    async def _revoke(self, keep: bool) -> None:
        self._transition_to(MemberState.REVOKING)
        revoked = set() if keep else self._assignment.partitions
        self._log.debug(
            "Member %s revoking %s (generation %s)", self.member_id, sorted(revoked), self.generation
        )
        try:
            await self._require_listener().on_partitions_revoked(revoked)
        finally:
            if not keep:
                self._release()
            if self.state is MemberState.REVOKING:  # not closed from inside the callback
                self._transition_to(MemberState.UNJOINED)

    def _release(self) -> None:
        self._assignment.clear()
        self.generation = None
        if self.state is not MemberState.CLOSED:
            self._broker.register_fetcher(self._wakeup, ())

    def _lead(self, task: LeaderTask) -> None:
        self._log.debug(
            "Member %s leads: assigning generation %s with %s",
            self.member_id,
            task.generation,
            self._settings.assignor.name,
        )
        assignments = self._settings.assignor.assign(task.subscriptions, task.partitions_per_topic)
        self._broker.sync_group(self.group_id, self.member_id, task.generation, assignments)

    async def _apply(self, generation: int, assignment: MemberAssignment) -> None:
        self._transition_to(MemberState.ASSIGNING)
        partitions = {TopicPartition(*tp) for tp in assignment.partitions}
        lost = self._assignment.partitions - partitions
        try:
            if lost:
                # Cooperative only (an eager member holds nothing here): revoked while still owned.
                self._log.debug("Member %s revoking %s (generation %s)", self.member_id, sorted(lost), generation)
                await self._require_listener().on_partitions_revoked(lost)
            self.generation = generation
            if self._settings.cooperative:
                self._broker.assignment_applied(self.group_id, self.member_id, generation, partitions)
            self._assignment.reassign(partitions)
            self._broker.register_fetcher(self._wakeup, partitions)
            self._log.debug(
                "Member %s assigned %s (generation %s)", self.member_id, sorted(partitions), generation
            )
            self._settings.assignor.on_assignment(assignment)
            await self._require_listener().on_partitions_assigned(set(partitions))
        finally:
            if self.state is MemberState.ASSIGNING:
                self._transition_to(MemberState.STABLE)
                if lost:
                    self.request_rejoin()

    def _require_listener(self) -> RebalanceListener:
        if self._listener is None:
            raise IllegalStateError(
                f"Consumer {self._settings.client_id} has no rebalance listener; call subscribe() first."
            )
        return self._listener

    def _fenced_error(self) -> TransportError:
        return TransportError(
            f"Member {self.member_id} of group '{self.group_id}' was fenced: another consumer joined "
            f"with group.instance.id '{self._settings.group_instance_id}'. Close this consumer; "
            "two live consumers must not share a group.instance.id."
        )

    def _transition_to(self, new: MemberState) -> None:
        self._state.transition_to(new)
