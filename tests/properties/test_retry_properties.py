"""RETRY against a pure-Python model of what it promises.

For random records, each failing a random number of times before it goes through, a random
``processing.retry.max.attempts``, a random exhausted answer (CONTINUE or PAUSE), with or without a
dead-letter topic, and crashes between records, the test driver's run agrees with the model on:

- the output, in offset order, and the counts in the store upstream of the failing call (each
  record's store update applies once however often it ran, a crash's restore included; a record
  dropped by CONTINUE keeps its update upstream of the failure, as without retries);
- what the handler was asked (offset and attempt, in order);
- the dead letters (one per exhausted record, none per retry);
- the task metrics ``record-retries-total`` and ``record-retries-exhausted-total``;
- where a PAUSE leaves the committed offset (at the record whose attempts ran out).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamloop import StreamsBuilder, TaskId
from streamloop.handlers import Answer, ErrorContext
from streamloop.serdes import JsonSerde, StringSerde
from streamloop.state import Materialized
from streamloop.testing import TopologyTestDriver

STR, JSON = StringSerde(), JsonSerde()


@dataclass
class Model:
    """What RETRY should do, one record at a time."""

    max_attempts: int
    exhausted: str
    dead_letters: bool
    counts: Counter[str] = field(default_factory=Counter)
    output: list[tuple[str, int]] = field(default_factory=list)
    asked: list[tuple[int, int]] = field(default_factory=list)
    letters: int = 0
    retries: int = 0
    exhausted_records: int = 0
    paused_at: int | None = None

    def record(self, offset: int, key: str, failures: int) -> None:
        if self.paused_at is not None:
            return
        runs = min(failures + 1, self.max_attempts)
        failed = min(failures, self.max_attempts)
        self.asked += [(offset, attempt) for attempt in range(1, failed + 1)]
        if failures < self.max_attempts:
            self.retries += failures
            self.counts[key] += 1
            self.output.append((key, self.counts[key]))
            return
        self.retries += runs - 1
        self.exhausted_records += 1
        self.letters += self.dead_letters
        if self.exhausted == "pause":
            self.paused_at = offset  # its last attempt's update is undone too: resume runs it again
        else:
            # CONTINUE drops the record from the failing processor on: the update upstream of it
            # stays, once (KIP-1033), however many attempts ran before.
            self.counts[key] += 1

    def crash(self) -> None:
        """The tasks start again from their last commit (every record: commit.interval.ms is 0),
        as new tasks: their metrics start from zero."""
        self.retries = self.exhausted_records = 0


class Handler:
    def __init__(self) -> None:
        self.asked: list[tuple[int, int]] = []

    def configure(self, config: Any) -> None:
        """Nothing to configure."""

    def handle(self, context: ErrorContext, record: Any, exception: BaseException) -> Answer:
        self.asked.append((context.offset, context.attempt))  # type: ignore[arg-type]  # a source record
        return Answer.RETRY


def topology(left: dict[int, int]) -> Any:
    """A count per key, then a call that fails ``left[record]`` more times for each record."""

    def call(value: dict[str, int]) -> int:
        n = value["record"]
        if left.get(n, 0) > 0:
            left[n] -= 1
            raise RuntimeError(f"service down for record {n}")
        return value["count"]

    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=JSON)
            .group_by_key(key_serde=STR)
            .aggregate(lambda: {"record": -1, "count": 0},
                       lambda _key, value, agg: {"record": value["record"], "count": agg["count"] + 1},
                       materialized=Materialized("counts", value_serde=JSON))
            .to_stream()
            .map_values(call, name="call-service")
            .to("out", key_serde=STR, value_serde=JSON))
    return builder.build()


steps = st.lists(st.one_of(st.tuples(st.sampled_from("abc"), st.integers(0, 5)), st.just("crash")),
                 min_size=1, max_size=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=steps, max_attempts=st.integers(1, 4), exhausted=st.sampled_from(["continue", "pause"]),
       dead_letters=st.booleans(), threads=st.sampled_from([1, 2]))
def test_retry_matches_the_model(steps: list[Any], max_attempts: int, exhausted: str, dead_letters: bool,
                                 threads: int) -> None:
    model = Model(max_attempts, exhausted, dead_letters)
    handler = Handler()
    left: dict[int, int] = {}
    config: dict[str, Any] = {
        "processing.exception.handler": handler, "processing.retry.backoff.ms": 10,
        "processing.retry.backoff.max.ms": 40, "processing.retry.max.attempts": max_attempts,
        "processing.retry.exhausted.answer": exhausted, "cache.max.bytes.buffering": 0,
        "commit.interval.ms": 0, "num.threads.per.task": threads}
    if dead_letters:
        config["errors.dead.letter.queue.topic.name"] = "dlq"
    with TopologyTestDriver(topology(left), config) as driver:
        source = driver.create_input_topic("in", STR, JSON)
        out = driver.create_output_topic("out", STR, JSON)
        offset = 0
        for step in steps:
            if step == "crash":
                if model.paused_at is None:
                    driver.crash()
                    model.crash()
                continue
            if model.paused_at is not None:
                break
            key, failures = step
            left[offset] = failures
            source.pipe_input(key, {"record": offset})
            model.record(offset, key, failures)
            offset += 1
        assert out.read_key_values() == model.output
        assert handler.asked == model.asked
        store = driver.get_key_value_store("counts")
        assert {k: store.get(k)["count"] for k in model.counts} == dict(model.counts)
        letters = driver.create_output_topic("dlq").read_records() if dead_letters else []
        assert len(letters) == model.letters
        metrics = driver.task_metrics("0_0")
        assert metrics["record-retries-total"] == model.retries
        assert metrics["record-retries-exhausted-total"] == model.exhausted_records
        if model.paused_at is not None:
            assert driver.paused_tasks() == {TaskId(0, 0)}
            assert driver.committed("in") == model.paused_at
