"""The streams uncaught-exception handler (KIP-671), on the memory broker and on real Kafka.

Each test is one behaviour of issue 4; the Kafka Streams test it mirrors is named
where there is one (StreamsUncaughtExceptionHandlerIntegrationTest, KafkaStreamsTest).
Failures are injected by poison values: a record whose value carries ``"poison": true``
makes the peek action raise, the first time it is seen (or every time).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from streamloop import (
    ClientState,
    DeserializationError,
    IllegalStateError,
    KafkaStreams,
    ProcessingError,
    ProduceError,
    StreamsBuilder,
    StreamThreadState,
    TaskId,
    Topology,
    TransportError,
)
from streamloop.errors import TaskTimeoutError
from streamloop.handlers import StreamThreadExceptionResponse as Response
from streamloop.serdes import IntegerSerde, JsonSerde
from streamloop.testing import eventually, eventually_async
from streamloop.transport.base import ProducerSettings
from tests.support.apps import make_streams
from tests.support.cluster import EVERY_BROKER, Cluster

pytestmark = pytest.mark.asyncio

INT, JSON = IntegerSerde(), JsonSerde()
# Generous: the Kafka variants must pass on a loaded 2-core machine.
DEADLINE = 60.0


# -- the failing application -----------------------------------------------------------------


class PoisonError(RuntimeError):
    """What the poison peek raises."""


class Poison:
    """A peek action: remembers every value it sees and raises on a poison value,
    only the first ``times`` times it sees that value (``None``: every time)."""

    def __init__(self, times: int | None = 1, exc: Callable[[int], BaseException] | None = None) -> None:
        self._lock = threading.Lock()
        self._times = times
        self._exc = exc or (lambda n: PoisonError(f"poison value {n}"))
        self.seen: list[int] = []
        self.failures: Counter[int] = Counter()

    def __call__(self, _key: int, value: dict[str, Any]) -> None:
        with self._lock:
            self.seen.append(value["n"])
            if value.get("poison") and (self._times is None or self.failures[value["n"]] < self._times):
                self.failures[value["n"]] += 1
                raise self._exc(value["n"])

    def count(self, n: int) -> int:
        with self._lock:
            return self.seen.count(n)


def poison_topology(source: str, sink: str, poison: Poison, partitioner: Any = None) -> Topology:
    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .peek(poison)
            .map_values(lambda value: {"n": value["n"]})
            .to(sink, key_serde=INT, value_serde=JSON, partitioner=partitioner))
    return builder.build()


def good(*ns: int) -> list[tuple[int, dict[str, Any]]]:
    return [(n, {"n": n}) for n in ns]


def bad(n: int) -> list[tuple[int, dict[str, Any]]]:
    return [(n, {"n": n, "poison": True})]


@dataclass
class Call:
    """One call of the handler, and what the client looked like from inside it."""

    exception: BaseException
    thread_name: str
    thread_states: dict[str, StreamThreadState]
    at: float = field(default_factory=time.monotonic)


class Handler:
    """Answers with ``responses`` in turn (the last one again when they run out) and records each call."""

    def __init__(self, *responses: Response, then: Callable[[KafkaStreams], None] | None = None) -> None:
        self._responses = list(responses)
        self._then = then
        self.streams: KafkaStreams | None = None
        self.calls: list[Call] = []

    def install(self, streams: KafkaStreams) -> KafkaStreams:
        self.streams = streams
        streams.set_uncaught_exception_handler(self)
        return streams

    def __call__(self, exc: BaseException) -> Response:
        assert self.streams is not None
        call = Call(exc, threading.current_thread().name,
                    {t.thread_name: t.thread_state for t in self.streams.metadata_for_local_threads()})
        if self._then is not None:
            self._then(self.streams)
        self.calls.append(call)  # last: a test that sees the call sees what ``then`` did
        index = min(len(self.calls), len(self._responses)) - 1
        return self._responses[index]


# -- helpers ----------------------------------------------------------------------------------


async def topics(cluster: Cluster, names: Any, partitions: int = 1) -> tuple[str, str]:
    source, sink = names("input"), names("output")
    await cluster.create_topics({source: partitions, sink: partitions})
    return source, sink


async def produce(cluster: Cluster, source: str, records: list[tuple[int, dict[str, Any]]],
                  partitions: int = 1) -> None:
    await cluster.produce(source, records, INT, JSON, partitions=partitions)


async def output_values(cluster: Cluster, sink: str) -> list[int]:
    return [JSON.deserialize(r.value)["n"] for r in await cluster.read_all(sink)]


async def wait_for_output(cluster: Cluster, sink: str, expected: set[int], what: str) -> list[int]:
    async def complete() -> list[int] | None:
        values = await output_values(cluster, sink)
        return values if expected <= set(values) else None

    return await eventually_async(complete, DEADLINE, what)


def thread_names(streams: KafkaStreams) -> list[str]:
    return sorted(t.thread_name for t in streams.metadata_for_local_threads())


def thread_name(streams: KafkaStreams, index: int) -> str:
    return f"{streams.client_id}-StreamThread-{index}"


def local_tasks(streams: KafkaStreams) -> set[str]:
    return {str(task.task_id) for t in streams.metadata_for_local_threads() for task in t.active_tasks}


def settled(streams: KafkaStreams, names: Sequence[str]) -> bool:
    """RUNNING with exactly ``names`` as threads, each of them RUNNING."""
    threads = streams.metadata_for_local_threads()
    return (streams.state is ClientState.RUNNING
            and sorted(t.thread_name for t in threads) == sorted(names)
            and all(t.thread_state is StreamThreadState.RUNNING for t in threads))


async def start(streams: KafkaStreams) -> None:
    await streams.start_async()
    assert await streams.wait_for_state_async(ClientState.RUNNING, timeout=DEADLINE)


async def wait_for_calls(handler: Handler, count: int) -> None:
    await eventually_async(lambda: len(handler.calls) >= count, DEADLINE, f"{count} call(s) of the handler")


async def close(streams: KafkaStreams) -> None:
    assert await streams.close_async(timeout=DEADLINE)


def app(cluster: Cluster, names: Any, source: str, sink: str, poison: Poison, **overrides: Any) -> KafkaStreams:
    return make_streams(poison_topology(source, sink, poison), cluster.bootstrap, names.app, **overrides)


# -- where and with what the handler runs -------------------------------------------------------


async def test_handler_runs_on_the_failing_thread_while_it_is_alive(cluster: Cluster, names) -> None:
    source, sink = await topics(cluster, names, partitions=2)
    poison = Poison()
    handler = Handler(Response.SHUTDOWN_CLIENT)
    streams = handler.install(app(cluster, names, source, sink, poison, num_stream_threads=2))
    await start(streams)
    try:
        await produce(cluster, source, good(0, 2, 4) + bad(1), partitions=2)
        await wait_for_calls(handler, 1)
        call = handler.calls[0]
        assert call.thread_name in (thread_name(streams, 1), thread_name(streams, 2))
        # Still listed (not DEAD): the thread is shutting down, not gone.
        assert call.thread_states[call.thread_name] is StreamThreadState.PENDING_SHUTDOWN
        error = call.exception
        assert isinstance(error, ProcessingError)
        assert error.task_id == TaskId(0, 1)
        assert (error.topic, error.partition, error.offset) == (source, 1, 0)
        assert isinstance(error.__cause__, PoisonError)
    finally:
        await close(streams)


async def test_deserialization_error_reaches_the_handler_with_task_topic_partition_offset(
        cluster: Cluster, names) -> None:
    source, sink = await topics(cluster, names, partitions=1)
    producer = cluster.transport.producer(ProducerSettings("bad-bytes-producer"))
    await producer.start()
    producer.append(source, 0, INT.serialize(1), JSON.serialize({"n": 1}), None, ())
    producer.append(source, 0, INT.serialize(2), b"{not json", None, ())
    await producer.flush()
    await producer.close()
    handler = Handler(Response.SHUTDOWN_CLIENT)
    streams = handler.install(app(cluster, names, source, sink, Poison()))
    await streams.start_async()
    try:
        await wait_for_calls(handler, 1)
        error = handler.calls[0].exception
        assert isinstance(error, DeserializationError)
        assert error.task_id == TaskId(0, 0)
        assert (error.topic, error.partition, error.offset) == (source, 0, 1)
        assert handler.calls[0].thread_name == thread_name(streams, 1)
    finally:
        await close(streams)


async def test_invalid_partition_from_a_partitioner_reaches_the_handler(cluster: Cluster, names) -> None:
    source, sink = await topics(cluster, names, partitions=1)
    handler = Handler(Response.SHUTDOWN_CLIENT)
    topology = poison_topology(source, sink, Poison(), partitioner=lambda _t, _k, _v, count: count + 3)
    streams = handler.install(make_streams(topology, cluster.bootstrap, names.app))
    await produce(cluster, source, good(1))
    await streams.start_async()
    try:
        await wait_for_calls(handler, 1)
        error = handler.calls[0].exception
        assert isinstance(error, ProduceError)
        assert (error.topic, error.partition) == (sink, 4)
        assert await streams.wait_for_state_async(ClientState.ERROR, timeout=DEADLINE)
    finally:
        await close(streams)


async def test_sink_topic_deleted_while_running_reaches_the_handler(cluster: Cluster, names) -> None:
    source, sink = await topics(cluster, names, partitions=1)
    handler = Handler(Response.SHUTDOWN_CLIENT)
    # A short request timeout: on Kafka the produce to a deleted topic fails when its batch expires.
    # That failure (unknown topic, or no leader) is retriable, as in Kafka Streams: it reaches the
    # handler once task.timeout.ms has run out.
    streams = handler.install(app(cluster, names, source, sink, Poison(), request_timeout_ms=3_000,
                                  task_timeout_ms=3_000))
    await produce(cluster, source, good(1))
    await start(streams)
    try:
        await wait_for_output(cluster, sink, {1}, "the first record's output")
        admin = cluster.transport.admin("test-admin")
        await admin.start()
        try:
            await admin.delete_topics([sink])
        finally:
            await admin.close()
        await produce(cluster, source, good(2))
        await wait_for_calls(handler, 1)
        error = handler.calls[0].exception
        # Kafka: retried under task.timeout.ms, then TaskTimeoutError from the ProduceError.
        # memory://: the topic is gone at once, a ProduceError that no retry can fix.
        chain: list[BaseException] = []
        cause: BaseException | None = error
        while cause is not None:
            chain.append(cause)
            cause = cause.__cause__
        if cluster.bootstrap.startswith("memory://"):
            assert isinstance(error, ProduceError)
        else:
            assert isinstance(error, TaskTimeoutError)
        produce_errors = [c for c in chain if isinstance(c, ProduceError)]
        assert produce_errors and produce_errors[0].topic == sink, chain
        assert await streams.wait_for_state_async(ClientState.ERROR, timeout=DEADLINE)
    finally:
        await close(streams)


async def test_consumer_error_reaches_the_handler(cluster: Cluster, names) -> None:
    """auto.offset.reset=none and no committed offset: the consumer's poll fails."""
    source, sink = await topics(cluster, names)
    handler = Handler(Response.SHUTDOWN_CLIENT)
    streams = handler.install(app(cluster, names, source, sink, Poison(), auto_offset_reset="none"))
    await produce(cluster, source, good(1))
    await streams.start_async()
    try:
        await wait_for_calls(handler, 1)
        assert isinstance(handler.calls[0].exception, TransportError)
        assert handler.calls[0].thread_name == thread_name(streams, 1)
        assert await streams.wait_for_state_async(ClientState.ERROR, timeout=DEADLINE)
    finally:
        await close(streams)


