"""The runner's progress line: what it says, and that it is printed only on a terminal."""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator

import pytest

from streamloop import ClientState, KafkaStreams, StreamsBuilder
from streamloop.console.progress import ProgressSample, format_progress, progress_enabled, sample
from streamloop.testing import create_topics, eventually, produce
from streamloop.transport.memory import MemoryBroker
from tests.support.apps import streams_config


def at(seconds: float, polled: float, processed: float, lag: float | None = 0.0, state: str = "RUNNING",
       threads: int = 2, tasks: int = 4) -> ProgressSample:
    return ProgressSample(seconds, state, polled, processed, lag, threads, tasks)


def test_the_line_has_state_rates_since_the_last_line_lag_threads_and_tasks() -> None:
    line = format_progress(at(10.0, 1_000, 900), at(12.0, 3_500, 3_400, lag=1_234))

    assert line == "RUNNING  in 1,250/s  processed 1,250/s  lag 1,234  threads 2  tasks 4"


def test_a_lag_not_measured_yet_is_a_dash() -> None:
    assert "lag -" in format_progress(at(0.0, 0, 0), at(5.0, 0, 0, lag=None, state="REBALANCING"))


def test_a_total_that_falls_when_a_thread_leaves_gives_no_negative_rate() -> None:
    assert "processed 0/s" in format_progress(at(0.0, 500, 500), at(5.0, 600, 200))


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("stream", "requested", "enabled"), [
    (Terminal(), None, True),
    (io.StringIO(), None, False),
    (Terminal(), False, False),
    (io.StringIO(), True, True),
])
def test_the_line_is_on_for_a_terminal_unless_asked_otherwise(stream: io.StringIO, requested: bool | None,
                                                              enabled: bool) -> None:
    assert progress_enabled(stream, requested) is enabled


@pytest.fixture
def streams() -> Iterator[KafkaStreams]:
    name = f"progress-{uuid.uuid4().hex[:8]}"
    create_topics(f"memory://{name}", {"in": 2, "out": 2})
    builder = StreamsBuilder()
    builder.stream("in").to("out")
    client = KafkaStreams(builder.build(), streams_config(f"memory://{name}", "progress", num_stream_threads=2))
    client.start()
    yield client
    client.close(timeout=15)
    MemoryBroker.reset(name)


def test_a_sample_adds_up_the_threads_totals_of_a_running_client(streams: KafkaStreams) -> None:
    assert streams.wait_for_state(ClientState.RUNNING, timeout=15)
    produce(streams.config["bootstrap.servers"], "in", [(f"k{i}".encode(), b"v") for i in range(50)])

    done = eventually(lambda: (s := sample(streams, 0.0)).processed == 50 and s.lag == 0 and s, timeout=15,
                      what="50 records processed")

    assert (done.state, done.polled, done.threads, done.tasks) == ("RUNNING", 50, 2, 2)
