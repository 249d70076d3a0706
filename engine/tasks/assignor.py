"""The group assignor: partitions grouped into tasks, tasks spread over the members.

Every member is one stream thread. A task is (sub-topology, partition) and owns
that partition of each of the sub-topology's source topics, so co-partitioned
topics stay together. The leader keeps each task with its previous owner while
that owner is under its fair share (sticky: adding a thread moves only the
tasks it takes over), then gives the rest to the least loaded members. The
loads differ by at most one.

Each member's metadata also carries its instance's ``application.server`` endpoint; the leader
answers every member with the partitions each endpoint's tasks own (Kafka Streams'
``partitionsByHost``), which the member hands to its client's ``StreamsMetadataState`` for
queries across instances.

With ``num.standby.replicas`` the leader also gives each stateful task standbys on other
instances (``streamloop.tasks.standby_placement``) and tells every member the standby partitions
by host (``KeyQueryMetadata.standby_hosts``).

Under the cooperative protocol (KIP-429) a task moves in two rebalances: the first gives it to
no one while another member still owns it (``withhold_owned``), so its owner closes it; that owner
then rejoins at once, and the second gives the task to its new member. Tasks that stay keep running.

The member metadata also carries a shutdown request (KIP-671
SHUTDOWN_APPLICATION): if any member asks, the leader answers every member with
no tasks and the error code, and every instance shuts down.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any

import orjson

from streamloop.ids import TaskId
from streamloop.records import TopicPartition
from streamloop.state.metadata import HostInfo, HostPartitions, StreamsMetadataState
from streamloop.tasks.membership import Membership
from streamloop.tasks.standby_placement import assign_standbys
from streamloop.topology.patterns import check_task_limits
from streamloop.topology.patterns import pattern_topics as matched_topics
from streamloop.topology.topology import Topology
from streamloop.transport.base import MemberAssignment, MemberSubscription

log = logging.getLogger(__name__)

# 2: the endpoint in the subscription and the partitions by host in the assignment (optional
# fields: a member of version 1 reads the tasks and ignores them).
_VERSION = 2


class AssignorError(IntEnum):
    NONE = 0
    INCOMPLETE_SOURCE_TOPIC_METADATA = 1
    SHUTDOWN_REQUESTED = 4


class ShutdownRequest(Enum):
    """KIP-671's application shutdown as one member sees it: the one place that says whether this
    thread asks for it, carries it on its way out, or was answered with it."""

    NONE = "none"
    ASKED = "asked"
    """This member's subscription carries the request (a live thread rejoins with it)."""
    CARRIED_ON_EXIT = "carried on exit"
    """A failing thread, still a member, rejoins with the request before it leaves; its tasks close
    without a commit if the rebalance revokes them."""
    ANSWERED = "answered"
    """The group's assignment says the application shuts down: every instance's threads stop."""


@dataclass
class SubscriptionInfo:
    process_id: str
    thread: str
    previous_tasks: list[TaskId] = field(default_factory=list)
    error_code: AssignorError = AssignorError.NONE
    endpoint: str = ""
    """The instance's ``application.server``; empty when unset."""
    standby_tasks: list[TaskId] = field(default_factory=list)
    """The standby tasks the member held (their state is on its disk): standbys stick to them."""
    member: str = ""
    """The thread's membership token (``streamloop.tasks.membership``); empty from a member without one."""
    joins: int = 0
    """The join of that thread this subscription belongs to."""

    def encode(self) -> bytes:
        return orjson.dumps({
            "v": _VERSION, "process": self.process_id, "thread": self.thread,
            "prev": [str(t) for t in self.previous_tasks], "err": int(self.error_code), "ep": self.endpoint,
            "sb": [str(t) for t in self.standby_tasks], "mt": self.member, "mj": self.joins,
        })

    @classmethod
    def decode(cls, data: bytes) -> SubscriptionInfo:
        if not data:
            return cls("", "")
        raw = orjson.loads(data)
        return cls(raw.get("process", ""), raw.get("thread", ""),
                   [TaskId.parse(t) for t in raw.get("prev", [])], AssignorError(raw.get("err", 0)),
                   raw.get("ep", ""), [TaskId.parse(t) for t in raw.get("sb", [])],
                   raw.get("mt", ""), int(raw.get("mj", 0)))


