"""For random topics (some matching the source's pattern in full, some only in part, some created
while the application runs, with random partition counts) and random records, on one or two
stream threads of the memory broker: the output is exactly the records of the topics the pattern
matches in full (a pure-Python model: ``re.fullmatch``), each once, in order per key and topic."""

from __future__ import annotations

import asyncio
import re
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamloop import StreamsBuilder
from streamloop.serdes import StringSerde
from streamloop.testing import eventually_async
from streamloop.transport import open_transport
from tests.support.apps import make_streams
from tests.support.cluster import Cluster

S = StringSerde()
PATTERN = r"in-\d"
# Matching in full, and not: a longer name, a prefix before, another letter.
NAMES = ["in-0", "in-1", "in-2", "in-3", "in-00", "in-1x", "xin-1", "in-a"]

topic_strategy = st.tuples(st.sampled_from(NAMES), st.integers(1, 3))
records_strategy = st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 99)), max_size=8)
steps_strategy = st.lists(st.tuples(topic_strategy, records_strategy), min_size=1, max_size=4,
                          unique_by=lambda step: step[0][0])


def writes(initial: list, later: list) -> list[tuple[str, int, list[tuple[str, str]]]]:
    """(topic, partitions, [(key, value)]) in the order they are written: each later step writes
    its new topic, then the first topic again (records that tasks kept through the step must read)."""
    first, first_n = initial[0][0]
    out = [(topic, n, _values(topic, records, 0)) for (topic, n), records in initial]
    for step, ((topic, n), records) in enumerate(later, start=1):
        out.append((topic, n, _values(topic, records, 0)))
        out.append((first, first_n, _values(first, records, 100 * step)))
    return out


def model(initial: list, later: list) -> list[str]:
    """Every value written to a topic the pattern matches in full."""
    return sorted(v for topic, _n, pairs in writes(initial, later) if re.fullmatch(PATTERN, topic) for _k, v in pairs)


def _values(topic: str, records: list[tuple[str, int]], base: int) -> list[tuple[str, str]]:
    return [(key, f"{topic}|{key}|{base + i}|{n}") for i, (key, n) in enumerate(records)]


async def run(initial: list, later: list, threads: int) -> list[str]:
    bootstrap = f"memory://prop-pattern-{uuid.uuid4().hex[:8]}"
    cluster = Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)
    await cluster.create_topics({"out": 1, **{topic: n for (topic, n), _ in initial}})
    planned = writes(initial, later)
    for topic, n, pairs in planned[:len(initial)]:
        await cluster.produce(topic, pairs, S, S, n)
    builder = StreamsBuilder()
    builder.stream(re.compile(PATTERN), key_serde=S, value_serde=S).to("out")
    expected = model(initial, later)
    streams = make_streams(builder.build(), bootstrap, "prop-pattern-app", num_stream_threads=threads)
    async with streams:
        for topic, n, pairs in planned[len(initial):]:
            await cluster.create_topics({topic: n})  # the first topic again: it exists, nothing changes
            await cluster.produce(topic, pairs, S, S, n)

        async def caught_up() -> bool:
            return len(await cluster.read_all("out")) >= len(expected)

        await eventually_async(caught_up, timeout=30, what="the output of every matching topic")
    return [S.deserialize(r.value) for r in await cluster.read_all("out")]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=steps_strategy, split=st.integers(0, 4), threads=st.integers(1, 2))
def test_the_output_is_every_record_of_the_fully_matching_topics_once_in_order(
        steps: list, split: int, threads: int) -> None:
    initial, later = steps[:max(split, 1)], steps[max(split, 1):]
    output = asyncio.run(run(initial, later, threads))
    assert sorted(output) == model(initial, later)
    for topic in {t for (t, _), _ in steps}:
        for key in "abcd":
            seqs = [int(v.split("|")[2]) for v in output if v.startswith(f"{topic}|{key}|")]
            assert seqs == sorted(seqs)
