"""When a thread's generation is stale because of its own client's threads (streamloop.tasks.membership),
and the rosters the assignor hands out for it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streamloop.tasks.assignor import AssignmentInfo, StreamsAssignor, SubscriptionInfo
from streamloop.tasks.membership import LEFT, Change, FollowUpWait, GenerationWatch, Membership
from streamloop.topology.builder import StreamsBuilder
from streamloop.transport.base import MemberAssignment, MemberSubscription


def settled(own: Membership, *members: Membership) -> GenerationWatch:
    """A watch in a generation whose roster records each of ``members`` at its current join."""
    watch = GenerationWatch(own)
    watch.begin_join()
    watch.registered()
    watch.settle(1, {m.token: m.joins for m in (own, *members)})
    return watch


def joined(name: str, joins: int = 1) -> Membership:
    """A member whose latest join ``joins`` the coordinator has."""
    member = Membership(name)
    member.joining = member.joins = joins
    return member


def test_a_join_counts_once_however_often_its_joingroup_is_retried() -> None:
    own = Membership("t1")
    watch = GenerationWatch(own)
    assert watch.begin_join() and own.joining == 1
    assert not watch.begin_join()  # the same join, retried before any assignment came
    assert own.joining == 1
    watch.settle(3, {own.token: 1})
    assert watch.begin_join() and own.joining == 2
    assert watch.roster is None and watch.number is None


def test_siblings_count_a_join_once_the_coordinator_has_it() -> None:
    """A new thread's first join counts for its siblings only once its first JoinGroup is answered:
    a sibling rejoining before that could form a generation without it, and would wait for its
    heartbeat to hear of the next one."""
    own, new = joined("t1"), Membership("t2")
    watch = settled(own)
    new_watch = GenerationWatch(new)
    new_watch.begin_join()
    assert (new.joining, new.joins) == (1, 0)
    assert watch.stale([(new, True)]) == []
    assert new_watch.registered()
    assert not new_watch.registered()  # told once
    assert watch.stale([(new, True)]) == [Change(new.token, "t2", 1)]


def test_tokens_differ_for_threads_of_the_same_name() -> None:
    """KIP-663 gives a removed thread's name to the next one added: a roster must tell them apart."""
    assert Membership("app-StreamThread-2").token != Membership("app-StreamThread-2").token


def test_a_roster_with_every_sibling_at_its_current_join_is_not_stale() -> None:
    own, sibling = joined("t1"), joined("t2", 3)
    watch = settled(own, sibling)
    assert watch.stale([(own, True), (sibling, True)]) == []


def test_a_sibling_that_starts_a_join_makes_the_generation_stale_once() -> None:
    own, sibling = joined("t1"), joined("t2")
    watch = settled(own, sibling)
    sibling.joins = 2
    assert watch.stale([(sibling, True)]) == [Change(sibling.token, "t2", 2)]
    assert watch.stale([(sibling, True)]) == []  # rejoined for it already
    sibling.joins = 3
    assert watch.stale([(sibling, True)]) == [Change(sibling.token, "t2", 3)]


def test_a_new_thread_missing_from_the_roster_makes_it_stale_once_it_joins() -> None:
    own, new = joined("t1"), Membership("t2")
    watch = settled(own)
    assert watch.stale([(new, True)]) == []  # created, not joining yet: it will join by itself
    new.joining = new.joins = 1
    assert watch.stale([(new, True)]) == [Change(new.token, "t2", 1)]


def test_a_thread_shutting_down_makes_it_stale_only_once_it_left() -> None:
    own, leaving = joined("t1"), joined("t2")
    watch = settled(own, leaving)
    leaving.joins = 2  # it rejoined on its way out: not a reason, it is no longer alive
    assert watch.stale([(leaving, False)]) == []
    leaving.left = True
    assert watch.stale([(leaving, False)]) == [Change(leaving.token, "t2", LEFT)]
    assert watch.stale([(leaving, False)]) == []


def test_a_thread_that_left_before_the_generation_is_no_reason() -> None:
    own, gone = joined("t1"), joined("t2")
    gone.left = True
    assert settled(own).stale([(gone, False)]) == []


