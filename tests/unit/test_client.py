"""``KafkaStreams``, the client: construction, its state machine, threads, and blocking behaviour.

Every test runs on its own ``memory://`` broker (a unique name, forgotten at
teardown); every client a test makes is closed at teardown. Waiting is on the
client's state or on a condition, always with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from streamloop import (
    BaseProcessor,
    ClientState,
    ConfigError,
    IllegalStateError,
    KafkaStreams,
    MissingSourceTopicError,
    Record,
    StreamsBuilder,
    StreamThreadState,
    TopicPartition,
    Topology,
    TopologyError,
)
from streamloop.client import CLIENT_TRANSITIONS
from streamloop.testing import eventually
from streamloop.transport.memory import MemoryBroker
from streamloop.transport.memory.log import ProducedRecord
from tests.support.apps import streams_config

C = ClientState
WAIT = 15.0


def topology() -> Topology:
    builder = StreamsBuilder()
    builder.stream("in").to("out")
    return builder.build()


class Clients:
    """A fresh memory broker with topics ``in`` and ``out`` (2 partitions), and the clients made on it."""

    def __init__(self) -> None:
        self.name = f"client-{uuid.uuid4().hex[:10]}"
        self.url = f"memory://{self.name}"
        self.broker = MemoryBroker.for_url(self.url)
        self.broker.create_topics({"in": 2, "out": 2})
        self.made: list[KafkaStreams] = []

    def config(self, **overrides: Any) -> dict[str, Any]:
        return streams_config(self.url, f"app-{self.name}", **overrides)

    def __call__(self, topology_: Topology | None = None, **overrides: Any) -> KafkaStreams:
        streams = KafkaStreams(topology_ or topology(), self.config(**overrides))
        self.made.append(streams)
        return streams

    def produce(self, topic: str, partition: int, *values: bytes) -> None:
        records = [ProducedRecord(None, v, 0, ()) for v in values]
        failed = self.broker.produce({TopicPartition(topic, partition): records})
        assert not failed

    def close_all(self) -> None:
        for streams in self.made:
            if streams.state not in (C.NOT_RUNNING, C.ERROR):
                streams.close(timeout=WAIT)
        MemoryBroker.reset(self.name)


@pytest.fixture
def clients() -> Iterator[Clients]:
    made = Clients()
    yield made
    made.close_all()


def record_transitions(streams: KafkaStreams) -> list[tuple[ClientState, ClientState]]:
    """Every ``(new, old)`` pair the client's state listener is called with."""
    seen: list[tuple[ClientState, ClientState]] = []
    streams.set_state_listener(lambda new, old: seen.append((new, old)))
    return seen


def running(streams: KafkaStreams) -> None:
    assert streams.wait_for_state(C.RUNNING, timeout=WAIT), f"client is {streams.state.name}, not RUNNING"


# -- construction -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [("num.stream.threads", -1), ("commit.interval.ms", "soon"), ("auto.offset.reset", "middle"),
     ("buffered.records.per.partition", True)],
)
def test_wrong_config_value_raises_config_error_naming_the_key(clients: Clients, key: str, value: Any) -> None:
    config = {**clients.config(), key: value}

    with pytest.raises(ConfigError, match=f"'{key}'") as info:
        KafkaStreams(topology(), config)

    assert info.value.key == key


def test_missing_application_id_raises_config_error_naming_it(clients: Clients) -> None:
    config = clients.config()
    del config["application.id"]

    with pytest.raises(ConfigError) as info:
        KafkaStreams(topology(), config)

    assert info.value.key == "application.id"


def test_unknown_config_key_is_a_config_error_naming_it(clients: Clients) -> None:
    with pytest.raises(ConfigError, match=r"Unknown config 'made.up.key'") as info:
        clients(made_up_key="x")

    assert info.value.key == "made.up.key"


def test_unknown_config_key_only_warns_when_asked(clients: Clients, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="streamloop.config"):
        streams = clients(made_up_key="x", config_unknown_keys="warn")

    assert streams.state is C.CREATED
    assert "Unknown config 'made.up.key' is ignored" in caplog.text


def test_something_other_than_a_topology_raises_type_error(clients: Clients) -> None:
    with pytest.raises(TypeError, match="needs a Topology"):
        KafkaStreams(StreamsBuilder(), clients.config())  # type: ignore[arg-type]


