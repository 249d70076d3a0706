"""What an operator reads at INFO: start-up and each rebalance in a few short lines.

The lines are formatted as ``streamloop run`` formats them (``streamloop.cli.LOG_FORMAT``), with
the thread name, the logger and the message, so their length is the length on the terminal.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterator

import pytest

from streamloop import ClientState, KafkaStreams, StreamsBuilder
from streamloop.cli import LOG_FORMAT, configure_logging
from streamloop.testing import eventually
from streamloop.transport.memory import MemoryBroker
from tests.support.apps import streams_config

WAIT = 15.0
# Start-up of a 2-thread client: its state changes, "Starting 2 stream threads", and one
# "Assigned tasks" line per thread per rebalance (the second thread's join rebalances the first).
MAX_START_UP_INFO_LINES = 10
MAX_LINE_LENGTH = 160


class Lines(logging.Handler):
    """Every record at INFO or above, formatted as the runner formats it."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter(LOG_FORMAT))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))

    def take(self) -> list[str]:
        taken, self.lines = self.lines, []
        return taken


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler = Lines()
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


@pytest.fixture
def two_threads() -> Iterator[KafkaStreams]:
    name = f"logs-{uuid.uuid4().hex[:8]}"
    MemoryBroker.for_url(f"memory://{name}").create_topics({"in": 4, "out": 4})
    builder = StreamsBuilder()
    builder.stream("in").to("out")
    streams = KafkaStreams(builder.build(), streams_config(f"memory://{name}", "orders", num_stream_threads=2))
    try:
        yield streams
    finally:
        streams.close(timeout=WAIT)
        MemoryBroker.reset(name)


def every_thread_has_tasks(streams: KafkaStreams, count: int) -> bool:
    threads = streams.metadata_for_local_threads()
    return len(threads) == count and all(t.active_tasks for t in threads)


def test_start_up_of_two_threads_takes_a_few_short_info_lines(two_threads: KafkaStreams, lines: Lines) -> None:
    two_threads.start()
    assert two_threads.wait_for_state(ClientState.RUNNING, timeout=WAIT)
    eventually(lambda: every_thread_has_tasks(two_threads, 2), timeout=WAIT, what="both threads have tasks")

    start_up = lines.take()
    assert len(start_up) <= MAX_START_UP_INFO_LINES, "\n".join(start_up)
    assert [line for line in start_up if len(line) > MAX_LINE_LENGTH] == []
    assert sum("Assigned tasks" in line for line in start_up) >= 2
    assert any("State transition from REBALANCING to RUNNING" in line for line in start_up)


def test_a_rebalance_takes_one_info_line_per_thread(two_threads: KafkaStreams, lines: Lines) -> None:
    two_threads.start()
    assert two_threads.wait_for_state(ClientState.RUNNING, timeout=WAIT)
    eventually(lambda: every_thread_has_tasks(two_threads, 2), timeout=WAIT, what="both threads have tasks")
    lines.take()

    assert two_threads.add_stream_thread() is not None
    eventually(lambda: every_thread_has_tasks(two_threads, 3), timeout=WAIT, what="three threads have tasks")
    assert two_threads.wait_for_state(ClientState.RUNNING, timeout=WAIT)

    rebalance = lines.take()
    assigned = [line for line in rebalance if "Assigned tasks" in line]
    # One line for each thread whose tasks changed: the one that handed a task over and the new
    # one. The thread whose tasks stayed (a cooperative rebalance leaves them running) logs at DEBUG.
    assert len(assigned) == 2, "\n".join(rebalance)
    others = [line for line in rebalance if line not in assigned]
    # "Adding <thread>", and the client's REBALANCING and RUNNING, once for each of the two
    # rebalances of a cooperative hand-over (the second gives the new thread its tasks).
    assert len(others) <= 5, "\n".join(others)


def test_the_generated_client_id_is_the_application_id_and_six_hex_digits(two_threads: KafkaStreams) -> None:
    assert re.fullmatch(r"orders-[0-9a-f]{6}", two_threads.client_id)



@pytest.mark.parametrize(("level", "aiokafka_level"), [("INFO", logging.WARNING), ("warning", logging.WARNING),
                                                       ("DEBUG", logging.NOTSET)])
def test_the_runner_shows_aiokafkas_rebalance_chatter_only_at_debug(level: str, aiokafka_level: int) -> None:
    """aiokafka logs some 7 INFO lines per consumer per rebalance (joining, syncing, partitions)."""
    aiokafka = logging.getLogger("aiokafka")
    assert aiokafka.level == logging.NOTSET
    try:
        configure_logging(level)
        assert aiokafka.level == aiokafka_level
    finally:
        aiokafka.setLevel(logging.NOTSET)