def test_nothing_is_stale_while_the_thread_is_joining() -> None:
    own, sibling = joined("t1"), joined("t2")
    watch = settled(own, sibling)
    watch.begin_join()
    sibling.joins = 2
    assert watch.stale([(sibling, True)]) == []
    watch.settle(2, {own.token: own.joins, sibling.token: 1})  # it formed without the sibling's new join
    assert watch.stale([(sibling, True)]) == [Change(sibling.token, "t2", 2)]


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 4), st.booleans(), st.booleans()), max_size=12),
       st.lists(st.tuples(st.integers(0, 3), st.integers(0, 4), st.booleans()), max_size=30))
def test_each_change_makes_a_thread_rejoin_at_most_once(
        roster_entries: list[tuple[int, int, bool, bool]], steps: list[tuple[int, int, bool]]) -> None:
    """However siblings join, die and leave, and however often the thread looks, it rejoins at
    most once for each (sibling, join) and each departure, and only for a change its roster lacks."""
    own = joined("own")
    siblings = [Membership(f"t{i}") for i in range(4)]
    roster = {own.token: own.joins}
    for index, joins, in_roster, _ in roster_entries:
        siblings[index].joins = max(siblings[index].joins, joins)
        if in_roster:
            roster[siblings[index].token] = siblings[index].joins
    watch = GenerationWatch(own)
    watch.begin_join()
    watch.settle(1, roster)
    alive = dict.fromkeys(range(4), True)
    seen: list[Change] = []
    for index, bump, leave in steps:
        member = siblings[index]
        if leave and alive[index]:
            alive[index] = False
            member.left = True
        elif alive[index]:
            member.joins += bump
        for change in watch.stale([(m, alive[i]) for i, m in enumerate(siblings)]):
            assert change not in seen
            if change.joins == LEFT:
                assert change.token in roster
            else:
                assert roster.get(change.token) != change.joins
            seen.append(change)


def streams_assignor(process: str, thread: str, membership: Membership) -> StreamsAssignor:
    builder = StreamsBuilder()
    builder.stream("in").to("out")
    return StreamsAssignor(builder.build(), process, thread, membership=membership)


def test_the_leader_gives_each_member_the_roster_of_its_own_instance() -> None:
    a1, a2, b1 = joined("a-1", 2), joined("a-2", 1), joined("b-1", 5)
    members = {"m-a1": ("A", a1), "m-a2": ("A", a2), "m-b1": ("B", b1)}
    subscriptions = {
        member: MemberSubscription(member, ("in",), streams_assignor(process, m.name, m).subscription_user_data(["in"]))
        for member, (process, m) in members.items()}
    leader = streams_assignor("A", "a-1", a1)
    result = leader.assign(subscriptions, {"in": 4})
    rosters = {member: AssignmentInfo.decode(assignment.user_data).roster for member, assignment in result.items()}
    assert rosters["m-a1"] == rosters["m-a2"] == {a1.token: 2, a2.token: 1}
    assert rosters["m-b1"] == {b1.token: 5}
    follower = streams_assignor("A", "a-2", a2)
    follower.on_assignment(MemberAssignment(result["m-a2"].partitions, result["m-a2"].user_data))
    assert follower.roster == {a1.token: 2, a2.token: 1}


def test_subscriptions_without_a_membership_token_still_decode() -> None:
    """A member of an older version sends no token: it is in no roster, and nothing breaks."""
    info = SubscriptionInfo.decode(b'{"v": 2, "process": "p", "thread": "t"}')
    assert (info.member, info.joins) == ("", 0)
    assert AssignmentInfo.decode(b'{"v": 2, "tasks": []}').roster == {}


def test_a_member_waiting_for_a_follow_up_asks_at_doubling_intervals_up_to_its_heartbeat() -> None:
    wait = FollowUpWait(first_ms=100, heartbeat_ms=1_000)
    assert not wait.due(0)
    wait.begin(1_000)
    asks = [now for now in range(1_000, 5_000, 10) if wait.due(now)]
    # 100, then 200, 400 and 800 ms apart; the next step would be the heartbeat interval itself.
    assert asks == [1_100, 1_300, 1_700, 2_500]
    assert not wait.waiting


def test_a_member_asks_once_at_a_time_and_stops_when_it_joins() -> None:
    wait = FollowUpWait(first_ms=100, heartbeat_ms=3_000)
    wait.begin(0)
    wait.in_flight = True
    assert not wait.due(150)
    wait.in_flight = False
    assert wait.due(150)
    wait.end()
    assert not wait.waiting and not wait.due(10_000)
