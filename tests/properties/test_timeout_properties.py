"""KIP-572 under random timeout schedules: nothing lost, per-key order kept, and only a task
that is still timing out past its deadline fails."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamloop import ClientState, StreamsBuilder
from streamloop.errors import TaskTimeoutError
from streamloop.handlers import StreamThreadExceptionResponse
from streamloop.ids import TaskId
from streamloop.serdes import IntegerSerde, JsonSerde
from streamloop.transport import open_transport
from tests.support.apps import make_streams
from tests.support.cluster import Cluster

INT, JSON = IntegerSerde(), JsonSerde()


def topology(timeouts_of: dict[int, int]) -> tuple[StreamsBuilder, Counter[int]]:
    """Record ``i`` times out ``timeouts_of[i]`` times (-1: forever) before it goes through."""
    attempts: Counter[int] = Counter()

    async def call(value: dict) -> dict:
        attempts[value["i"]] += 1
        budget = timeouts_of.get(value["i"], 0)
        if budget < 0 or attempts[value["i"]] <= budget:
            raise TimeoutError()
        return value

    builder = StreamsBuilder()
    builder.stream("in", key_serde=INT, value_serde=JSON).map_values(call).to("out", key_serde=INT, value_serde=JSON)
    return builder, attempts


async def run(records: list, partitions: int, timeouts_of: dict[int, int], task_timeout_ms: int,
              expect_failure: bool) -> tuple[list, list[BaseException]]:
    bootstrap = f"memory://timeouts-{uuid.uuid4().hex[:8]}"
    cluster = Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)
    await cluster.create_topics({"in": partitions, "out": partitions})
    await cluster.produce("in", records, INT, JSON, partitions=partitions)
    builder, _ = topology(timeouts_of)
    errors: list[BaseException] = []
    streams = make_streams(builder.build(), bootstrap, "timeouts-app", num_stream_threads=2,
                           task_timeout_ms=task_timeout_ms, retry_backoff_ms=1, retry_backoff_max_ms=2)
    streams.set_uncaught_exception_handler(
        lambda exc: errors.append(exc) or StreamThreadExceptionResponse.SHUTDOWN_THREAD)
    async with streams:
        if expect_failure:
            # Partition 0's task kills each thread it lands on, so the client ends in ERROR.
            assert await streams.wait_for_state_async(ClientState.ERROR, timeout=30)
        wanted = sum(1 for k, v in records if not expect_failure or k % partitions != 0)
        await cluster.read("out", wanted, timeout=30)
    output = await cluster.read_all("out")
    return [(INT.deserialize(r.key), JSON.deserialize(r.value)) for r in
            sorted(output, key=lambda r: (r.partition, r.offset))], errors


record_lists = st.lists(st.integers(0, 5), min_size=1, max_size=40).map(
    lambda keys: [(k, {"i": i}) for i, k in enumerate(keys)])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=record_lists, partitions=st.integers(1, 3), data=st.data())
def test_timeouts_within_the_deadline_lose_nothing_and_keep_order(records: list, partitions: int, data) -> None:
    timeouts_of = {v["i"]: data.draw(st.integers(0, 3)) for _, v in records}
    output, errors = asyncio.run(run(records, partitions, timeouts_of, 60_000, expect_failure=False))
    assert errors == []
    assert sorted(v["i"] for _, v in output) == sorted(v["i"] for _, v in records)
    for key in {k for k, _ in records}:
        assert [v["i"] for k, v in output if k == key] == [v["i"] for k, v in records if k == key]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=record_lists, partitions=st.integers(2, 3))
def test_only_the_task_timing_out_past_its_deadline_fails(records: list, partitions: int) -> None:
    # Every record of partition 0 times out forever; the other partitions never time out.
    records = [*records, (0, {"i": len(records)})]
    timeouts_of = {v["i"]: -1 for k, v in records if k % partitions == 0}
    output, errors = asyncio.run(run(records, partitions, timeouts_of, 300, expect_failure=True))
    assert errors and all(isinstance(e, TaskTimeoutError) for e in errors)
    assert {e.task_id for e in errors} == {TaskId(0, 0)}
    # A thread died, so records after its last commit may come out twice (at-least-once): compare sets.
    assert {v["i"] for _, v in output} == {v["i"] for k, v in records if k % partitions != 0}