@dataclass
class AssignmentInfo:
    tasks: list[TaskId]
    error_code: AssignorError = AssignorError.NONE
    partitions_by_host: dict[HostInfo, set[TopicPartition]] = field(default_factory=dict)
    standby_partitions_by_host: dict[HostInfo, set[TopicPartition]] = field(default_factory=dict)
    standby_tasks: list[TaskId] = field(default_factory=list)
    """The member's standby tasks (``streamloop.tasks.standby``)."""
    follow_up: bool = False
    """Cooperative: tasks were withheld this round, so another rebalance follows at once; the
    group has not settled (the threads stay PARTITIONS_ASSIGNED, the client REBALANCING)."""
    roster: dict[str, int] = field(default_factory=dict)
    """The threads of the member's own instance in this generation: membership token -> join."""
    pattern_topics: list[str] | None = None
    """The topics the topology's pattern sources matched on the leader (None: it has none), so that
    every member's topology reads them as the leader's tasks do (streamloop.topology.patterns)."""

    def encode(self) -> bytes:
        raw: dict[str, Any] = {"v": _VERSION, "tasks": [str(t) for t in self.tasks], "err": int(self.error_code),
                               "hosts": _encode_hosts(self.partitions_by_host),
                               "standby_hosts": _encode_hosts(self.standby_partitions_by_host),
                               "standby": [str(t) for t in self.standby_tasks], "fu": self.follow_up,
                               "roster": self.roster}
        if self.pattern_topics is not None:
            raw["pt"] = self.pattern_topics
        return orjson.dumps(raw)

    @classmethod
    def decode(cls, data: bytes) -> AssignmentInfo:
        if not data:
            return cls([])
        raw = orjson.loads(data)
        return cls([TaskId.parse(t) for t in raw.get("tasks", [])], AssignorError(raw.get("err", 0)),
                   _decode_hosts(raw.get("hosts", [])), _decode_hosts(raw.get("standby_hosts", [])),
                   [TaskId.parse(t) for t in raw.get("standby", [])], bool(raw.get("fu", False)),
                   {str(k): int(v) for k, v in raw.get("roster", {}).items()},
                   None if raw.get("pt") is None else [str(t) for t in raw["pt"]])


def _encode_hosts(by_host: HostPartitions) -> list[Any]:
    """``[[host, port, {topic: [partition, ...]}], ...]``: each topic name once per host, not per partition."""
    encoded = []
    for host in sorted(by_host):
        topics: dict[str, list[int]] = {}
        for tp in sorted(by_host[host]):
            topics.setdefault(tp.topic, []).append(tp.partition)
        encoded.append([host.host, host.port, topics])
    return encoded


def _decode_hosts(raw: list[Any]) -> dict[HostInfo, set[TopicPartition]]:
    return {HostInfo(host, port): {TopicPartition(t, p) for t, parts in topics.items() for p in parts}
            for host, port, topics in raw}


def partitions_by_host(
    spread: Mapping[str, Sequence[TaskId]], infos: Mapping[str, SubscriptionInfo],
    partitions_of: Mapping[TaskId, Sequence[TopicPartition]],
) -> dict[HostInfo, set[TopicPartition]]:
    """The partitions of the tasks each endpoint's members got; members without an endpoint are left out.

    The threads of one instance are members each, with the same endpoint: their partitions add up.
    """
    result: dict[HostInfo, set[TopicPartition]] = {}
    processes: dict[HostInfo, set[str]] = {}
    for member, member_tasks in spread.items():
        host = HostInfo.build_from_endpoint(infos[member].endpoint)
        if host is not None:
            result.setdefault(host, set()).update(tp for t in member_tasks for tp in partitions_of[t])
            processes.setdefault(host, set()).add(infos[member].process_id)
    for host, ids in processes.items():
        if len(ids) > 1:
            log.warning("%d instances set application.server to %s: queries for their keys cannot tell them "
                        "apart; give each instance its own", len(ids), host)
    return result


def tasks_for(topology: Topology, partitions_per_topic: Mapping[str, int]) -> dict[TaskId, list[TopicPartition]]:
    """Every task of the topology and the partitions it owns, for the topics that exist."""
    tasks: dict[TaskId, list[TopicPartition]] = {}
    for sub in topology.subtopologies:
        counts = [partitions_per_topic[t] for t in sub.source_topics if t in partitions_per_topic]
        for partition in range(max(counts, default=0)):
            tps = [TopicPartition(t, partition) for t in sub.source_topics
                   if partition < partitions_per_topic.get(t, 0)]
            tasks[TaskId(sub.id, partition)] = tps
    return tasks