# -- REPLACE_THREAD ---------------------------------------------------------------------------


async def test_replacement_takes_a_new_name_by_the_index_rule_and_counts_the_failure(
        cluster: Cluster, names) -> None:
    """The dying thread still holds its index, so the replacement of thread 1 is thread 2;
    once 1 is DEAD, the replacement of 2 takes index 1 again (KS shouldResizeCacheAfterThreadReplacement)."""
    source, sink = await topics(cluster, names)
    handler = Handler(Response.REPLACE_THREAD)
    streams = handler.install(app(cluster, names, source, sink, Poison()))
    await start(streams)
    try:
        assert thread_names(streams) == [thread_name(streams, 1)]
        await produce(cluster, source, bad(1))
        await wait_for_calls(handler, 1)
        await eventually_async(lambda: settled(streams, [thread_name(streams, 2)]), DEADLINE,
                               "thread 2 replaces thread 1")
        assert handler.calls[0].thread_name == thread_name(streams, 1)
        assert streams.metric("failed-stream-threads") == 1
        await produce(cluster, source, bad(2))
        await wait_for_calls(handler, 2)
        await eventually_async(lambda: settled(streams, [thread_name(streams, 1)]), DEADLINE,
                               "thread 1 (free again) replaces thread 2")
        assert handler.calls[1].thread_name == thread_name(streams, 2)
        assert streams.metric("failed-stream-threads") == 2
    finally:
        await close(streams)


