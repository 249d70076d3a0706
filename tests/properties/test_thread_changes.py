"""KIP-663 as a state machine: threads are added, removed and crash while records flow.

After every step: thread names are unique and follow the lowest-free-index rule,
metadata lists no DEAD thread, every alive thread's cache is ``total // alive``,
``failed-stream-threads`` equals the crashes so far. At the end: every record
produced is in the output, and each key's output is its input in order, where a
repeat can only replay a contiguous run (at-least-once).
"""

from __future__ import annotations

import itertools
import re
import threading
import uuid
from typing import Any

from anyio.from_thread import start_blocking_portal
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from streamloop import KafkaStreams, StreamsBuilder, StreamThreadState
from streamloop.handlers import StreamThreadExceptionResponse
from streamloop.serdes import IntegerSerde, JsonSerde
from streamloop.testing import eventually
from streamloop.transport import open_transport
from tests.support.apps import streams_config
from tests.support.cluster import Cluster
from tests.support.examples import examples

INT, JSON = IntegerSerde(), JsonSerde()
Response = StreamThreadExceptionResponse

PARTITIONS = 4
KEYS = 8
TOTAL_CACHE = 1000  # not divisible by 3: the shares are total // alive
MAX_THREADS = 4
MAX_CRASHES = 4  # replacements back off exponentially after the first
DEADLINE = 20.0
CLIENT_ID = "prop"
NAME = re.compile(rf"^{CLIENT_ID}-StreamThread-(\d+)$")


