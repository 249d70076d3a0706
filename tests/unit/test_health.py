"""``KafkaStreams.health``: liveness and readiness, each reason on a ``memory://`` broker.

Not live: a stream thread dead and not replaced, a task stuck in a record past task.timeout.ms.
Not ready: not RUNNING, a task restoring its stores, a task lagging more than the bound.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from streamloop import ClientState, HealthResult, KafkaStreams, StreamsBuilder, TopicPartition, Topology
from streamloop.handlers import StreamThreadExceptionResponse
from streamloop.serdes import StringSerde
from streamloop.state import Materialized
from streamloop.testing import eventually
from streamloop.transport.memory import MemoryBroker
from streamloop.transport.memory.log import ProducedRecord
from tests.support.apps import streams_config

WAIT = 15.0


class Broker:
    def __init__(self) -> None:
        self.name = f"health-{uuid.uuid4().hex[:10]}"
        self.url = f"memory://{self.name}"
        self.broker = MemoryBroker.for_url(self.url)
        self.broker.create_topics({"in": 2, "out": 2})
        self.made: list[KafkaStreams] = []

    def streams(self, topology: Topology, **overrides: Any) -> KafkaStreams:
        streams = KafkaStreams(topology, streams_config(self.url, f"app-{self.name}", **overrides))
        self.made.append(streams)
        return streams

    def produce(self, partition: int, *values: bytes, key: bytes | None = None) -> None:
        records = [ProducedRecord(key, v, 0, ()) for v in values]
        assert not self.broker.produce({TopicPartition("in", partition): records})


@pytest.fixture
def broker() -> Iterator[Broker]:
    made = Broker()
    yield made
    for streams in made.made:
        if streams.state not in (ClientState.NOT_RUNNING, ClientState.ERROR):
            streams.close(timeout=WAIT)
    MemoryBroker.reset(made.name)


def piping(step: Any = None) -> Topology:
    builder = StreamsBuilder()
    stream = builder.stream("in")
    if step is not None:
        stream = stream.peek(step)
    stream.to("out")
    return builder.build()


def running(streams: KafkaStreams) -> None:
    assert streams.wait_for_state(ClientState.RUNNING, timeout=WAIT), streams.state.name


def test_a_running_client_is_live_and_ready(broker: Broker) -> None:
    streams = broker.streams(piping())
    assert streams.health.live() == HealthResult(True, {"state": "CREATED"})
    assert not streams.health.ready()
    streams.start()
    running(streams)
    eventually(lambda: streams.health.ready(max_lag=0).ok, WAIT, "every task measured with no lag")
    assert streams.health.live() == HealthResult(True, {"state": "RUNNING"})
    assert streams.health.ready() == HealthResult(True, {"state": "RUNNING"})
    streams.close(timeout=WAIT)
    assert streams.health.live() == HealthResult(False, {"state": "NOT_RUNNING"})
    assert streams.health.ready() == HealthResult(False, {"state": "NOT_RUNNING"})


def test_a_thread_that_died_and_was_not_replaced_makes_the_client_not_live(broker: Broker) -> None:
    failed = threading.Event()

    def fail(_key: Any, value: Any) -> None:
        if value == b"poison" and not failed.is_set():  # once: the other thread takes the task over
            failed.set()
            raise RuntimeError("poison record")

    streams = broker.streams(piping(fail), num_stream_threads=2)
    streams.set_uncaught_exception_handler(lambda _exc: StreamThreadExceptionResponse.SHUTDOWN_THREAD)
    streams.start()
    running(streams)
    broker.produce(0, b"poison")
    eventually(lambda: not streams.health.live().ok, WAIT, "a dead thread reported")
    reason = streams.health.live().reason
    [dead] = reason["dead_threads"]
    assert dead["error"].startswith("ProcessingError: ") and "RuntimeError: poison record" in dead["error"]
    assert dead["thread"].endswith(("StreamThread-1", "StreamThread-2"))
    running(streams)  # the other thread runs on, with every task
    assert streams.health.live().reason["state"] == "RUNNING"


def test_a_thread_being_replaced_keeps_the_client_live(broker: Broker) -> None:
    failed = threading.Event()

    def fail(_key: Any, value: Any) -> None:
        if value == b"poison" and not failed.is_set():
            failed.set()
            raise RuntimeError("poison record")

    streams = broker.streams(piping(fail))
    streams.set_uncaught_exception_handler(lambda _exc: StreamThreadExceptionResponse.REPLACE_THREAD)
    streams.start()
    running(streams)
    broker.produce(0, b"poison")
    assert failed.wait(WAIT)
    eventually(lambda: streams.metric("failed-stream-threads") == 1, WAIT, "the thread failed")
    running(streams)
    assert streams.health.live() == HealthResult(True, {"state": "RUNNING"})


def test_a_task_stuck_in_one_record_past_task_timeout_makes_the_client_not_live(broker: Broker) -> None:
    release, entered = threading.Event(), threading.Event()

    def block(_key: Any, value: Any) -> None:
        if value == b"block":
            entered.set()
            release.wait(WAIT)  # blocks the stream thread's loop, as a hung call would

    streams = broker.streams(piping(block), task_timeout_ms=300)
    streams.start()
    running(streams)
    try:
        broker.produce(1, b"block", b"after")
        assert entered.wait(WAIT)
        assert streams.health.live().ok  # seen once: not yet stuck for task.timeout.ms
        eventually(lambda: not streams.health.live().ok, WAIT, "the stuck task reported")
        [stuck] = streams.health.live().reason["stuck_tasks"]
        assert stuck["task"] == "0_1" and stuck["stuck_ms"] > 300 and stuck["task_timeout_ms"] == 300
    finally:
        release.set()
    eventually(lambda: streams.health.live().ok, WAIT, "live again once the record finished")


class BlockingRestore:
    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()

    def on_restore_start(self, partition: TopicPartition, store: str, start_offset: int, end_offset: int) -> None:
        self.entered.set()
        self.release.wait(WAIT)

    def on_batch_restored(self, partition: TopicPartition, store: str, batch_end_offset: int,
                          num_restored: int) -> None:
        pass

    def on_restore_end(self, partition: TopicPartition, store: str, total_restored: int) -> None:
        pass


def counting() -> Topology:
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=StringSerde(), value_serde=StringSerde())
            .group_by_key(key_serde=StringSerde())
            .count(materialized=Materialized("counts", persistent=False)))
    return builder.build()


def test_a_task_restoring_its_store_makes_the_client_not_ready(broker: Broker, tmp_path: Any) -> None:
    first = broker.streams(counting(), state_dir=str(tmp_path))
    first.start()
    running(first)
    broker.produce(0, b"x", key=b"a")
    eventually(lambda: first.store("counts").get("a") == 1, WAIT, "counted")
    first.close(timeout=WAIT)

    # The in-memory store starts empty: its changelog is read back before the task runs.
    restore = BlockingRestore()
    second = broker.streams(counting(), state_dir=str(tmp_path))
    second.set_global_state_restore_listener(restore)
    second.start()
    try:
        assert restore.entered.wait(WAIT)
        eventually(lambda: "restoring_tasks" in second.health.ready().reason, WAIT, "restoring reported")
        assert "0_0" in second.health.ready().reason["restoring_tasks"]
        assert not second.health.ready().ok
        assert second.health.live().ok  # restoring is not a reason to restart
    finally:
        restore.release.set()
    eventually(lambda: second.health.ready().ok, WAIT, "ready once restored")


def test_a_task_lagging_past_the_bound_makes_the_client_not_ready(broker: Broker) -> None:
    # The first record cannot be read: the handler pauses its task there, and what follows waits.
    builder = StreamsBuilder()
    builder.stream("in", value_serde=StringSerde()).to("out", value_serde=StringSerde())
    streams = broker.streams(builder.build(),
                             default_deserialization_exception_handler="streamloop.handlers.LogAndPauseExceptionHandler")
    streams.start()
    running(streams)
    broker.produce(0, b"\xff not utf-8", *[b"ok"] * 9)
    eventually(lambda: streams.health.ready(max_lag=5).reason.get("lagging_tasks") == {"0_0": 10}, WAIT,
               "the paused task's lag reported")
    assert streams.health.ready(max_lag=5) == HealthResult(
        False, {"state": "RUNNING", "lagging_tasks": {"0_0": 10}, "max_lag": 5})
    assert streams.health.ready(max_lag=10).ok
    assert streams.health.ready().ok  # no bound: lag does not count
    assert streams.health.live().ok  # a paused task is not stuck


def test_a_negative_lag_bound_is_an_error_naming_it(broker: Broker) -> None:
    with pytest.raises(ValueError, match="max_lag"):
        broker.streams(piping()).health.ready(max_lag=-1)