async def test_replacement_reprocesses_the_failed_record(cluster: Cluster, names) -> None:
    """KS shouldEmitSameRecordAfterFailover: no loss, no skip."""
    source, sink = await topics(cluster, names)
    poison = Poison()
    handler = Handler(Response.REPLACE_THREAD)
    streams = handler.install(app(cluster, names, source, sink, poison))
    records = good(*range(10)) + bad(10) + good(*range(11, 20))
    await produce(cluster, source, records)
    await start(streams)
    try:
        output = await wait_for_output(cluster, sink, set(range(20)), "every record in the output")
        assert len(handler.calls) == 1
        assert poison.count(10) == 2  # failed once, then processed by the replacement
        # In order, none skipped (at-least-once may repeat what the dead thread had not committed).
        assert sorted(set(output)) == list(range(20))
        assert output[-10:] == list(range(10, 20))
    finally:
        await close(streams)


@pytest.mark.parametrize("bootstrap", EVERY_BROKER, indirect=True)
async def test_threads_failing_in_turn_are_each_replaced_and_the_output_is_complete(
        cluster: Cluster, names) -> None:
    """KS shouldReplaceThreads: every thread fails once; the replacements finish the work."""
    source, sink = await topics(cluster, names, partitions=2)
    poison = Poison()
    handler = Handler(Response.REPLACE_THREAD)
    streams = handler.install(app(cluster, names, source, sink, poison, num_stream_threads=2))
    await start(streams)
    try:
        # One poison value per partition (key = partition), so each original thread meets one.
        await produce(cluster, source, good(0, 1) + bad(2) + bad(3) + good(4, 5), partitions=2)
        await wait_for_output(cluster, sink, set(range(6)), "every record in the output")
        await wait_for_calls(handler, 2)
        assert {c.thread_name for c in handler.calls} == {thread_name(streams, 1), thread_name(streams, 2)}
        # Which indices the replacements get depends on whether the first failed thread is DEAD yet.
        await eventually_async(lambda: settled(streams, thread_names(streams)) and len(thread_names(streams)) == 2,
                               DEADLINE, "two threads running again")
        assert streams.metric("failed-stream-threads") == 2
        assert poison.count(2) >= 2 and poison.count(3) >= 2  # each failed once, then went through
    finally:
        await close(streams)


