"""The broker side of a consumer group: members, the join barrier, generations, offsets.

It follows Kafka's group coordinator with the eager rebalance protocol::

              join                   every member has (re)joined           the leader's assignment
    EMPTY ───────────▶ PREPARING_REBALANCE ───────────────────▶ COMPLETING_REBALANCE ─────────────▶ STABLE
                          ▲  ▲                                           │                             │
                          │  └─ join, leave, expiry, metadata change ────┘                             │
                          └──── join, leave, expiry, rejoin request, metadata change ──────────────────┘
    (PREPARING, COMPLETING, STABLE ──the last member is gone──▶ EMPTY; committed offsets stay)

- A rebalance (PREPARING_REBALANCE) marks every member "not joined" and wakes them.
  Each member, on its next poll, revokes its partitions and rejoins with a fresh
  subscription. The barrier holds until every member still in the group has
  rejoined; members that do not rejoin within their ``max_poll_interval_ms`` of the
  rebalance start are removed.
- When the barrier falls the generation is bumped and the longest-standing member
  is the leader (COMPLETING_REBALANCE). The leader runs its assignor on its own
  loop and hands the result back (:meth:`ConsumerGroup.sync`); every member then
  picks its assignment up on its next poll (STABLE).
- A member owns a partition from the sync that gives it to the member until the
  member rejoins (after its ``on_partitions_revoked``) or leaves the group. Commits
  are accepted only for owned partitions. Ownership never overlaps: the next sync
  needs every member to have rejoined, or to be gone.
- A cooperative member (KIP-429) keeps its partitions through the rebalance: it owns
  them while it rejoins, and after the sync until it takes its new assignment on, once
  it has revoked what it lost (:meth:`applied`). So a sync that gives a partition to
  one member while another still owns it is refused.

Liveness is checked lazily, whenever a member calls in, on the broker's monotonic
clock (milliseconds): a member is removed when it has not polled within ``max_poll_interval_ms``
(time inside ``poll`` does not count), when it stopped without leaving and
``session_timeout_ms`` passed, or when it did not rejoin a rebalance in time.

Every method runs under the broker's lock and neither blocks nor awaits.
Caller: :class:`~streamloop.transport.memory.broker.MemoryBroker`.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from streamloop.errors import CommitFailedError, TransportError
from streamloop.lifecycle import StateMachine
from streamloop.logcontext import LogContext
from streamloop.records import TopicPartition
from streamloop.transport.base import MemberAssignment, MemberSubscription, OffsetAndMetadata
from streamloop.transport.memory.wakeup import LoopWakeup

log = logging.getLogger(__name__)


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"

    def __str__(self) -> str:
        return self.value


_GROUP_TRANSITIONS: dict[GroupState, frozenset[GroupState]] = {
    GroupState.EMPTY: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.PREPARING_REBALANCE: frozenset(
        {GroupState.COMPLETING_REBALANCE, GroupState.EMPTY}
    ),
    GroupState.COMPLETING_REBALANCE: frozenset(
        {GroupState.STABLE, GroupState.PREPARING_REBALANCE, GroupState.EMPTY}
    ),
    GroupState.STABLE: frozenset({GroupState.PREPARING_REBALANCE, GroupState.EMPTY}),
}


@dataclass(frozen=True, slots=True)
class JoinRequest:
    """What a consumer sends to (re)join; ``member_id`` is None for a new member."""

    member_id: str | None
    client_id: str
    group_instance_id: str | None
    topics: tuple[str, ...]
    user_data: bytes
    assignor_name: str
    max_poll_interval_ms: int
    session_timeout_ms: int
    wakeup: LoopWakeup
    cooperative: bool = False
    owned: tuple[TopicPartition, ...] = ()
    # A pattern subscription: ``topics`` are what it matched at the join; the group's leader
    # task and its reaction to created and deleted topics follow the pattern itself.
    pattern: re.Pattern[str] | None = None


@dataclass(frozen=True, slots=True)
class LeaderTask:
    """Handed to the leader in COMPLETING_REBALANCE: the input of its assignor."""

    generation: int
    subscriptions: dict[str, MemberSubscription]
    partitions_per_topic: dict[str, int]


@dataclass(frozen=True, slots=True)
class GroupView:
    """One member's view of its group, returned by every heartbeat.

    ``joined`` says whether the member has joined the current rebalance;
    ``assignment`` is set in STABLE; ``leader_task`` is set in COMPLETING_REBALANCE
    for the leader only; ``next_deadline_in_ms`` is how long (on the broker's clock)
    until some member of the group may expire, so waiters look again then.
    """

    state: GroupState
    generation: int
    member_known: bool
    fenced: bool = False
    joined: bool = False
    assignment: MemberAssignment | None = None
    leader_task: LeaderTask | None = None
    next_deadline_in_ms: int | None = None


@dataclass(frozen=True, slots=True)
class GroupDescription:
    """A snapshot for tests and tools: members in seniority order, with owned partitions."""

    group_id: str
    state: GroupState
    generation: int
    leader_id: str | None
    members: dict[str, frozenset[TopicPartition]]


@dataclass(slots=True, eq=False)
class _Member:
    member_id: str
    request: JoinRequest
    subscription: MemberSubscription
    last_poll: int
    joined: bool = True
    in_poll: bool = False
    stopped: bool = False
    assignment: MemberAssignment | None = None
    owned: frozenset[TopicPartition] = field(default_factory=frozenset)


class ConsumerGroup:
    def __init__(
        self,
        group_id: str,
        *,
        wake: Callable[[LoopWakeup], None],
        partition_count: Callable[[str], int | None],
        new_member_id: Callable[[str], str],
        topic_names: Callable[[], list[str]] = list,
    ) -> None:
        self.group_id = group_id
        self._log = LogContext(log, f"group [{group_id}] ")
        self._state = StateMachine(
            f"group {group_id}", GroupState.EMPTY, _GROUP_TRANSITIONS, self._log, logging.DEBUG
        )
        self.generation = 0
        self.offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        self._wake = wake
        self._partition_count = partition_count
        self._topic_names = topic_names
        self._new_member_id = new_member_id
        # Insertion order is seniority: the first member is the longest-standing one.
        self._members: dict[str, _Member] = {}
        self._fenced: set[str] = set()
        self._leader_id: str | None = None
        self._rebalance_started_at = 0

    @property
    def state(self) -> GroupState:
        return self._state.state

    # ------------------------------------------------------------------ protocol

    def join(self, request: JoinRequest, now: int) -> str:
        """(Re)join the current rebalance, starting one if none is under way.

        Returns the member id: the request's for a known member, a new one otherwise.
        A new member whose ``group_instance_id`` is already in the group replaces
        (fences) the old member; in STABLE with unchanged topics it takes over the old
        member's assignment without a rebalance, as a returning static member does.
        """
        self.expire_members(now)
        self._check_assignor(request)
        member = self._members.get(request.member_id) if request.member_id else None
        if member is not None:
            member.request = request
            member.subscription = self._subscription(member.member_id, request)
            if not request.cooperative:
                member.owned = frozenset()
            member.last_poll = now
            self._prepare_rebalance(f"member {member.member_id} rejoined", now)
            member.joined = True
            self._maybe_complete_join(now)
            return member.member_id

        member_id = self._new_member_id(request.client_id)
        member = _Member(
            member_id=member_id,
            request=request,
            subscription=self._subscription(member_id, request),
            last_poll=now,
        )
        replaced = self._static_member(request.group_instance_id)
        if replaced is None:
            self._members[member_id] = member
            self._prepare_rebalance(f"member {member_id} joined", now)
            member.joined = True
            self._maybe_complete_join(now)
            return member_id

        self._replace(replaced, member)
        self._log.info(
            "Static member %s (group.instance.id %s) replaces member %s",
            member_id,
            request.group_instance_id,
            replaced.member_id,
        )
        if self.state is GroupState.STABLE and replaced.request.topics == request.topics:
            member.joined = replaced.joined
            member.assignment = replaced.assignment
            member.owned = replaced.owned
            return member_id
        self._prepare_rebalance(f"static member {member_id} rejoined", now)
        member.joined = True
        self._maybe_complete_join(now)
        return member_id

    def heartbeat(self, member_id: str | None, now: int, *, rejoin: bool) -> GroupView:
        """A member's poll calling in: liveness, its rejoin request, and what to do next."""
        self.expire_members(now)
        member = self._members.get(member_id) if member_id else None
        if member is None:
            return GroupView(
                state=self.state,
                generation=self.generation,
                member_known=False,
                fenced=member_id in self._fenced,
            )
        member.last_poll = now
        member.in_poll = True
        member.stopped = False
        if rejoin:
            # Already in a rebalance: the member rejoins it with a fresh subscription.
            member.joined = False
            self._prepare_rebalance(f"member {member.member_id} requested a rejoin", now)
        leader_task = None
        if self.state is GroupState.COMPLETING_REBALANCE and member.member_id == self._leader_id:
            leader_task = self._leader_task()
        return GroupView(
            state=self.state,
            generation=self.generation,
            member_known=True,
            joined=member.joined,
            assignment=member.assignment if self.state is GroupState.STABLE else None,
            leader_task=leader_task,
            next_deadline_in_ms=self._next_deadline_in_ms(now),
        )

    def poll_done(self, member_id: str | None, now: int) -> None:
        """The member's poll returned: from now on its ``max_poll_interval_ms`` runs."""
        member = self._members.get(member_id) if member_id else None
        if member is not None:
            member.last_poll = now
            member.in_poll = False

    def sync(
        self,
        member_id: str | None,
        generation: int,
        assignments: Mapping[str, MemberAssignment],
        now: int,
    ) -> bool:
        """The leader hands in its assignor's result; False if the group moved on meanwhile.

        Raises ``TransportError`` when the assignment gives a partition to two members
        or names a partition that does not exist; the group then keeps waiting for a
        valid assignment from the leader.
        """
        self.expire_members(now)
        if (
            self.state is not GroupState.COMPLETING_REBALANCE
            or generation != self.generation
            or member_id != self._leader_id
        ):
            return False
        self._check_assignment(assignments)
        for member in self._members.values():
            member.assignment = assignments.get(member.member_id, MemberAssignment(()))
            if not member.request.cooperative:
                member.owned = frozenset(TopicPartition(*tp) for tp in member.assignment.partitions)
        self._transition_to(GroupState.STABLE, f"leader {member_id} assigned generation {generation}")
        self._wake_all()
        return True

    def applied(self, member_id: str | None, generation: int, partitions: Iterable[TopicPartition]) -> None:
        """A cooperative member revoked what it lost and takes its new assignment on: it owns that now.

        The member says what it took on: a rebalance started meanwhile has dropped the group's copy."""
        member = self._members.get(member_id) if member_id else None
        if member is not None and generation == self.generation:
            member.owned = frozenset(partitions)

    def leave(self, member_id: str | None, now: int) -> None:
        """The member leaves at once (``close(leave_group=True)``); the rest rebalance."""
        if member_id in self._members:
            self._remove(member_id, "it left the group", now)

    def stop(self, member_id: str | None, now: int) -> None:
        """The member stopped without leaving; it expires after ``session_timeout_ms``."""
        member = self._members.get(member_id) if member_id else None
        if member is not None:
            member.stopped = True
            member.in_poll = False
            member.last_poll = now

    def commit(
        self,
        member_id: str | None,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        now: int,
    ) -> None:
        """Store offsets, if the member owns every partition in them; else nothing is stored."""
        self.expire_members(now)
        member = self._members.get(member_id) if member_id else None
        refused = sorted(tp for tp in offsets if member is None or tp not in member.owned)
        if refused:
            names = ", ".join(str(tp) for tp in refused)
            who = "it is not a member of the group" if member is None else "it does not own them"
            raise CommitFailedError(
                f"Commit of group '{self.group_id}' by member {member_id} refused for {names}: "
                f"{who} in generation {self.generation}. A rebalance moved the partitions or the "
                "member left the group; poll() to rejoin and process the new assignment."
            )
        self.offsets.update(offsets)

    def expire_members(self, now: int) -> None:
        expired = [
            (member, reason)
            for member in self._members.values()
            if (reason := self._expiry_reason(member, now)) is not None
        ]
        for member, reason in expired:
            self._remove(member.member_id, reason, now)

    def topics_changed(self, topics: Iterable[str], now: int) -> None:
        """Topics were created or deleted: members subscribed to them must rebalance."""
        changed = set(topics)
        if self.state is GroupState.PREPARING_REBALANCE:
            return  # the leader reads the partition counts when the barrier falls
        if any(changed & set(m.subscription.topics) or _matches_any(m.request.pattern, changed)
               for m in self._members.values()):
            self._prepare_rebalance(f"subscribed topics {sorted(changed)} changed", now)

    def describe(self) -> GroupDescription:
        return GroupDescription(
            group_id=self.group_id,
            state=self.state,
            generation=self.generation,
            leader_id=self._leader_id,
            members={mid: m.owned for mid, m in self._members.items()},
        )

    # ----------------------------------------------------------------- internals

    def _prepare_rebalance(self, reason: str, now: int) -> None:
        if self.state is GroupState.PREPARING_REBALANCE:
            return
        self._transition_to(GroupState.PREPARING_REBALANCE, reason)
        self._rebalance_started_at = now
        self._leader_id = None
        for member in self._members.values():
            member.joined = False
            member.assignment = None
        self._wake_all()

    def _maybe_complete_join(self, now: int) -> None:
        if self.state is not GroupState.PREPARING_REBALANCE or not self._members:
            return
        if not all(m.joined for m in self._members.values()):
            return
        self.generation += 1
        self._leader_id = next(iter(self._members))
        self._transition_to(
            GroupState.COMPLETING_REBALANCE,
            f"all {len(self._members)} members joined generation {self.generation}, "
            f"leader {self._leader_id}",
        )
        self._wake(self._members[self._leader_id].request.wakeup)

    def _remove(self, member_id: str, reason: str, now: int) -> None:
        member = self._members.pop(member_id)
        self._log.debug("Member %s removed: %s", member_id, reason)
        self._wake(member.request.wakeup)
        if not self._members:
            self._leader_id = None
            self._transition_to(GroupState.EMPTY, f"member {member_id} removed: {reason}")
        elif self.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(now)
        else:
            self._prepare_rebalance(f"member {member_id} removed: {reason}", now)

    def _replace(self, old: _Member, new: _Member) -> None:
        self._members = {
            (new.member_id if mid == old.member_id else mid): (new if m is old else m)
            for mid, m in self._members.items()
        }
        if self._leader_id == old.member_id:
            self._leader_id = new.member_id
        self._fenced.add(old.member_id)
        self._wake(old.request.wakeup)

    def _expiry_reason(self, member: _Member, now: int) -> str | None:
        idle = now - member.last_poll
        request = member.request
        if member.stopped and idle > request.session_timeout_ms:
            return f"no heartbeat within session.timeout.ms ({request.session_timeout_ms} ms) after it stopped"
        if not member.in_poll and idle > request.max_poll_interval_ms:
            return f"it did not poll within max.poll.interval.ms ({request.max_poll_interval_ms} ms)"
        if (
            self.state is GroupState.PREPARING_REBALANCE
            and not member.joined
            and now - self._rebalance_started_at > request.max_poll_interval_ms
        ):
            return (
                "it did not rejoin the rebalance within max.poll.interval.ms "
                f"({request.max_poll_interval_ms} ms)"
            )
        return None

    def _next_deadline_in_ms(self, now: int) -> int | None:
        deadlines: list[int] = []
        for member in self._members.values():
            request = member.request
            if member.stopped:
                deadlines.append(member.last_poll + request.session_timeout_ms)
            if not member.in_poll:
                deadlines.append(member.last_poll + request.max_poll_interval_ms)
            if self.state is GroupState.PREPARING_REBALANCE and not member.joined:
                deadlines.append(self._rebalance_started_at + request.max_poll_interval_ms)
        if not deadlines:
            return None
        # A member expires once its deadline is passed, one tick after it is due.
        return max(min(deadlines) + 1 - now, 0)

    def _leader_task(self) -> LeaderTask:
        # A pattern member's topics as of now: a topic created since it joined is in this generation.
        subscriptions = {mid: self._current_subscription(m) for mid, m in self._members.items()}
        topics = sorted({t for s in subscriptions.values() for t in s.topics})
        counts = {t: n for t in topics if (n := self._partition_count(t)) is not None}
        return LeaderTask(
            generation=self.generation,
            subscriptions=subscriptions,
            partitions_per_topic=counts,
        )

    def _current_subscription(self, member: _Member) -> MemberSubscription:
        pattern = member.request.pattern
        if pattern is None:
            return member.subscription
        topics = tuple(sorted(t for t in self._topic_names() if pattern.match(t)))
        return dataclasses.replace(member.subscription, topics=topics)

    def _check_assignment(self, assignments: Mapping[str, MemberAssignment]) -> None:
        owner: dict[TopicPartition, str] = {}
        for member_id, assignment in assignments.items():
            for tp in assignment.partitions:
                tp = TopicPartition(*tp)
                count = self._partition_count(tp.topic)
                if count is None or not 0 <= tp.partition < count:
                    raise TransportError(
                        f"Group '{self.group_id}': the assignor gave {tp} to {member_id}, "
                        "but that partition does not exist."
                    )
                if tp in owner and owner[tp] != member_id:
                    raise TransportError(
                        f"Group '{self.group_id}': the assignor gave {tp} to both "
                        f"{owner[tp]} and {member_id}; a partition has one owner per generation."
                    )
                owner[tp] = member_id
        for member in self._members.values():
            for tp in member.owned:
                if tp in owner and owner[tp] != member.member_id:
                    raise TransportError(
                        f"Group '{self.group_id}': the assignor gave {tp} to {owner[tp]} while member "
                        f"{member.member_id} still owns it; a cooperative assignor hands a partition over "
                        "in a second rebalance, after its owner revoked it."
                    )

    def _check_assignor(self, request: JoinRequest) -> None:
        for member in self._members.values():
            if member.member_id == request.member_id:
                continue
            if member.request.assignor_name != request.assignor_name:
                raise TransportError(
                    f"Group '{self.group_id}': member {request.client_id} uses assignor "
                    f"'{request.assignor_name}' but member {member.member_id} uses "
                    f"'{member.request.assignor_name}'. Every member of a group needs the same assignor."
                )

    def _static_member(self, group_instance_id: str | None) -> _Member | None:
        if group_instance_id is None:
            return None
        for member in self._members.values():
            if member.request.group_instance_id == group_instance_id:
                return member
        return None

    @staticmethod
    def _subscription(member_id: str, request: JoinRequest) -> MemberSubscription:
        return MemberSubscription(member_id, request.topics, request.user_data, request.owned)

    def _wake_all(self) -> None:
        for member in self._members.values():
            self._wake(member.request.wakeup)

    def _transition_to(self, new: GroupState, reason: str) -> None:
        self._log.debug("%s (generation %d)", reason, self.generation)
        self._state.transition_to(new)


def _matches_any(pattern: re.Pattern[str] | None, topics: Iterable[str]) -> bool:
    return pattern is not None and any(pattern.match(t) for t in topics)
