"""KIP-572 on both transports: a timeout sets one task aside, the others go on, the record is retried."""

from __future__ import annotations

import re
import threading
from collections import Counter

import pytest

from streamloop import ClientState, StreamsBuilder
from streamloop.console.views import tasks_view
from streamloop.errors import TaskTimeoutError
from streamloop.handlers import StreamThreadExceptionResponse
from streamloop.ids import TaskId
from streamloop.serdes import IntegerSerde, JsonSerde
from streamloop.testing import eventually_async
from streamloop.threads.stream_thread import TaskRunState
from tests.support.apps import make_streams
from tests.support.cluster import Cluster

pytestmark = pytest.mark.asyncio

INT, JSON = IntegerSerde(), JsonSerde()


def timing_out_topology(source: str, sink: str, times_out) -> StreamsBuilder:
    """``times_out(value)`` says whether this attempt of a record times out."""
    attempts: Counter[int] = Counter()

    async def call_service(value: dict) -> dict:
        attempts[value["i"]] += 1
        if times_out(value):
            raise TimeoutError(f"service did not answer for record {value['i']}")
        return {**value, "attempts": attempts[value["i"]]}

    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .map_values(call_service, name="call-service")
            .to(sink, key_serde=INT, value_serde=JSON))
    builder.attempts = attempts  # type: ignore[attr-defined]
    return builder


async def produce_two_partitions(cluster: Cluster, names, count: int) -> tuple[str, str, list]:
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 2, sink: 2})
    records = [(i % 2, {"i": i, "p": i % 2}) for i in range(count)]
    await cluster.produce(source, records, INT, JSON, partitions=2)
    return source, sink, records


async def test_a_timing_out_task_does_not_hold_up_the_others_and_skips_nothing(cluster: Cluster, names) -> None:
    source, sink, _records = await produce_two_partitions(cluster, names, 200)
    release = threading.Event()
    builder = timing_out_topology(source, sink, lambda v: v["p"] == 0 and not release.is_set())
    streams = make_streams(builder.build(), cluster.bootstrap, names.app, task_timeout_ms=120_000,
                           retry_backoff_ms=20, retry_backoff_max_ms=50)
    async with streams:
        # Partition 1's task runs to the end while partition 0's keeps timing out.
        first = await cluster.read(sink, 100, timeout=30)
        assert {JSON.deserialize(r.value)["p"] for r in first} == {1}
        await eventually_async(lambda: builder.attempts[0] > 2, 30, "record 0 retried, not skipped")
        assert not any(JSON.deserialize(r.value)["p"] == 0 for r in await cluster.read_all(sink))
        # What the console shows: the task is retrying, with the time left of task.timeout.ms.
        details = {d.task_id: d for d in streams.local_task_details()}
        assert details[TaskId(0, 0)].state is TaskRunState.RETRYING
        assert 0 < details[TaskId(0, 0)].timeout_deadline_in_ms <= 120_000  # type: ignore[operator]
        assert details[TaskId(0, 0)].timeout_retries >= 2
        assert details[TaskId(0, 1)].state is TaskRunState.RUNNING
        assert details[TaskId(0, 1)].timeout_deadline_in_ms is None
        assert re.search(r"0_0 .* retrying \(deadline in \d+\.\d s\)", tasks_view(streams))
        release.set()
        output = await cluster.read(sink, 200, timeout=30)
        await eventually_async(lambda: all(d.state is TaskRunState.RUNNING for d in streams.local_task_details()),
                               30, "both tasks running again")
        assert streams.metric("failed-stream-threads") == 0
        assert streams.state is ClientState.RUNNING
    from_zero = [JSON.deserialize(r.value)["i"] for r in sorted(output, key=lambda r: (r.partition, r.offset))
                 if JSON.deserialize(r.value)["p"] == 0]
    assert from_zero == [i for i in range(200) if i % 2 == 0]


async def test_a_task_past_its_deadline_fails_with_task_timeout_error(cluster: Cluster, names) -> None:
    source, sink, _ = await produce_two_partitions(cluster, names, 40)
    builder = timing_out_topology(source, sink, lambda v: v["p"] == 0)
    errors: list[BaseException] = []

    def handler(exc: BaseException) -> StreamThreadExceptionResponse:
        errors.append(exc)
        return StreamThreadExceptionResponse.SHUTDOWN_CLIENT

    streams = make_streams(builder.build(), cluster.bootstrap, names.app, task_timeout_ms=300,
                           retry_backoff_ms=20, retry_backoff_max_ms=50)
    streams.set_uncaught_exception_handler(handler)
    await streams.start_async()
    try:
        assert await streams.wait_for_state_async(ClientState.ERROR, timeout=30)
    finally:
        await streams.close_async()
    assert len(errors) == 1
    error = errors[0]
    assert isinstance(error, TaskTimeoutError)
    assert error.task_id == TaskId(0, 0)
    assert isinstance(error.__cause__, TimeoutError)
    assert "call-service" in str(error)
    assert builder.attempts[0] >= 2  # retried until the deadline, then one final attempt


async def test_zero_task_timeout_fails_at_the_first_timeout(cluster: Cluster, names) -> None:
    source, sink, _ = await produce_two_partitions(cluster, names, 2)
    builder = timing_out_topology(source, sink, lambda v: v["p"] == 0)
    errors: list[BaseException] = []
    streams = make_streams(builder.build(), cluster.bootstrap, names.app, task_timeout_ms=0)
    streams.set_uncaught_exception_handler(
        lambda exc: errors.append(exc) or StreamThreadExceptionResponse.SHUTDOWN_CLIENT)
    await streams.start_async()
    try:
        assert await streams.wait_for_state_async(ClientState.ERROR, timeout=30)
    finally:
        await streams.close_async()
    assert isinstance(errors[0], TaskTimeoutError)
    assert builder.attempts[0] == 1