async def test_record_that_always_fails_is_replaced_with_a_growing_back_off(
        cluster: Cluster, names, caplog: pytest.LogCaptureFixture) -> None:
    """A poison record under REPLACE_THREAD must not spin: the first replacement is at once,
    then retry.backoff.ms (100 ms) doubling each time, and each wait is logged."""
    caplog.set_level(logging.WARNING, logger="streamloop.threads.supervisor")
    source, sink = await topics(cluster, names)
    poison = Poison(times=None)
    handler = Handler(Response.REPLACE_THREAD)
    streams = handler.install(app(cluster, names, source, sink, poison))
    await produce(cluster, source, bad(1))
    await streams.start_async()
    try:
        await wait_for_calls(handler, 6)
        # Waits of 0, 0.1, 0.2, 0.4 and 0.8 s lie between the first and the sixth failure.
        assert handler.calls[5].at - handler.calls[0].at >= 1.5
        waits = [r.getMessage() for r in caplog.records if "Threads keep failing" in r.getMessage()]
        assert any("replacing this one in 0.1 s" in m for m in waits)
        assert any("replacing this one in 0.8 s" in m for m in waits)
        assert streams.metric("failed-stream-threads") >= 6
        assert len(streams.metadata_for_local_threads()) <= 2  # the dying thread and its replacement
    finally:
        await close(streams)


# -- SHUTDOWN_THREAD --------------------------------------------------------------------------


async def test_shutdown_thread_stops_only_that_thread_and_the_client_keeps_running(
        cluster: Cluster, names) -> None:
    source, sink = await topics(cluster, names, partitions=2)
    poison = Poison()
    handler = Handler(Response.SHUTDOWN_THREAD)
    streams = handler.install(app(cluster, names, source, sink, poison, num_stream_threads=2))
    await start(streams)
    try:
        await produce(cluster, source, good(0) + bad(1) + good(2, 3), partitions=2)
        await wait_for_calls(handler, 1)
        survivor = ({thread_name(streams, 1), thread_name(streams, 2)} - {handler.calls[0].thread_name}).pop()
        await eventually_async(lambda: settled(streams, [survivor]), DEADLINE, "only the other thread left")
        assert streams.metric("failed-stream-threads") == 1
        # The survivor takes over the failed record's task and processes it.
        await wait_for_output(cluster, sink, {0, 1, 2, 3}, "every record in the output")
        assert streams.state is ClientState.RUNNING
    finally:
        await close(streams)