class PoisonOnce:
    """Relays records; a record marked ``poison`` raises the first time any thread sees it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: set[int] = set()

    def __call__(self, value: dict) -> dict:
        if value.get("poison"):
            with self._lock:
                first = value["seq"] not in self._seen
                self._seen.add(value["seq"])
            if first:
                raise RuntimeError(f"poison record {value['seq']}")
        return value


def lowest_free(indices: set[int]) -> int:
    index = 1
    while index in indices:
        index += 1
    return index


class ThreadChanges(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.bootstrap = f"memory://thread-changes-{uuid.uuid4().hex[:8]}"
        self.cluster = Cluster(open_transport({"bootstrap.servers": self.bootstrap}), self.bootstrap)
        self._portal_cm = start_blocking_portal()
        self.portal = self._portal_cm.__enter__()
        self.portal.call(self.cluster.create_topics, {"in": PARTITIONS, "out": PARTITIONS})
        builder = StreamsBuilder()
        (builder.stream("in", key_serde=INT, value_serde=JSON)
                .map_values(PoisonOnce())
                .to("out", key_serde=INT, value_serde=JSON))
        self.streams = KafkaStreams(builder.build(), streams_config(
            self.bootstrap, "thread-changes", client_id=CLIENT_ID, num_stream_threads=1,
            cache_max_bytes_buffering=TOTAL_CACHE, retry_backoff_ms=10))
        self.answer = Response.REPLACE_THREAD  # what the handler says to the next crash
        self.streams.set_uncaught_exception_handler(lambda exc: self.answer)
        self.sent = 0
        self.crashes = 0
        self.streams.start()
        self.quiesce()

    # -- helpers --------------------------------------------------------------------------
    def alive(self) -> dict[int, str]:
        return {int(NAME.match(t.thread_name).group(1)): t.thread_name  # type: ignore[union-attr]
                for t in self.streams.metadata_for_local_threads() if t.thread_state.is_alive()}

    def quiesce(self) -> None:
        """Wait until no thread is on its way out, so the index rule is deterministic."""
        eventually(lambda: all(t.thread_state.is_alive() for t in self.streams.metadata_for_local_threads()),
                   DEADLINE, "no thread shutting down")

    def produce(self, values: list[dict[str, Any]]) -> None:
        records = [(v["seq"] % KEYS, v) for v in values]
        self.portal.call(lambda: self.cluster.produce("in", records, INT, JSON, partitions=PARTITIONS))

    def next_values(self, count: int, **extra: Any) -> list[dict[str, Any]]:
        values = [{"seq": self.sent + i, **extra} for i in range(count)]
        self.sent += count
        return values

    # -- rules ----------------------------------------------------------------------------
    @precondition(lambda self: len(self.alive()) < MAX_THREADS)
    @rule()
    def add_thread(self) -> None:
        before = set(self.alive())
        name = self.streams.add_stream_thread()
        assert name == f"{CLIENT_ID}-StreamThread-{lowest_free(before)}"

    @rule()
    def remove_thread(self) -> None:
        before = set(self.alive().values())
        event(f"remove with {len(before)} alive")
        name = self.streams.remove_stream_thread(timeout=DEADLINE)
        if not before:
            assert name is None
        else:
            assert name in before
            assert name not in {t.thread_name for t in self.streams.metadata_for_local_threads()}

    @rule(count=st.integers(1, 30))
    def produce_records(self, count: int) -> None:
        self.produce(self.next_values(count))

    @precondition(lambda self: self.alive() and self.crashes < MAX_CRASHES)
    @rule()
    def crash_and_replace(self) -> None:
        before = set(self.alive())
        self.crash(Response.REPLACE_THREAD)
        after = set(self.alive())
        assert len(after) == len(before)
        (replacement,) = after - before
        # The dying thread still held its index when its handler added the replacement.
        assert replacement == lowest_free(before)

    @precondition(lambda self: len(self.alive()) >= 2 and self.crashes < MAX_CRASHES)
    @rule()
    def crash_and_shut_the_thread_down(self) -> None:
        before = set(self.alive())
        self.crash(Response.SHUTDOWN_THREAD)
        after = set(self.alive())
        assert len(after) == len(before) - 1 and after < before

    def crash(self, answer: Response) -> None:
        event(f"crash answered {answer.name}")
        self.answer = answer
        self.produce(self.next_values(1, poison=True))
        self.crashes += 1
        eventually(lambda: self.streams.metric("failed-stream-threads") == self.crashes, DEADLINE,
                   "the crash counted")
        self.quiesce()

    # -- after every step -----------------------------------------------------------------
    @invariant()
    def threads_are_consistent(self) -> None:
        self.quiesce()
        meta = self.streams.metadata_for_local_threads()
        names = [t.thread_name for t in meta]
        assert len(set(names)) == len(names), names
        assert all(NAME.match(name) for name in names), names
        assert all(t.thread_state is not StreamThreadState.DEAD for t in meta)
        if meta:
            assert {t.cache_size_bytes for t in meta} == {TOTAL_CACHE // len(meta)}, \
                [(t.thread_name, t.cache_size_bytes) for t in meta]
        assert self.streams.metric("alive-stream-threads") == len(meta)
        assert self.streams.metric("failed-stream-threads") == self.crashes

    def teardown(self) -> None:
        try:
            if not self.alive():
                assert self.streams.add_stream_thread() is not None  # someone has to process the rest
            expected = set(range(self.sent))
            output: list[Any] = []

            def everything_out() -> bool:
                output[:] = self.portal.call(self.cluster.read_all, "out")
                return expected <= {JSON.deserialize(r.value)["seq"] for r in output}

            eventually(everything_out, DEADLINE, "every record in the output", interval=0.05)
            by_key: dict[int, list[int]] = {}
            for record in sorted(output, key=lambda r: (r.partition, r.offset)):
                seq = JSON.deserialize(record.value)["seq"]
                by_key.setdefault(seq % KEYS, []).append(seq)
            for key, seqs in by_key.items():
                inputs = sorted(s for s in expected if s % KEYS == key)
                assert list(dict.fromkeys(seqs)) == inputs, f"key {key}: lost or reordered"
                position = {s: i for i, s in enumerate(inputs)}
                for previous, current in itertools.pairwise(seqs):
                    # The key's next record, or a jump back to replay from an earlier commit.
                    step = position[current] - position[previous]
                    assert step == 1 or step <= 0, f"key {key}: {previous} then {current}"
        finally:
            self.streams.close(timeout=DEADLINE)
            self._portal_cm.__exit__(None, None, None)


ThreadChanges.TestCase.settings = settings(
    max_examples=examples(20), stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_thread_changes = ThreadChanges.TestCase