def balance(
    tasks: Sequence[TaskId], members: Sequence[str], previous: Mapping[str, Sequence[TaskId]]
) -> dict[str, list[TaskId]]:
    """Sticky, balanced spread of ``tasks`` over ``members`` (loads differ by at most one).

    Each member holds ``floor`` or ``floor + 1`` tasks, and only ``len(tasks) % len(members)``
    members hold the larger number. Previous owners keep their tasks as far as
    that allows; only the rest move.
    """
    result: dict[str, list[TaskId]] = {m: [] for m in members}
    if not members:
        return result
    floor, extra = divmod(len(tasks), len(members))
    wanted = set(tasks)
    taken: set[TaskId] = set()

    def keep(member: str, limit: int) -> None:
        # Partition by partition across the sub-topologies: a member trimmed to its share keeps
        # some tasks of each (a stateful sub-topology's stores do not all stay on one member).
        for task in sorted(previous.get(member, ()), key=lambda t: (t.partition, t.subtopology)):
            if len(result[member]) >= limit:
                return
            if task in wanted and task not in taken:
                result[member].append(task)
                taken.add(task)

    for member in members:
        keep(member, floor)
    for member in members:
        if extra == 0:
            break
        before = len(result[member])
        keep(member, floor + 1)
        extra -= len(result[member]) - before
    for task in tasks:
        if task in taken:
            continue
        least = min(len(v) for v in result.values())
        owner = next((m for m in members if len(result[m]) == least and task in previous.get(m, ())), None)
        if owner is None:
            owner = next(m for m in members if len(result[m]) == least)
        result[owner].append(task)
        taken.add(task)
    for assigned in result.values():
        assigned.sort()
    return result


def withhold_owned(
    spread: Mapping[str, Sequence[TaskId]], holding: Mapping[str, Sequence[TaskId]]
) -> tuple[dict[str, list[TaskId]], dict[TaskId, str]]:
    """Cooperative: take out of ``spread`` every task another member still holds.

    Returns the spread to hand out and, for each withheld task, the member that still owns it
    (where queries for its keys go until the follow-up rebalance). A task two members claim (a
    member that came back after being removed) goes to neither this round, unless it was given to
    one of them: the other closes its copy.
    """
    owners: dict[TaskId, list[str]] = {}
    for member, tasks in holding.items():
        for task in tasks:
            owners.setdefault(task, []).append(member)
    kept: dict[str, list[TaskId]] = {}
    withheld: dict[TaskId, str] = {}
    for member, tasks in spread.items():
        kept[member] = []
        for task in tasks:
            claimants = owners.get(task, ())
            if not claimants or member in claimants:
                kept[member].append(task)
            else:
                withheld[task] = claimants[0]
    return kept, withheld


def _rosters(infos: Mapping[str, SubscriptionInfo]) -> dict[str, dict[str, int]]:
    """Each instance's threads in this generation, with the join that brought each one here."""
    rosters: dict[str, dict[str, int]] = {}
    for info in infos.values():
        if info.member:
            rosters.setdefault(info.process_id, {})[info.member] = info.joins
    return rosters


