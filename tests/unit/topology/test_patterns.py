"""Sources by pattern in the topology: what a pattern matches, the one subscription pattern, the
tasks made of the matched topics, what is refused (overlapping patterns, joins), and the assignor
carrying the matched topics to every member."""

from __future__ import annotations

import re

import pytest

from streamloop import JoinWindows, Materialized, StreamsBuilder, TopologyError
from streamloop.ids import TaskId
from streamloop.records import TopicPartition
from streamloop.serdes import StringSerde
from streamloop.tasks.assignor import AssignmentInfo, StreamsAssignor, SubscriptionInfo, tasks_for
from streamloop.transport.base import MemberSubscription

S = StringSerde()


def pattern_topology(pattern: str = r"topic-\d", *, named: tuple[str, ...] = ()) -> StreamsBuilder:
    builder = StreamsBuilder()
    builder.stream(re.compile(pattern), key_serde=S, value_serde=S).to("out")
    if named:
        builder.stream(named).to("out")
    return builder


def test_a_pattern_matches_whole_topic_names_only() -> None:
    """Matches RegexSourceIntegrationTest.testShouldReadFromRegexAndNamedTopics (Java's Matcher#matches)."""
    topology = pattern_topology(named=("topic-Y", "topic-Z")).build()
    topology.set_application_id("app")
    assert topology.resolve_patterns(["topic-1", "topic-2", "topic-11", "my-topic-1", "topic-1x", "topic-Y", "out"])
    assert topology.subtopologies[0].source_topics == ("topic-1", "topic-2")
    assert not topology.resolve_patterns(["topic-2", "topic-1"])  # the same topics: nothing changed


def test_the_subscription_pattern_matches_named_topics_and_the_patterns_in_full() -> None:
    builder = StreamsBuilder()
    builder.stream(re.compile("logs-[a-z]+", re.IGNORECASE)).to("out")
    builder.stream(["a.b", "c"]).to("out")
    pattern = builder.build().subscription_pattern()
    assert [t for t in ["logs-abc", "LOGS-X", "logs-1", "logs-a-b", "a.b", "axb", "c", "cc"] if pattern.match(t)] == [
        "logs-abc", "LOGS-X", "a.b", "c"]


def test_the_applications_internal_topics_and_global_topics_are_never_matched() -> None:
    builder = StreamsBuilder()
    builder.stream(re.compile("app-.*|.*-table")).group_by_key().count(materialized="counts")
    builder.global_table("g-table")
    topology = builder.build()
    topology.set_application_id("app")
    topology.resolve_patterns(["app-counts-changelog", "app-KSTREAM-x-repartition", "g-table", "app-data", "t-table"])
    assert topology.subtopologies[0].source_topics == ("app-data", "t-table")


def test_tasks_are_made_of_the_matched_topics_partitions() -> None:
    topology = pattern_topology().build()
    topology.set_application_id("app")
    counts = {"topic-1": 2, "topic-2": 3, "out": 1}
    topology.resolve_patterns(counts)
    tasks = tasks_for(topology, counts)
    assert tasks == {
        TaskId(0, 0): [TopicPartition("topic-1", 0), TopicPartition("topic-2", 0)],
        TaskId(0, 1): [TopicPartition("topic-1", 1), TopicPartition("topic-2", 1)],
        TaskId(0, 2): [TopicPartition("topic-2", 2)],
    }


def test_a_topic_two_patterns_match_is_refused() -> None:
    """Matches RegexSourceIntegrationTest.testNoMessagesSentExceptionFromOverlappingPatterns (Kafka
    Streams raises a TopologyException for the topic both patterns match)."""
    builder = StreamsBuilder()
    builder.stream(re.compile("foo.*")).to("out")
    builder.stream(re.compile("f.*")).to("out")
    topology = builder.build()
    topology.set_application_id("app")
    with pytest.raises(TopologyError, match="Topic 'foo' is matched by the patterns of sources"):
        topology.resolve_patterns(["foo", "fa"])


def test_a_topic_a_source_names_is_not_matched_by_a_pattern() -> None:
    topology = pattern_topology(r"topic-.*", named=("topic-Y",)).build()
    topology.set_application_id("app")
    topology.resolve_patterns(["topic-A", "topic-Y"])
    assert [s.source_topics for s in topology.subtopologies] == [("topic-A",), ("topic-Y",)]


@pytest.mark.parametrize("join", ["stream-table", "stream-stream", "table-side"])
def test_a_join_fed_by_a_pattern_source_is_refused_with_a_typed_error(join: str) -> None:
    """Kafka Streams refuses to co-partition a pattern source (its topics are not known up front)."""
    builder = StreamsBuilder()
    stream = builder.stream(re.compile("orders-.*"), key_serde=S, value_serde=S)
    windows = JoinWindows.of_time_difference_with_no_grace(1000)
    with pytest.raises(TopologyError, match=r"reads topics by the pattern 'orders-\.\*'.*co-partitioned"):
        if join == "stream-table":  # refused at once
            stream.join(builder.table("customers", key_serde=S, value_serde=S), lambda v, t: v)
        elif join == "stream-stream":  # refused by build(), with the other co-partition checks
            stream.join(builder.stream("payments"), lambda v, o: v, windows)
        else:
            builder.stream("payments").join(stream, lambda v, o: v, windows)
        builder.build()


def test_a_repartitioned_pattern_stream_may_be_joined() -> None:
    builder = StreamsBuilder()
    stream = builder.stream(re.compile("orders-.*"), key_serde=S, value_serde=S).repartition()
    stream.join(builder.table("customers", key_serde=S, value_serde=S), lambda v, t: v)
    builder.build()


