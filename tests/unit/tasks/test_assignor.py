"""The group assignor: partitions grouped into tasks, tasks spread evenly and stickily, shutdown requests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from hypothesis import example, given
from hypothesis import strategies as st

from streamloop.ids import TaskId
from streamloop.records import TopicPartition
from streamloop.tasks.assignor import (
    AssignmentInfo,
    AssignorError,
    ShutdownRequest,
    StreamsAssignor,
    SubscriptionInfo,
    balance,
    tasks_for,
    withhold_owned,
)
from streamloop.topology.builder import StreamsBuilder
from streamloop.topology.topology import Topology
from streamloop.transport.base import MemberAssignment, MemberSubscription


def t(partition: int, subtopology: int = 0) -> TaskId:
    return TaskId(subtopology, partition)


def single_topic() -> Topology:
    builder = StreamsBuilder()
    builder.stream("in").to("out")
    return builder.build()


def two_subtopologies() -> Topology:
    builder = StreamsBuilder()
    builder.stream(["a", "b"]).to("x")
    builder.stream("c").to("y")
    return builder.build()


# -- tasks_for ----------------------------------------------------------------------


def test_one_task_per_partition_of_the_source_topic() -> None:
    assert tasks_for(single_topic(), {"in": 3, "out": 7}) == {
        t(0): [TopicPartition("in", 0)],
        t(1): [TopicPartition("in", 1)],
        t(2): [TopicPartition("in", 2)],
    }


def test_copartitioned_topics_share_one_task_per_partition() -> None:
    tasks = tasks_for(two_subtopologies(), {"a": 2, "b": 2, "c": 1})

    assert tasks[t(0)] == [TopicPartition("a", 0), TopicPartition("b", 0)]
    assert tasks[t(1)] == [TopicPartition("a", 1), TopicPartition("b", 1)]


def test_merged_streams_are_copartitioned_too() -> None:
    builder = StreamsBuilder()
    builder.stream("a").merge(builder.stream("b")).to("out")

    assert tasks_for(builder.build(), {"a": 1, "b": 1}) == {t(0): [TopicPartition("a", 0), TopicPartition("b", 0)]}


def test_each_subtopology_has_its_own_tasks() -> None:
    tasks = tasks_for(two_subtopologies(), {"a": 2, "b": 2, "c": 3})

    assert sorted(tasks) == [t(0), t(1), t(0, 1), t(1, 1), t(2, 1)]
    assert tasks[t(2, 1)] == [TopicPartition("c", 2)]


def test_subtopology_whose_topics_are_all_missing_has_no_tasks() -> None:
    tasks = tasks_for(two_subtopologies(), {"c": 2})

    assert sorted(tasks) == [t(0, 1), t(1, 1)]


def test_missing_copartitioned_topic_leaves_tasks_with_the_existing_one() -> None:
    tasks = tasks_for(two_subtopologies(), {"a": 2, "c": 1})

    assert tasks[t(0)] == [TopicPartition("a", 0)]
    assert tasks[t(1)] == [TopicPartition("a", 1)]


def test_no_topics_means_no_tasks() -> None:
    assert tasks_for(single_topic(), {}) == {}


# -- balance ----------------------------------------------------------------------------


@st.composite
def balanced_groups(draw: st.DrawFn) -> tuple[list[TaskId], list[str], dict[str, list[TaskId]]]:
    """Tasks, members (sorted, named m1, m3, …) and a balanced, arbitrary previous assignment."""
    count = draw(st.integers(min_value=1, max_value=5))
    members = [f"m{2 * i + 1}" for i in range(count)]
    tasks = [TaskId(i % 3, i // 3) for i in range(draw(st.integers(min_value=0, max_value=24)))]
    shuffled = draw(st.permutations(tasks))
    bigger = draw(st.permutations(members))
    floor, extra = divmod(len(tasks), count)
    previous: dict[str, list[TaskId]] = {}
    start = 0
    for position, member in enumerate(bigger):
        size = floor + (1 if position < extra else 0)
        previous[member] = sorted(shuffled[start:start + size])
        start += size
    return sorted(tasks), members, previous


def loads(assignment: Mapping[str, Sequence[TaskId]]) -> list[int]:
    return [len(tasks) for tasks in assignment.values()]


def owners(assignment: Mapping[str, Sequence[TaskId]]) -> dict[TaskId, str]:
    return {task: member for member, tasks in assignment.items() for task in tasks}


def moved(before: Mapping[str, Sequence[TaskId]], after: Mapping[str, Sequence[TaskId]]) -> dict[TaskId, str]:
    """The tasks whose owner changed, with their new owner."""
    old = owners(before)
    return {task: member for task, member in owners(after).items() if task in old and old[task] != member}


@given(
    tasks=st.lists(st.builds(TaskId, st.integers(0, 2), st.integers(0, 9)), unique=True),
    members=st.lists(st.sampled_from("abcdef"), min_size=1, unique=True),
)
def test_every_task_goes_to_exactly_one_member(tasks: list[TaskId], members: list[str]) -> None:
    result = balance(tasks, members, {})

    assert sorted(t for assigned in result.values() for t in assigned) == sorted(tasks)
    assert set(result) == set(members)


@given(group=balanced_groups(), data=st.data())
def test_loads_differ_by_at_most_one_whatever_the_previous_assignment(group, data: st.DataObject) -> None:  # type: ignore[no-untyped-def]
    tasks, members, _ = group
    # Any previous assignment, balanced or not, even with stale and doubly owned tasks.
    owned = st.lists(st.sampled_from(tasks) if tasks else st.nothing())
    previous = data.draw(st.dictionaries(st.sampled_from(members), owned))

    result = balance(tasks, members, previous)

    assert max(loads(result)) - min(loads(result)) <= 1
    assert Counter(t for assigned in result.values() for t in assigned) == Counter(tasks)


@given(group=balanced_groups())
def test_balanced_previous_assignment_is_kept_as_it_is(group) -> None:  # type: ignore[no-untyped-def]
    tasks, members, previous = group

    assert balance(tasks, members, previous) == previous


@example(group=([t(p) for p in range(11)], ["m1", "m3"],
                {"m1": [t(p) for p in (0, 1, 2, 8, 9, 10)], "m3": [t(p) for p in (3, 4, 5, 6, 7)]}),
         new_position=2)
@given(group=balanced_groups(), new_position=st.integers(min_value=0, max_value=5))
def test_added_member_takes_only_its_share_from_the_others(group, new_position: int) -> None:  # type: ignore[no-untyped-def]
    tasks, members, previous = group
    new_member = f"m{2 * min(new_position, len(members))}"
    grown = sorted([*members, new_member])

    result = balance(tasks, grown, previous)

    assert set(moved(previous, result).values()) <= {new_member}
    assert len(result[new_member]) == len(tasks) // len(grown)


@example(group=([t(p) for p in range(5)], ["m1", "m3", "m5", "m7"],
                {"m1": [t(1), t(4)], "m3": [t(2)], "m5": [t(3)], "m7": [t(0)]}),
         leaving=3)
@given(group=balanced_groups(), leaving=st.integers(min_value=0, max_value=4))
def test_removed_members_tasks_are_the_only_ones_that_move(group, leaving: int) -> None:  # type: ignore[no-untyped-def]
    tasks, members, previous = group
    if len(members) < 2:
        return
    gone = members[leaving % len(members)]
    survivors = [m for m in members if m != gone]

    result = balance(tasks, survivors, previous)

    assert set(moved(previous, result)) <= set(previous[gone])


def test_balance_without_members_assigns_nothing() -> None:
    assert balance([t(0), t(1)], [], {}) == {}


def test_balance_without_previous_owners_spreads_tasks_evenly() -> None:
    result = balance([t(p) for p in range(5)], ["a", "b"], {})

    assert sorted(loads(result)) == [2, 3]


def test_previous_tasks_that_no_longer_exist_are_dropped() -> None:
    result = balance([t(0)], ["a"], {"a": [t(0), t(7)]})

    assert result == {"a": [t(0)]}


def test_task_claimed_by_two_previous_owners_goes_to_one_of_them() -> None:
    result = balance([t(0), t(1)], ["a", "b"], {"a": [t(0)], "b": [t(0), t(1)]})

    assert result == {"a": [t(0)], "b": [t(1)]}


def test_assigned_tasks_are_sorted() -> None:
    result = balance([t(3), t(1), t(2), t(0)], ["a"], {"a": [t(2), t(0)]})

    assert result == {"a": [t(0), t(1), t(2), t(3)]}


# -- user data --------------------------------------------------------------------------------


TASK_LISTS = st.lists(st.builds(TaskId, st.integers(0, 50), st.integers(0, 500)))


@given(
    process=st.text(), thread=st.text(), previous=TASK_LISTS, error=st.sampled_from(AssignorError)
)
def test_subscription_info_round_trips_through_bytes(
    process: str, thread: str, previous: list[TaskId], error: AssignorError
) -> None:
    info = SubscriptionInfo(process, thread, previous, error)

    assert SubscriptionInfo.decode(info.encode()) == info


@given(tasks=TASK_LISTS, error=st.sampled_from(AssignorError))
def test_assignment_info_round_trips_through_bytes(tasks: list[TaskId], error: AssignorError) -> None:
    info = AssignmentInfo(tasks, error)

    assert AssignmentInfo.decode(info.encode()) == info


def test_empty_user_data_decodes_to_no_tasks_and_no_error() -> None:
    assert SubscriptionInfo.decode(b"") == SubscriptionInfo("", "", [], AssignorError.NONE)
    assert AssignmentInfo.decode(b"") == AssignmentInfo([], AssignorError.NONE)


# -- StreamsAssignor -------------------------------------------------------------------------------


def subscribe(assignor: StreamsAssignor, member: str) -> MemberSubscription:
    return MemberSubscription(member, ("in",), assignor.subscription_user_data(["in"]))


def assignors(*threads: str) -> dict[str, StreamsAssignor]:
    topology = single_topic()
    return {thread: StreamsAssignor(topology, "process-1", thread) for thread in threads}


def test_subscription_user_data_carries_owned_tasks_and_shutdown_request() -> None:
    assignor = assignors("t-1")["t-1"]
    assignor.owned_tasks = [t(2), t(0)]
    assignor.shutdown = ShutdownRequest.ASKED

    info = SubscriptionInfo.decode(assignor.subscription_user_data(["in"]))

    assert info == SubscriptionInfo("process-1", "t-1", [t(2), t(0)], AssignorError.SHUTDOWN_REQUESTED)


def test_assign_gives_each_member_the_partitions_of_its_tasks() -> None:
    group = assignors("t-1", "t-2")
    leader = group["t-1"]

    result = leader.assign({m: subscribe(a, m) for m, a in group.items()}, {"in": 4})

    for assignment in result.values():
        tasks = AssignmentInfo.decode(assignment.user_data).tasks
        assert [TopicPartition("in", task.partition) for task in tasks] == list(assignment.partitions)
    partitions = [tp for a in result.values() for tp in a.partitions]
    assert sorted(partitions) == [TopicPartition("in", p) for p in range(4)]
    assert loads({m: a.partitions for m, a in result.items()}) == [2, 2]  # type: ignore[misc]


def test_assign_keeps_tasks_with_the_members_that_owned_them() -> None:
    group = assignors("t-1", "t-2")
    group["t-1"].owned_tasks = [t(1), t(3)]
    group["t-2"].owned_tasks = [t(0), t(2)]

    result = group["t-1"].assign({m: subscribe(a, m) for m, a in group.items()}, {"in": 4})

    assert AssignmentInfo.decode(result["t-1"].user_data).tasks == [t(1), t(3)]
    assert AssignmentInfo.decode(result["t-2"].user_data).tasks == [t(0), t(2)]


def test_on_assignment_exposes_the_assigned_tasks() -> None:
    assignor = assignors("t-1")["t-1"]

    assignor.on_assignment(MemberAssignment((TopicPartition("in", 1),), AssignmentInfo([t(1)]).encode()))

    assert assignor.assigned_tasks == [t(1)]
    assert assignor.shutdown is ShutdownRequest.NONE


def test_assignment_round_trips_to_every_member() -> None:
    group = assignors("t-1", "t-2", "t-3")
    result = group["t-2"].assign({m: subscribe(a, m) for m, a in group.items()}, {"in": 6})

    for member, assignor in group.items():
        assignor.on_assignment(result[member])

    assert sorted(task for a in group.values() for task in a.assigned_tasks) == [t(p) for p in range(6)]


def test_shutdown_request_of_any_member_gives_every_member_no_tasks_and_the_error() -> None:
    group = assignors("t-1", "t-2", "t-3")
    group["t-3"].shutdown = ShutdownRequest.ASKED

    result = group["t-1"].assign({m: subscribe(a, m) for m, a in group.items()}, {"in": 6})

    assert set(result) == set(group)
    for member, assignor in group.items():
        assert result[member].partitions == ()
        assignor.on_assignment(result[member])
        assert assignor.assigned_tasks == []
        assert assignor.shutdown is ShutdownRequest.ANSWERED


def test_member_without_user_data_still_gets_tasks() -> None:
    group = assignors("t-1")
    subscriptions = {"t-1": subscribe(group["t-1"], "t-1"), "other": MemberSubscription("other", ("in",))}

    result = group["t-1"].assign(subscriptions, {"in": 2})

    assert len(result["other"].partitions) == 1


# -- cooperative (KIP-429) -----------------------------------------------------------


@given(group=balanced_groups(), new_position=st.integers(min_value=0, max_value=5))
def test_cooperative_withholds_exactly_the_tasks_that_move_until_their_holders_let_go(  # type: ignore[no-untyped-def]
        group, new_position: int) -> None:
    """Kafka Streams' StreamsPartitionAssignorTest "...shouldNotAssignTasksOwnedByOtherConsumers": a task
    another member still holds goes to no one; after its holder let it go, the follow-up gives it."""
    tasks, members, previous = group
    new_member = f"m{2 * min(new_position, len(members))}"
    grown = sorted([*members, new_member])
    target = balance(tasks, grown, previous)

    first, withheld = withhold_owned(target, previous)

    assert set(withheld) == set(moved(previous, target))
    assert all(withheld[task] in members and task in previous[withheld[task]] for task in withheld)
    for member in members:
        assert first[member] == target[member]  # what stays keeps running, nothing new is withheld
    # The holders close the withheld tasks and rejoin: the same spread now goes through.
    released = {m: [task for task in previous.get(m, []) if task not in withheld] for m in grown}
    assert withhold_owned(balance(tasks, grown, released), released) == (target, {})


def cooperative_subscription(assignor: StreamsAssignor, member: str, owned: Sequence[TopicPartition]
                             ) -> MemberSubscription:
    return MemberSubscription(member, ("in",), assignor.subscription_user_data(["in"]), tuple(owned))


def test_cooperative_assign_gives_no_partition_another_member_holds() -> None:
    holder = StreamsAssignor(single_topic(), "p1", "t-1", cooperative=True)
    holder.owned_tasks = [t(0), t(1)]
    newcomer = StreamsAssignor(single_topic(), "p2", "t-2", cooperative=True)
    held = [TopicPartition("in", 0), TopicPartition("in", 1)]

    result = holder.assign({"t-1": cooperative_subscription(holder, "t-1", held),
                            "t-2": cooperative_subscription(newcomer, "t-2", [])}, {"in": 2})

    assert result["t-1"].partitions == (TopicPartition("in", 0),)
    assert result["t-2"].partitions == ()  # "in-1" moves in the follow-up rebalance
    eager = StreamsAssignor(single_topic(), "p1", "t-1", cooperative=False)
    eager.owned_tasks = [t(0), t(1)]
    at_once = eager.assign({"t-1": cooperative_subscription(eager, "t-1", held),
                            "t-2": cooperative_subscription(newcomer, "t-2", [])}, {"in": 2})
    assert at_once["t-2"].partitions == (TopicPartition("in", 1),)
