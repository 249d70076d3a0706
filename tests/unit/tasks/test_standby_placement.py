"""Where the leader puts standby tasks (``num.standby.replicas``).

As Kafka Streams' ``HighAvailabilityTaskAssignor`` / ``DefaultStandbyTaskAssignor`` (checked in
``HighAvailabilityTaskAssignorTest.shouldNotAssignStandbyTasksToClientsThatHaveTheActiveTask``-like
invariants): never on the active's instance, each standby of a task on its own instance, none when
there is only one instance, spread evenly, and a member that had the task keeps it.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streamloop.ids import TaskId
from streamloop.serdes import StringSerde
from streamloop.state import Materialized
from streamloop.state.metadata import HostInfo, StreamsMetadataState
from streamloop.tasks.assignor import AssignmentInfo, StreamsAssignor, SubscriptionInfo, balance
from streamloop.tasks.standby import replicated
from streamloop.tasks.standby_placement import assign_standbys
from streamloop.topology.builder import StreamsBuilder
from streamloop.topology.topology import Topology
from streamloop.transport.base import MemberAssignment, MemberSubscription

TASKS = [TaskId(0, p) for p in range(6)]


@given(st.lists(st.integers(0, 4), min_size=1, max_size=8), st.integers(0, 3), st.integers(0, 12))
def test_standbys_never_share_an_instance_with_their_active_or_each_other(
        process_of_member: list[int], replicas: int, task_count: int) -> None:
    members = [f"m{i}" for i in range(len(process_of_member))]
    process_of = {m: f"p{p}" for m, p in zip(members, process_of_member, strict=True)}
    tasks = [TaskId(0, p) for p in range(task_count)]
    active = balance(tasks, members, {})
    standbys = assign_standbys(active, process_of, tasks, replicas)
    instances = len(set(process_of.values()))
    owner = {t: m for m, ts in active.items() for t in ts}
    for task in tasks:
        holders = [m for m, ts in standbys.items() if task in ts]
        processes = [process_of[m] for m in holders]
        assert process_of[owner[task]] not in processes
        assert len(set(processes)) == len(processes)
        # As many as asked, as far as the other instances allow.
        assert len(holders) == min(replicas, instances - 1)


def test_one_instance_gets_no_standbys_whatever_its_threads() -> None:
    active = balance(TASKS, ["a-1", "a-2", "a-3"], {})
    standbys = assign_standbys(active, {"a-1": "a", "a-2": "a", "a-3": "a"}, TASKS, 2)
    assert standbys == {"a-1": [], "a-2": [], "a-3": []}


def test_standbys_are_spread_evenly() -> None:
    members = ["a", "b", "c"]
    active = balance(TASKS, members, {})
    standbys = assign_standbys(active, {m: m for m in members}, TASKS, 1)
    # Each member: two actives and two standbys.
    assert sorted(len(ts) for ts in standbys.values()) == [2, 2, 2]


def test_a_member_that_had_the_task_keeps_its_standby() -> None:
    members = ["a", "b", "c"]
    active = {"a": [TaskId(0, 0)], "b": [], "c": []}
    # "b" would win on name; "c" held the task (its state is on c's disk).
    standbys = assign_standbys(active, {m: m for m in members}, [TaskId(0, 0)], 1, {"c": [TaskId(0, 0)]})
    assert standbys == {"a": [], "b": [], "c": [TaskId(0, 0)]}


def test_only_the_tasks_asked_for_get_standbys() -> None:
    active = {"a": [TaskId(0, 0), TaskId(1, 0)], "b": []}
    standbys = assign_standbys(active, {"a": "a", "b": "b"}, [TaskId(1, 0)], 1)
    assert standbys == {"a": [], "b": [TaskId(1, 0)]}


def stateful(persistent: bool | None) -> Topology:
    builder = StreamsBuilder()
    builder.stream("in").group_by_key().count(materialized=Materialized("counts", persistent=persistent)) \
        .to_stream().to("out")
    builder.stream("other").to("out")
    return builder.build()


def test_tasks_with_a_persistent_logged_store_are_replicated() -> None:
    topo = stateful(True)
    check = replicated(topo, default_persistent=False)
    assert [check(sub.id) for sub in topo.subtopologies] == [True, False]
    assert not any(replicated(stateful(False), default_persistent=True)(sub.id) for sub in topo.subtopologies)


def test_the_assignor_hands_out_standbys_and_their_hosts() -> None:
    topo = stateful(True)
    members = {"a-1": ("pa", "a:1"), "b-1": ("pb", "b:2")}
    sources = {"counts": topo.subtopology_of_store("counts").source_topics}
    metadata = {m: StreamsMetadataState(HostInfo.build_from_endpoint(e), sources) for m, (_, e) in members.items()}
    assignors = {m: StreamsAssignor(topo, process, m, endpoint, metadata[m], 1, replicated(topo, False))
                 for m, (process, endpoint) in members.items()}
    subscriptions = {m: MemberSubscription(m, ("in", "other"), a.subscription_user_data(["in", "other"]))
                     for m, a in assignors.items()}
    answers = assignors["a-1"].assign(subscriptions, {"in": 2, "other": 2})
    for member, answer in answers.items():
        assignors[member].on_assignment(MemberAssignment(answer.partitions, answer.user_data))
    active = {m: set(a.assigned_tasks) for m, a in assignors.items()}
    standby = {m: set(a.standby_tasks) for m, a in assignors.items()}
    # Each stateful task (sub-topology 0) has its standby on the other instance; stateless ones none.
    assert standby["a-1"] | standby["b-1"] == {TaskId(0, 0), TaskId(0, 1)}
    assert not standby["a-1"] & active["a-1"] and not standby["b-1"] & active["b-1"]
    meta = metadata["a-1"].key_query_metadata_for_key("counts", "k", StringSerde())
    assert meta is not None
    assert meta.standby_hosts and meta.active_host not in meta.standby_hosts
    assert meta.standby_hosts <= {HostInfo("a", 1), HostInfo("b", 2)}


def test_subscription_and_assignment_carry_the_standby_tasks() -> None:
    sub = SubscriptionInfo("p", "t", [TaskId(0, 1)], standby_tasks=[TaskId(0, 2)])
    assert SubscriptionInfo.decode(sub.encode()) == sub
    info = AssignmentInfo([TaskId(0, 0)], standby_tasks=[TaskId(0, 3)])
    assert AssignmentInfo.decode(info.encode()) == info