async def test_shutdown_thread_of_the_last_live_thread_puts_the_client_in_error(
        cluster: Cluster, names) -> None:
    source, sink = await topics(cluster, names, partitions=2)
    handler = Handler(Response.SHUTDOWN_THREAD)
    streams = handler.install(app(cluster, names, source, sink, Poison(), num_stream_threads=2))
    await start(streams)
    try:
        await produce(cluster, source, bad(1), partitions=2)
        await wait_for_calls(handler, 1)
        survivor = ({thread_name(streams, 1), thread_name(streams, 2)} - {handler.calls[0].thread_name}).pop()
        await eventually_async(lambda: settled(streams, [survivor]), DEADLINE, "only the other thread left")
        await produce(cluster, source, bad(2), partitions=2)
        assert await streams.wait_for_state_async(ClientState.ERROR, timeout=DEADLINE)
        assert handler.calls[1].thread_name == survivor
        assert streams.metadata_for_local_threads() == []
        assert streams.metric("failed-stream-threads") == 2
    finally:
        await close(streams)


# -- SHUTDOWN_CLIENT and the default ----------------------------------------------------------


def record_states(streams: KafkaStreams) -> list[ClientState]:
    states: list[ClientState] = []
    streams.set_state_listener(lambda new, _old: states.append(new))
    return states


async def test_shutdown_client_stops_every_thread_and_ends_in_error(cluster: Cluster, names) -> None:
    """KS shouldShutdownClient."""
    source, sink = await topics(cluster, names, partitions=2)
    poison = Poison()
    handler = Handler(Response.SHUTDOWN_CLIENT)
    streams = handler.install(app(cluster, names, source, sink, poison, num_stream_threads=2))
    states = record_states(streams)
    await start(streams)
    try:
        await produce(cluster, source, bad(1), partitions=2)
        assert await streams.wait_for_state_async(ClientState.ERROR, timeout=DEADLINE)
        assert states[-2:] == [ClientState.PENDING_ERROR, ClientState.ERROR]
        assert streams.metadata_for_local_threads() == []
        assert streams.metric("alive-stream-threads") == 0
        assert streams.metric("failed-stream-threads") == 1
        assert len(handler.calls) == 1
    finally:
        started = time.monotonic()
        assert await streams.close_async(timeout=DEADLINE)
        assert time.monotonic() - started < 5
    assert streams.state is ClientState.ERROR