def test_describe_shows_the_pattern() -> None:
    assert r"Source: KSTREAM-SOURCE-0000000000 (topics: [topic-\d])" in pattern_topology().build().describe()


def test_a_stateful_pattern_subtopology_needs_a_match_to_size_its_changelog() -> None:
    builder = StreamsBuilder()
    builder.stream(re.compile("in-.*")).group_by_key().count(materialized=Materialized("c", persistent=False))
    topology = builder.build()
    topology.set_application_id("app")
    topology.resolve_patterns([])
    with pytest.raises(TopologyError, match="reads by pattern but no topic matches yet"):
        topology.internal_topics({})
    topology.resolve_patterns(["in-a"])
    assert topology.internal_topics({"in-a": 3}) == {"app-c-changelog": (3, {"cleanup.policy": "compact"})}


def test_the_leader_resolves_the_patterns_and_members_learn_the_topics_from_the_assignment() -> None:
    leader_topology, member_topology = pattern_topology().build(), pattern_topology().build()
    for topology in (leader_topology, member_topology):
        topology.set_application_id("app")
    leader = StreamsAssignor(leader_topology, "p1", "t1")
    member = StreamsAssignor(member_topology, "p2", "t1")
    subscriptions = {m: MemberSubscription(m, ("topic-1", "topic-2"), SubscriptionInfo(p, "t1").encode())
                     for m, p in (("m1", "p1"), ("m2", "p2"))}
    assignments = leader.assign(subscriptions, {"topic-1": 1, "topic-2": 2})
    assert AssignmentInfo.decode(assignments["m2"].user_data).pattern_topics == ["topic-1", "topic-2"]
    assert member_topology.subtopologies[0].source_topics == ()
    member.on_assignment(assignments["m2"])
    assert member_topology.subtopologies[0].source_topics == ("topic-1", "topic-2")
    assert sorted(tp for a in assignments.values() for tp in a.partitions) == [
        TopicPartition("topic-1", 0), TopicPartition("topic-2", 0), TopicPartition("topic-2", 1)]


def test_a_topic_matched_later_with_more_partitions_than_the_changelog_is_refused() -> None:
    from streamloop.topology.patterns import check_task_limits

    builder = StreamsBuilder()
    builder.stream(re.compile("in-.*")).group_by_key().count(materialized=Materialized("c", persistent=False))
    topology = builder.build()
    topology.set_application_id("app")
    topology.resolve_patterns(["in-a"])
    topology.internal_topics({"in-a": 2})
    topology.resolve_patterns(["in-a", "in-b", "in-c"])
    check_task_limits(topology, {"in-a": 2, "in-b": 2})
    with pytest.raises(TopologyError, match=r"created for \(2\): 'in-c' \(3\)"):
        check_task_limits(topology, {"in-a": 2, "in-b": 2, "in-c": 3})


def test_query_metadata_of_a_store_after_a_pattern_source_follows_the_matched_topics() -> None:
    from streamloop.state.metadata import HostInfo, StreamsMetadataState

    builder = StreamsBuilder()
    builder.stream(re.compile("in-.*"), key_serde=S).group_by_key().count(
        materialized=Materialized("c", persistent=False))
    topology = builder.build()
    topology.set_application_id("app")
    state = StreamsMetadataState.for_topology("localhost:1", topology)
    topology.resolve_patterns(["in-a"])
    state.on_change({HostInfo("localhost", 1): {TopicPartition("in-a", 0), TopicPartition("in-a", 1)}}, {})
    metadata = state.key_query_metadata_for_key("c", "k", S)
    assert metadata is not None and metadata.active_host == HostInfo("localhost", 1)
    assert state.all_metadata()[0].state_store_names == {"c"}


def test_the_test_driver_reads_a_topic_a_pattern_matches_when_it_is_first_piped_into() -> None:
    """As Kafka Streams' TopologyTestDriver with a pattern source: piping into a matching topic reads
    it, here joining the task of its partition (revoked, committed and assigned again)."""
    from streamloop.testing import TopologyTestDriver

    builder = StreamsBuilder()
    (builder.stream(re.compile(r"clicks-\w+"), key_serde=S, value_serde=S)
            .group_by_key().count(materialized=Materialized("per-user", persistent=False)))
    # "clicks-web" exists from the start (given partitions); "clicks-app" comes with its first record.
    with TopologyTestDriver(builder.build(), partitions={"clicks-web": 2}) as driver:
        web = driver.create_input_topic("clicks-web", S, S)
        for user in ("ann", "bob", "cy"):
            web.pipe_input(user, "/home")
        assert driver.topology.subtopologies[0].source_topics == ("clicks-web",)
        app = driver.create_input_topic("clicks-app", S, S)
        assert driver.topology.subtopologies[0].source_topics == ("clicks-app", "clicks-web")
        app.pipe_input("ann", "/cart", partition=0)
        web.pipe_input("ann", "/docs")
        store = driver.get_key_value_store("per-user")
        assert [store.get(u) for u in ("ann", "bob", "cy")] == [3, 1, 1]
        with pytest.raises(TopologyError, match="'other' is not read by this topology"):
            driver.create_input_topic("other", S, S)


def test_the_test_driver_adopts_matching_topics_of_a_stateless_pattern_source() -> None:
    from streamloop.testing import TopologyTestDriver

    builder = StreamsBuilder()
    builder.stream(re.compile("in-[0-9]"), key_serde=S, value_serde=S).map_values(str.upper).to("out", value_serde=S)
    with TopologyTestDriver(builder.build()) as driver:
        driver.create_input_topic("in-1", S, S).pipe_input("k", "a")
        driver.create_input_topic("in-2", S, S).pipe_input("k", "b")
        assert driver.create_output_topic("out", S, S).read_values() == ["A", "B"]