def test_an_empty_topology_raises_topology_error_at_construction(clients: Clients) -> None:
    with pytest.raises(TopologyError, match="empty"):
        KafkaStreams(Topology(), clients.config())


def test_a_new_client_is_created(clients: Clients) -> None:
    streams = clients()

    assert streams.state is C.CREATED
    assert streams.metadata_for_local_threads() == []


# -- start and close ------------------------------------------------------------------------------------


def test_start_twice_raises_illegal_state_error(clients: Clients) -> None:
    streams = clients()
    streams.start()

    with pytest.raises(IllegalStateError, match="only allowed in state CREATED"):
        streams.start()


def test_start_with_a_missing_source_topic_raises_and_leaves_the_client_created(clients: Clients) -> None:
    builder = StreamsBuilder()
    builder.stream("absent").to("out")
    streams = clients(builder.build())

    with pytest.raises(MissingSourceTopicError, match="absent"):
        streams.start()

    assert streams.state is C.CREATED


def test_close_of_a_created_client_goes_to_not_running_at_once(clients: Clients) -> None:
    streams = clients()
    seen = record_transitions(streams)

    assert streams.close() is True

    assert streams.state is C.NOT_RUNNING
    assert seen == [(C.PENDING_SHUTDOWN, C.CREATED), (C.NOT_RUNNING, C.PENDING_SHUTDOWN)]


def test_a_closed_client_cannot_start(clients: Clients) -> None:
    streams = clients()
    streams.close()

    with pytest.raises(IllegalStateError):
        streams.start()


def test_state_listener_sees_created_rebalancing_running_pending_shutdown_not_running(clients: Clients) -> None:
    streams = clients()
    seen = record_transitions(streams)

    streams.start()
    running(streams)
    assert streams.close(timeout=WAIT)

    assert seen == [
        (C.REBALANCING, C.CREATED),
        (C.RUNNING, C.REBALANCING),
        (C.PENDING_SHUTDOWN, C.RUNNING),
        (C.NOT_RUNNING, C.PENDING_SHUTDOWN),
    ]


def test_every_transition_of_a_two_thread_client_is_allowed(clients: Clients) -> None:
    streams = clients(num_stream_threads=2)
    seen = record_transitions(streams)

    streams.start()
    running(streams)
    streams.close(timeout=WAIT)

    assert seen[0] == (C.REBALANCING, C.CREATED)
    assert seen[-1] == (C.NOT_RUNNING, C.PENDING_SHUTDOWN)
    assert all(new in CLIENT_TRANSITIONS[old] for new, old in seen), seen


def test_a_client_without_stream_threads_still_reaches_running(clients: Clients) -> None:
    streams = clients(num_stream_threads=0)

    streams.start()
    running(streams)

    assert streams.metadata_for_local_threads() == []
    assert streams.close(timeout=WAIT)
    assert streams.state is C.NOT_RUNNING


# -- threads and metrics -----------------------------------------------------------------------------------


def test_stream_threads_are_named_after_the_client_id(clients: Clients) -> None:
    streams = clients(num_stream_threads=2, client_id="orders-client")

    streams.start()
    running(streams)

    threads = sorted(streams.metadata_for_local_threads(), key=lambda t: t.thread_name)
    assert [t.thread_name for t in threads] == ["orders-client-StreamThread-1", "orders-client-StreamThread-2"]
    assert [t.consumer_client_id for t in threads] == [f"{t.thread_name}-consumer" for t in threads]
    assert all(t.thread_state is StreamThreadState.RUNNING for t in threads)


def test_local_thread_metadata_lists_the_active_tasks(clients: Clients) -> None:
    streams = clients(num_stream_threads=2)

    streams.start()
    running(streams)

    tasks = [task for t in streams.metadata_for_local_threads() for task in t.active_tasks]
    assert sorted(str(task.task_id) for task in tasks) == ["0_0", "0_1"]
    assert {tp for task in tasks for tp in task.topic_partitions} == {TopicPartition("in", 0), TopicPartition("in", 1)}