class StreamsAssignor:
    """One per stream thread (member). Implements ``streamloop.transport.base.GroupAssignor``.

    Affects: ``assigned_tasks`` and ``shutdown`` after each assignment, read by
    the stream thread's rebalance listener.
    """

    name = "streamloop"

    def __init__(self, topology: Topology, process_id: str, thread_name: str, endpoint: str = "",
                 metadata: StreamsMetadataState | None = None, standby_replicas: int = 0,
                 replicated: Callable[[int], bool] = lambda _subtopology: False, cooperative: bool = False,
                 membership: Membership | None = None) -> None:
        self._topology = topology
        self._process_id = process_id
        self._thread_name = thread_name
        self._membership = membership
        self._endpoint = endpoint
        self._host = HostInfo.build_from_endpoint(endpoint)
        self._metadata = metadata
        self._standby_replicas = standby_replicas
        # Whether a sub-topology's tasks get standbys (they have a persistent logged store).
        self._replicated = replicated
        self._cooperative = cooperative
        self.owned_standby_tasks: list[TaskId] = []
        self.standby_tasks: list[TaskId] = []
        self.rejoin_for_endpoint = False
        """Set when an assignment lacks this instance's endpoint; the stream thread then rejoins."""
        self.owned_tasks: list[TaskId] = []
        self.shutdown = ShutdownRequest.NONE
        self.assigned_tasks: list[TaskId] = []
        self.follow_up = False
        self.roster: dict[str, int] = {}
        """The threads of this instance in the generation of the last assignment (``streamloop.tasks.membership``)."""

    def subscription_user_data(self, topics: Sequence[str]) -> bytes:
        membership = self._membership
        # A member answered with the shutdown keeps asking for it: the application is shutting down.
        error = AssignorError.NONE if self.shutdown is ShutdownRequest.NONE else AssignorError.SHUTDOWN_REQUESTED
        return SubscriptionInfo(self._process_id, self._thread_name, list(self.owned_tasks),
                                error, self._endpoint, list(self.owned_standby_tasks),
                                membership.token if membership else "", membership.joining if membership else 0,
                                ).encode()

    def assign(
        self,
        subscriptions: Mapping[str, MemberSubscription],
        partitions_per_topic: Mapping[str, int],
    ) -> dict[str, MemberAssignment]:
        infos = {m: SubscriptionInfo.decode(s.user_data) for m, s in subscriptions.items()}
        members = sorted(subscriptions)
        if any(i.error_code is AssignorError.SHUTDOWN_REQUESTED for i in infos.values()):
            log.info("A member requested the shutdown of the application; telling every member")
            error = AssignmentInfo([], AssignorError.SHUTDOWN_REQUESTED).encode()
            return {m: MemberAssignment((), error) for m in members}
        topology = self._topology
        pattern_topics = None
        if topology.has_patterns:
            # The subscribed topics are those the members' pattern subscription matched.
            topology.resolve_patterns(partitions_per_topic)
            check_task_limits(topology, partitions_per_topic)
            pattern_topics = matched_topics(topology)
        tasks = tasks_for(topology, partitions_per_topic)
        previous = {m: infos[m].previous_tasks for m in members}
        target = balance(sorted(tasks), members, previous)
        spread, withheld = target, dict[TaskId, str]()
        if self._cooperative:
            # What each member's consumer holds right now, not what its tasks were: a thread that
            # failed, or closed its tasks, may still hold their partitions until it revokes them.
            task_of = {tp: task for task, tps in tasks.items() for tp in tps}
            holding = {m: sorted({task_of[tp] for tp in subscriptions[m].owned if tp in task_of})
                       for m in members}
            spread, withheld = withhold_owned(target, holding)
        # Queries for a withheld task's keys still go to the member that runs it until it moves.
        owners: dict[str, list[TaskId]] = {}
        for task, owner in withheld.items():
            owners.setdefault(owner, []).append(task)
        by_host = partitions_by_host({m: [*spread[m], *owners.get(m, ())] for m in members}, infos, tasks)
        if withheld:
            log.debug("Cooperative rebalance: %d task(s) move in a follow-up rebalance, once their owners "
                     "have closed them: %s", len(withheld), sorted(str(t) for t in withheld))
        # Standbys follow the target spread, so they stay put when the withheld tasks move.
        standbys = assign_standbys(
            target, {m: infos[m].process_id or m for m in members},
            [t for t in sorted(tasks) if self._replicated(t.subtopology)], self._standby_replicas,
            {m: [*infos[m].previous_tasks, *infos[m].standby_tasks] for m in members})
        standby_by_host = partitions_by_host(standbys, infos, tasks)
        rosters = _rosters(infos)
        result = {}
        for member, member_tasks in spread.items():
            tps = tuple(tp for t in member_tasks for tp in tasks[t])
            info = AssignmentInfo(member_tasks, partitions_by_host=by_host, standby_partitions_by_host=standby_by_host,
                                  standby_tasks=standbys[member], follow_up=bool(withheld),
                                  roster=rosters.get(infos[member].process_id, {}), pattern_topics=pattern_topics)
            result[member] = MemberAssignment(tps, info.encode())
        log.debug("Assignment: %s", {m: [str(t) for t in ts] for m, ts in spread.items()})
        if any(standbys.values()):
            log.debug("Standby tasks: %s", {m: [str(t) for t in ts] for m, ts in standbys.items()})
        return result

    def on_assignment(self, assignment: MemberAssignment) -> None:
        info = AssignmentInfo.decode(assignment.user_data)
        if info.pattern_topics is not None and self._topology.has_patterns:
            # Before the listener creates tasks: they read the topics the leader's tasks were made of.
            self._topology.resolve_patterns(info.pattern_topics)
        self.assigned_tasks = info.tasks
        self.roster = info.roster
        self.follow_up = info.follow_up
        self.standby_tasks = info.standby_tasks
        if info.error_code is AssignorError.SHUTDOWN_REQUESTED:
            self.shutdown = ShutdownRequest.ANSWERED
        if self._metadata is not None:
            self._metadata.on_change(info.partitions_by_host, info.standby_partitions_by_host)
        # As Kafka Streams' verifyHostInfo: a static member back with another application.server gets
        # its old assignment without a rebalance, so no instance knows the new endpoint until it rejoins.
        by_host = info.partitions_by_host
        self.rejoin_for_endpoint = self._host is not None and bool(by_host) and self._host not in by_host
