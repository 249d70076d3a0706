"""Exactly-once as a state machine on real Kafka: records, commits, thread crashes and thread
changes interleave; a ``read_committed`` reader must see each input's effect exactly once.

The topology counts per key without a cache, so every input is one output update:
per key the committed output must be exactly 1, 2, … n, and the final counts must
equal a pure model (a Counter of what was produced). Few, short examples: each
one starts a client against the session's broker.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter

import pytest
from anyio.from_thread import start_blocking_portal
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test

from streamloop import KafkaStreams, StreamsBuilder
from streamloop.handlers import StreamThreadExceptionResponse
from streamloop.serdes import LongSerde, StringSerde
from streamloop.state import Materialized
from streamloop.testing import eventually
from streamloop.transport import open_transport
from tests.integration.test_exactly_once import assert_counts_exactly_once, read_committed
from tests.support.apps import streams_config
from tests.support.cluster import Cluster

pytestmark = pytest.mark.kafka

STR, LONG = StringSerde(), LongSerde()
PARTITIONS = 2
KEYS = 4
MAX_THREADS = 3
MAX_CRASHES = 3
DEADLINE = 60.0


class PoisonOnce:
    """A value starting with ``poison`` makes the thread that sees it first die."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value.startswith("poison"):
            with self._lock:
                first = value not in self._seen
                self._seen.add(value)
            if first:
                raise RuntimeError(f"{value} kills the thread")
        return value


class ExactlyOnceMachine(RuleBasedStateMachine):
    bootstrap = ""

    def __init__(self) -> None:
        super().__init__()
        suffix = uuid.uuid4().hex[:8]
        self.source, self.sink = f"eos-prop-in-{suffix}", f"eos-prop-out-{suffix}"
        self.cluster = Cluster(open_transport({"bootstrap.servers": self.bootstrap}), self.bootstrap)
        self._portal_cm = start_blocking_portal()
        self.portal = self._portal_cm.__enter__()
        self.portal.call(self.cluster.create_topics, {self.source: PARTITIONS, self.sink: PARTITIONS})
        builder = StreamsBuilder()
        (builder.stream(self.source, key_serde=STR, value_serde=STR)
                .map_values(PoisonOnce())
                .group_by_key(key_serde=STR)
                .count(materialized=Materialized("counts", persistent=False))
                .to_stream()
                .to(self.sink, key_serde=STR, value_serde=LONG))
        self.streams = KafkaStreams(builder.build(), streams_config(
            self.bootstrap, f"eos-prop-{suffix}", processing_guarantee="exactly_once_v2",
            cache_max_bytes_buffering=0, num_stream_threads=1, retry_backoff_ms=10))
        self.streams.set_uncaught_exception_handler(lambda exc: StreamThreadExceptionResponse.REPLACE_THREAD)
        self.model: Counter[str] = Counter()
        self.sent = 0
        self.crashes = 0
        self.streams.start()

    def alive(self) -> int:
        return sum(1 for t in self.streams.metadata_for_local_threads() if t.thread_state.is_alive())

    def produce(self, values: list[str]) -> None:
        records = [(f"k{(self.sent + i) % KEYS}", v) for i, v in enumerate(values)]
        self.sent += len(values)
        self.model.update(k for k, _ in records)
        self.portal.call(lambda: self.cluster.produce(self.source, records, STR, STR, partitions=PARTITIONS))

    @rule(count=st.integers(1, 40))
    def produce_records(self, count: int) -> None:
        self.produce([f"v{self.sent + i}" for i in range(count)])

    @precondition(lambda self: self.crashes < MAX_CRASHES)
    @rule()
    def crash_a_thread(self) -> None:
        self.crashes += 1
        self.produce([f"poison{self.crashes}"])

    @precondition(lambda self: self.alive() < MAX_THREADS)
    @rule()
    def add_thread(self) -> None:
        assert self.streams.add_stream_thread() is not None

    @precondition(lambda self: self.alive() > 1)
    @rule()
    def remove_thread(self) -> None:
        self.streams.remove_stream_thread(timeout=DEADLINE)

    @rule()
    def wait_for_a_commit(self) -> None:
        """Everything produced so far becomes visible (committed) to a read_committed reader."""
        self.wait_until_counted()

    def wait_until_counted(self) -> None:
        def counted() -> bool:
            latest: dict[str, int] = {}
            for record in self.portal.call(read_committed, self.cluster, self.sink):
                latest[STR.deserialize(record.key)] = LONG.deserialize(record.value)
            return latest == dict(self.model)

        eventually(counted, DEADLINE, f"committed counts {dict(self.model)}")

    def teardown(self) -> None:
        try:
            if self.model:
                self.wait_until_counted()
                assert_counts_exactly_once(self.portal.call(read_committed, self.cluster, self.sink), self.model)
        finally:
            self.streams.close(timeout=DEADLINE)
            self._portal_cm.__exit__(None, None, None)


@pytest.mark.timeout(600)
def test_exactly_once_under_crashes_and_thread_changes(kafka_bootstrap: str) -> None:
    ExactlyOnceMachine.bootstrap = kafka_bootstrap
    run_state_machine_as_test(ExactlyOnceMachine, settings=settings(
        max_examples=2, stateful_step_count=6, deadline=None, derandomize=True))