def test_metrics_count_the_alive_stream_threads(clients: Clients) -> None:
    streams = clients(num_stream_threads=2)
    streams.start()
    running(streams)

    assert streams.metric("alive-stream-threads") == 2.0
    names = {m.name for m in streams.metrics()}
    assert {"alive-stream-threads", "failed-stream-threads", "records-polled-total"} <= names

    streams.close(timeout=WAIT)
    assert streams.metric("alive-stream-threads") == 0.0


# -- never blocking, never deadlocking ------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_async_with_never_blocks_the_running_loop(clients: Clients) -> None:
    streams = clients()
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0)

    ticking = asyncio.get_running_loop().create_task(ticker())
    try:
        before_start = ticks
        async with streams:
            during_start = ticks - before_start
            assert await streams.wait_for_state_async(C.RUNNING, timeout=WAIT)
            before_close = ticks
        during_close = ticks - before_close
    finally:
        stop.set()
        await ticking

    assert during_start > 0 and during_close > 0
    assert streams.state is C.NOT_RUNNING


def test_close_called_from_a_processor_returns_and_the_client_reaches_not_running(clients: Clients) -> None:
    answers: list[bool] = []
    holder: list[KafkaStreams] = []

    class Closer(BaseProcessor):
        def process(self, record: Record) -> None:
            answers.append(holder[0].close())

    builder = StreamsBuilder()
    builder.stream("in").process(Closer, name="closer")
    streams = clients(builder.build())
    holder.append(streams)
    clients.produce("in", 0, b"stop")

    streams.start()

    assert streams.wait_for_state(C.NOT_RUNNING, timeout=WAIT), f"client is {streams.state.name}"
    assert answers == [False]  # from inside a stream thread close() only starts the shutdown


def test_close_from_another_thread_while_running_waits_for_not_running(clients: Clients) -> None:
    streams = clients()
    streams.start()
    running(streams)
    result: list[bool] = []

    closer = threading.Thread(target=lambda: result.append(streams.close(timeout=WAIT)))
    closer.start()
    closer.join(WAIT)

    assert result == [True]
    assert streams.state is C.NOT_RUNNING


def test_a_state_listener_that_raises_does_not_stop_the_client(clients: Clients) -> None:
    streams = clients()

    def listener(new: ClientState, old: ClientState) -> None:
        raise RuntimeError("listener bug")

    streams.set_state_listener(listener)
    streams.start()
    running(streams)

    assert streams.close(timeout=WAIT)
    assert streams.state is C.NOT_RUNNING


def test_close_from_a_state_listener_during_start_leaves_no_stream_thread_running(clients: Clients) -> None:
    streams = clients()
    answers: list[bool] = []

    def close_on_rebalancing(new: ClientState, old: ClientState) -> None:
        if new is C.REBALANCING:
            answers.append(streams.close(timeout=WAIT))

    streams.set_state_listener(close_on_rebalancing)
    try:
        with contextlib.suppress(IllegalStateError):  # refusing to start would be fine too
            streams.start()

        assert answers == [True]
        assert streams.state is C.NOT_RUNNING
        eventually(lambda: streams.metadata_for_local_threads() == [], timeout=2, what="no stream thread left")
    finally:
        # Only cleanup of the leaked threads: no public call reaches them once the client is closed.
        for thread in streams._threads.snapshot():
            thread.shutdown()
            thread.join(WAIT)


def test_a_failing_record_logs_its_traceback_once(clients: Clients, caplog: pytest.LogCaptureFixture) -> None:
    """The handler, the thread's failure report and the supervisor all speak of it; one of them shows the trace."""
    def poisoned(value: bytes) -> bytes:
        if value == b"poison":
            raise ValueError("poison")
        return value

    builder = StreamsBuilder()
    builder.stream("in").map_values(poisoned).to("out")
    streams = clients(builder.build())
    clients.produce("in", 0, b"ok", b"poison")

    with caplog.at_level(logging.DEBUG):
        streams.start()
        assert streams.wait_for_state(C.ERROR, timeout=WAIT), f"client is {streams.state.name}, not ERROR"

    def shows_the_poison(record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        while error is not None:
            if isinstance(error, ValueError) and str(error) == "poison":
                return True
            error = error.__cause__
        return False

    with_traceback = [r for r in caplog.records if shows_the_poison(r)]
    assert len(with_traceback) == 1, [r.getMessage() for r in with_traceback]
    assert "processing.exception.handler is" in with_traceback[0].getMessage()