async def test_without_a_handler_the_client_shuts_down_and_the_error_is_logged(
        cluster: Cluster, names, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    source, sink = await topics(cluster, names, partitions=2)
    streams = app(cluster, names, source, sink, Poison(), num_stream_threads=2)
    states = record_states(streams)
    await start(streams)
    try:
        await produce(cluster, source, bad(1), partitions=2)
        assert await streams.wait_for_state_async(ClientState.ERROR, timeout=DEADLINE)
        assert states[-2:] == [ClientState.PENDING_ERROR, ClientState.ERROR]
        assert streams.metadata_for_local_threads() == []
        logged = [r for r in caplog.records if r.exc_info and isinstance(r.exc_info[1], ProcessingError)]
        assert logged, "the thread's exception is logged"
        message = logged[0].getMessage()
        assert "StreamThread-" in message and "Task 0_1" in message
    finally:
        await close(streams)


async def test_handler_that_raises_counts_as_shutdown_client_and_both_exceptions_are_logged(
        cluster: Cluster, names, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    source, sink = await topics(cluster, names)

    def broken(exc: BaseException) -> Response:
        raise LookupError("the handler itself is broken")

    streams = app(cluster, names, source, sink, Poison())
    streams.set_uncaught_exception_handler(broken)
    await start(streams)
    try:
        await produce(cluster, source, bad(1))
        assert await streams.wait_for_state_async(ClientState.ERROR, timeout=DEADLINE)
        assert streams.metadata_for_local_threads() == []
        text = "\n".join(r.getMessage() for r in caplog.records)
        assert "the handler itself is broken" in text
        assert "poison value 1" in text
        assert any(r.exc_info and isinstance(r.exc_info[1], LookupError) for r in caplog.records)
    finally:
        await close(streams)


async def test_handler_can_only_be_set_before_start(cluster: Cluster, names) -> None:
    """KS shouldThrowExceptionSettingStreamsUncaughtExceptionHandlerNotInCreateState (and …IfNull)."""
    source, sink = await topics(cluster, names)
    streams = app(cluster, names, source, sink, Poison())
    with pytest.raises(TypeError):
        streams.set_uncaught_exception_handler(None)  # type: ignore[arg-type]
    await start(streams)
    try:
        with pytest.raises(IllegalStateError, match="CREATED"):
            streams.set_uncaught_exception_handler(lambda exc: Response.REPLACE_THREAD)
    finally:
        await close(streams)
    with pytest.raises(IllegalStateError, match="CREATED"):
        streams.set_uncaught_exception_handler(lambda exc: Response.REPLACE_THREAD)


# -- SHUTDOWN_APPLICATION ---------------------------------------------------------------------


@pytest.mark.parametrize("bootstrap", EVERY_BROKER, indirect=True)
async def test_shutdown_application_stops_every_client_of_the_application(cluster: Cluster, names) -> None:
    """KS shouldShutdownSingleThreadApplication: two clients (here in one process) both reach ERROR,
    and nothing after the failed record is processed."""
    source, sink = await topics(cluster, names, partitions=2)
    poison = Poison(times=None)
    first, second = Handler(Response.SHUTDOWN_APPLICATION), Handler(Response.SHUTDOWN_APPLICATION)
    clients = [first.install(app(cluster, names, source, sink, poison)),
               second.install(app(cluster, names, source, sink, poison))]
    for streams in clients:
        await streams.start_async()
    try:
        await eventually_async(
            lambda: all(s.state is ClientState.RUNNING and len(local_tasks(s)) == 1 for s in clients),
            DEADLINE, "both clients RUNNING with one task each")
        await produce(cluster, source, good(0, 1), partitions=2)
        await wait_for_output(cluster, sink, {0, 1}, "the good records' output")
        # 4 follows the poison value 2 in partition 0.
        await produce(cluster, source, bad(2) + good(4), partitions=2)
        for streams in clients:
            assert await streams.wait_for_state_async(ClientState.ERROR, timeout=DEADLINE)
            assert streams.metadata_for_local_threads() == []
        assert first.calls or second.calls
        assert 4 not in poison.seen
        assert set(await output_values(cluster, sink)) == {0, 1}  # at-least-once: 0 or 1 may repeat
    finally:
        for streams in clients:
            await close(streams)


def wait_in_handler(condition: Callable[[], bool], timeout: float = 6.0) -> None:
    """A handler that takes its time (e.g. to report the error): it stops waiting early only if
    ``condition`` turns true, which a correct engine never lets happen while the handler runs."""
    with contextlib.suppress(TimeoutError):
        eventually(condition, timeout, "the failed record processed elsewhere")


async def test_failing_thread_still_owns_its_tasks_while_the_handler_runs(cluster: Cluster, names) -> None:
    source, sink = await topics(cluster, names, partitions=2)
    owned: list[set[str]] = []

    def look(streams: KafkaStreams) -> None:
        me = threading.current_thread().name
        owned.extend({str(task.task_id) for task in t.active_tasks}
                     for t in streams.metadata_for_local_threads() if t.thread_name == me)

    handler = Handler(Response.SHUTDOWN_CLIENT, then=look)
    streams = handler.install(app(cluster, names, source, sink, Poison(), num_stream_threads=2))
    await start(streams)
    try:
        await produce(cluster, source, bad(1), partitions=2)
        await wait_for_calls(handler, 1)
        assert owned and "0_1" in owned[0]
    finally:
        await close(streams)


async def test_sibling_thread_does_not_process_the_failed_record_before_shutdown_client(
        cluster: Cluster, names) -> None:
    source, sink = await topics(cluster, names, partitions=2)
    poison = Poison()  # fails once: a sibling that takes the record over gets through it
    handler = Handler(Response.SHUTDOWN_CLIENT, then=lambda _s: wait_in_handler(lambda: poison.count(1) >= 2))
    streams = handler.install(app(cluster, names, source, sink, poison, num_stream_threads=2))
    await start(streams)
    try:
        await produce(cluster, source, bad(1), partitions=2)
        assert await streams.wait_for_state_async(ClientState.ERROR, timeout=DEADLINE)
        assert poison.count(1) == 1
    finally:
        await close(streams)


async def test_siblings_are_asked_to_stop_before_the_failed_thread_leaves_the_group(
        cluster: Cluster, names, monkeypatch: pytest.MonkeyPatch) -> None:
    """SHUTDOWN_CLIENT: the failed thread leaves the group right after its handler. A sibling not
    yet asked to stop then took its task over in that rebalance and processed the failed record
    again (seen once in make test). Here the close's own thread waits until every thread was asked
    to stop some other way, or until the failed record was processed again, to make that certain."""
    from streamloop.threads.client_threads import ClientThreads

    shut_down_all = ClientThreads.shut_down_all
    poison = Poison()
    stopping = (StreamThreadState.PENDING_SHUTDOWN, StreamThreadState.DEAD)

    def late(self: ClientThreads, leave_group: bool, limit: float | None) -> None:
        with contextlib.suppress(TimeoutError):
            eventually(lambda: poison.count(1) >= 2 or all(t.state.state in stopping for t in self.snapshot()),
                       DEADLINE, "every thread asked to stop, or the failed record processed again")
        shut_down_all(self, leave_group, limit)

    monkeypatch.setattr(ClientThreads, "shut_down_all", late)
    source, sink = await topics(cluster, names, partitions=2)
    handler = Handler(Response.SHUTDOWN_CLIENT)
    streams = handler.install(app(cluster, names, source, sink, poison, num_stream_threads=2))
    await start(streams)
    try:
        await produce(cluster, source, bad(1), partitions=2)
        assert await streams.wait_for_state_async(ClientState.ERROR, timeout=DEADLINE)
        assert poison.count(1) == 1
    finally:
        await close(streams)


async def test_other_client_does_not_process_the_failed_record_before_shutdown_application(
        cluster: Cluster, names) -> None:
    """KS shouldShutdownSingleThreadApplication: the failed record is processed once in all."""
    source, sink = await topics(cluster, names, partitions=2)
    poison = Poison(times=None)
    handlers = [Handler(Response.SHUTDOWN_APPLICATION, then=lambda _s: wait_in_handler(lambda: poison.count(2) >= 2))
                for _ in range(2)]
    clients = [h.install(app(cluster, names, source, sink, poison)) for h in handlers]
    for streams in clients:
        await streams.start_async()
    try:
        await eventually_async(
            lambda: all(s.state is ClientState.RUNNING and len(local_tasks(s)) == 1 for s in clients),
            DEADLINE, "both clients RUNNING with one task each")
        await produce(cluster, source, bad(2), partitions=2)
        for streams in clients:
            assert await streams.wait_for_state_async(ClientState.ERROR, timeout=DEADLINE)
        assert poison.count(2) == 1
    finally:
        for streams in clients:
            await close(streams)


@pytest.mark.kafka
async def test_shutdown_application_stops_clients_in_other_processes(kafka_bootstrap: str, names) -> None:
    """Two clients in two OS processes: the request travels through the group protocol only."""
    from streamloop.transport import open_transport

    cluster = Cluster(open_transport({"bootstrap.servers": kafka_bootstrap}), kafka_bootstrap)
    source, sink = await topics(cluster, names, partitions=2)
    processes = [AppProcess(kafka_bootstrap, names.app, source, sink) for _ in range(2)]
    try:
        await eventually_async(lambda: all(p.state == "RUNNING" and p.tasks == 1 for p in processes),
                               DEADLINE, "both processes RUNNING with one task each")
        await produce(cluster, source, good(0, 1), partitions=2)
        await wait_for_output(cluster, sink, {0, 1}, "the good records' output")
        await produce(cluster, source, bad(2) + good(4), partitions=2)
        finals = [await asyncio.to_thread(p.wait, DEADLINE) for p in processes]
        assert finals == ["ERROR", "ERROR"], [p.lines for p in processes]
        seen = {n for p in processes for n in p.processed}
        # Only what came before the poison record (4 follows it in partition 0) got through.
        assert seen == {0, 1, 2}
        assert set(await output_values(cluster, sink)) == {0, 1}  # at-least-once: 0 or 1 may repeat
    finally:
        for p in processes:
            p.close()


class AppProcess:
    """``tests.support.app_process`` in its own interpreter; reads its JSON event lines."""

    def __init__(self, bootstrap: str, app_id: str, source: str, sink: str) -> None:
        self.state = "CREATED"
        self.tasks = 0
        self.processed: list[int] = []
        self.final: str | None = None
        self.lines: list[str] = []
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.app_process", "--bootstrap", bootstrap, "--application-id",
             app_id, "--source", source, "--sink", sink, "--response", "SHUTDOWN_APPLICATION"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self.lines.append(line)
            event = json.loads(line)
            if event["event"] == "state":
                self.state = event["state"]
            elif event["event"] == "tasks":
                self.tasks = event["count"]
            elif event["event"] == "processed":
                self.processed.append(event["n"])
            elif event["event"] == "final":
                self.final = event["state"]

    def wait(self, timeout: float) -> str | None:
        self._proc.wait(timeout)
        self._reader.join(timeout)
        return self.final

    def close(self) -> None:
        """Kill it if it still runs; release its pipe."""
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._reader.join(10)
        assert self._proc.stdout is not None
        self._proc.stdout.close()


# -- what does not reach the handler ----------------------------------------------------------


async def test_keyboard_interrupt_in_a_processor_does_not_reach_the_handler(cluster: Cluster, names) -> None:
    source, sink = await topics(cluster, names)
    handler = Handler(Response.REPLACE_THREAD)
    poison = Poison(exc=lambda n: KeyboardInterrupt(f"poison value {n}"))
    # A KeyboardInterrupt breaks out of the thread's event loop; its clients close as the loop is torn down.
    streams = handler.install(app(cluster, names, source, sink, poison, request_timeout_ms=3_000))
    await start(streams)
    try:
        await produce(cluster, source, bad(1))
        await eventually_async(lambda: streams.metadata_for_local_threads() == [], DEADLINE,
                               "the interrupted thread is gone")
        assert handler.calls == []
    finally:
        await close(streams)


def waiting_topology(source: str, sink: str, entered: list[int]) -> Topology:
    """Every record's processor waits for ever (an I/O call that never returns)."""

    async def wait_forever(value: dict[str, Any]) -> dict[str, Any]:
        entered.append(value["n"])
        await asyncio.Event().wait()
        return value

    builder = StreamsBuilder()
    builder.stream(source, key_serde=INT, value_serde=JSON).map_values(wait_forever).to(
        sink, key_serde=INT, value_serde=JSON)
    return builder.build()


async def test_cancelling_the_code_that_runs_the_client_does_not_reach_the_handler(
        cluster: Cluster, names) -> None:
    source, sink = await topics(cluster, names)
    entered: list[int] = []
    handler = Handler(Response.REPLACE_THREAD)
    # The waiting record is given up after request.timeout.ms when its task closes.
    streams = handler.install(make_streams(waiting_topology(source, sink, entered), cluster.bootstrap,
                                           names.app, request_timeout_ms=2_000))

    async def run_until_cancelled() -> None:
        async with streams:
            await asyncio.Event().wait()

    runner = asyncio.create_task(run_until_cancelled())
    try:
        await produce(cluster, source, good(1))
        await eventually_async(lambda: entered, DEADLINE, "the processor is waiting")
    finally:
        runner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await runner
    assert streams.state is ClientState.NOT_RUNNING
    assert handler.calls == []
    assert streams.metric("failed-stream-threads") == 0


async def test_removing_a_thread_whose_processor_waits_does_not_reach_the_handler(
        cluster: Cluster, names) -> None:
    source, sink = await topics(cluster, names, partitions=2)
    entered: list[int] = []
    handler = Handler(Response.REPLACE_THREAD)
    streams = handler.install(make_streams(waiting_topology(source, sink, entered), cluster.bootstrap,
                                           names.app, num_stream_threads=2, request_timeout_ms=2_000))
    await start(streams)
    try:
        await produce(cluster, source, good(0, 1), partitions=2)
        await eventually_async(lambda: len(entered) >= 2, DEADLINE, "both threads' processors waiting")
        removed = await streams.remove_stream_thread_async(timeout=DEADLINE)
        assert removed in (thread_name(streams, 1), thread_name(streams, 2))
        assert handler.calls == []
        assert streams.metric("failed-stream-threads") == 0
        assert thread_names(streams) == sorted({thread_name(streams, 1), thread_name(streams, 2)} - {removed})
    finally:
        await close(streams)


# -- a handler that calls back into the client ------------------------------------------------


async def test_handler_that_adds_a_thread_does_not_deadlock(cluster: Cluster, names) -> None:
    source, sink = await topics(cluster, names)
    added: list[str | None] = []
    handler = Handler(Response.SHUTDOWN_THREAD, then=lambda streams: added.append(streams.add_stream_thread()))
    streams = handler.install(app(cluster, names, source, sink, Poison()))
    await start(streams)
    try:
        await produce(cluster, source, bad(1) + good(2))
        await wait_for_calls(handler, 1)
        assert added == [thread_name(streams, 2)]
        await eventually_async(lambda: settled(streams, [thread_name(streams, 2)]), DEADLINE,
                               "the added thread runs alone")
        await wait_for_output(cluster, sink, {1, 2}, "the added thread processes the records")
    finally:
        await close(streams)


async def test_handler_that_closes_the_client_does_not_deadlock(cluster: Cluster, names) -> None:
    source, sink = await topics(cluster, names)
    closed: list[bool] = []
    handler = Handler(Response.SHUTDOWN_CLIENT, then=lambda streams: closed.append(streams.close()))
    streams = handler.install(app(cluster, names, source, sink, Poison()))
    await start(streams)
    try:
        await produce(cluster, source, bad(1))
        await wait_for_calls(handler, 1)
        assert closed == [False]  # from inside a stream thread it only starts the shutdown
        assert await streams.wait_for_state_async(ClientState.NOT_RUNNING, ClientState.ERROR, timeout=DEADLINE)
    finally:
        await close(streams)

