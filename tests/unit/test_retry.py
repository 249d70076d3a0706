"""RETRY, a processing handler's answer (issue #35): the record runs again after a back-off, its
store updates apply once, nothing commits past it, and once its attempts run out
``processing.retry.exhausted.answer`` applies. Deterministic, on the test driver (virtual time)."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from typing import Any

import pytest

from streamloop import StreamsBuilder, TaskId, Topology
from streamloop.config import StreamsConfig
from streamloop.errors import ConfigError, HandlerError, ProcessingError
from streamloop.handlers import Answer, ErrorContext
from streamloop.serdes import LongSerde, StringSerde
from streamloop.state import Materialized
from streamloop.tasks.retries import JITTER, exponential_backoff_ms
from streamloop.testing import TopologyTestDriver

STR = StringSerde()


class Retrying:
    """Answers RETRY about every failure, and remembers what it was asked (offset, attempt)."""

    def __init__(self, answer: Answer = Answer.RETRY) -> None:
        self.answer = answer
        self.asked: list[tuple[int | None, int]] = []

    def configure(self, config: Any) -> None:
        """Nothing to configure."""

    def handle(self, context: ErrorContext, record: Any, exception: BaseException) -> Answer:
        self.asked.append((context.offset, context.attempt))
        return self.answer


class Flaky:
    """Fails the first ``failures[value]`` times it sees ``value``; counts every call."""

    def __init__(self, failures: dict[str, int]) -> None:
        self.left = dict(failures)
        self.calls: Counter[str] = Counter()

    def __call__(self, value: str) -> str:
        self.calls[value] += 1
        if self.left.get(value, 0) > 0:
            self.left[value] -= 1
            raise RuntimeError(f"service unavailable for {value}")
        return value.upper()


def flaky_after_a_store(flaky: Flaky) -> Topology:
    """A count per key (a store update) and then, in the same task, the flaky call: a failure comes
    after the record's store update, which a retry must not apply twice."""
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=STR)
            .map_values(flaky, name="flaky")
            .group_by_key(key_serde=STR)
            .count(materialized=Materialized("counts"))
            .to_stream()
            .map_values(lambda n: f"{n}", name="after")
            .to("out", key_serde=STR, value_serde=STR))
    return builder.build()


def counted_then_flaky(flaky: Flaky) -> Topology:
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=STR)
            .group_by_key(key_serde=STR)
            .count(materialized=Materialized("counts"))
            .to_stream()
            .map_values(lambda n: str(n), name="as-text")
            .map_values(flaky, name="flaky")
            .to("out", key_serde=STR, value_serde=STR))
    return builder.build()


def config(handler: Any, **settings: Any) -> dict[str, Any]:
    # No record cache: the count's update goes downstream with its record, not at a cache flush.
    return {"processing.exception.handler": handler, "processing.retry.backoff.ms": 100,
            "cache.max.bytes.buffering": 0, **{k.replace("_", "."): v for k, v in settings.items()}}


def test_a_retried_record_runs_again_and_its_store_update_applies_once() -> None:
    flaky = Flaky({"2": 2})  # the count's output for the key's second record fails twice
    handler = Retrying()
    with TopologyTestDriver(counted_then_flaky(flaky), config(handler)) as driver:
        source = driver.create_input_topic("in", STR, STR)
        out = driver.create_output_topic("out", STR, STR)
        for value in ("x", "y", "z"):
            source.pipe_input("k", value)
        # Three attempts of the second record; the count saw it once.
        assert out.read_key_values() == [("k", "1"), ("k", "2"), ("k", "3")]
        assert driver.get_key_value_store("counts").get("k") == 3
        assert handler.asked == [(1, 1), (1, 2)]
        assert flaky.calls["2"] == 3
        metrics = driver.task_metrics("0_0")
        assert metrics["record-retries-total"] == 2
        assert metrics["record-retries-exhausted-total"] == 0
        assert driver.committed("in") in (None, 3)


def test_the_back_off_doubles_with_jitter_up_to_its_maximum() -> None:
    """Kafka's ExponentialBackoff (matches ExponentialBackoffTest.testExponentialBackoff)."""
    low, high = (lambda a, b: a), (lambda a, b: b)
    assert [exponential_backoff_ms(100, 1_000, n) for n in range(1, 6)] == [100, 200, 400, 800, 1_000]
    assert exponential_backoff_ms(100, 10_000, 3, JITTER, low) == 320
    assert exponential_backoff_ms(100, 10_000, 3, JITTER, high) == 480
    assert exponential_backoff_ms(100, 300, 3, JITTER, high) == 300  # the cap holds with jitter too


def test_the_record_waits_out_its_back_off_before_it_runs_again() -> None:
    seen: list[int] = []
    flaky = Flaky({"a": 3})

    class Timing(Retrying):
        def handle(self, context: ErrorContext, record: Any, exception: BaseException) -> Answer:
            seen.append(round(asyncio.get_running_loop().time() * 1000))  # the driver's virtual time
            return super().handle(context, record, exception)

    settings = config(Timing(), processing_retry_backoff_max_ms=250)
    with TopologyTestDriver(flaky_after_a_store(flaky), settings) as driver:
        driver.create_input_topic("in", STR, STR).pipe_input("k", "a")
        gaps = [b - a for a, b in itertools.pairwise(seen)]
        # 100 then 200 (± 20 %), then capped at 250: each attempt waited for its back-off.
        assert 80 <= gaps[0] <= 121 and 160 <= gaps[1] <= 241, gaps
        assert driver.create_output_topic("out", STR, STR).read_values() == ["1"]


@pytest.mark.parametrize(("exhausted", "output", "dead_letters"), [
    ("continue", [("k", "1"), ("k", "2")], 1),
    ("pause", [("k", "1")], 1),
])
def test_once_the_attempts_run_out_the_exhausted_answer_applies(exhausted: str, output: list[Any],
                                                                dead_letters: int) -> None:
    flaky = Flaky({"b": 99})
    handler = Retrying()
    settings = config(handler, processing_retry_max_attempts=3, processing_retry_exhausted_answer=exhausted,
                      errors_dead_letter_queue_topic_name="dlq")
    with TopologyTestDriver(flaky_after_a_store(flaky), settings) as driver:
        source = driver.create_input_topic("in", STR, STR)
        for value in ("a", "b", "c"):
            source.pipe_input("k", value)
        assert handler.asked == [(1, 1), (1, 2), (1, 3)]
        assert flaky.calls["b"] == 3
        assert driver.create_output_topic("out", STR, STR).read_key_values() == output
        # One dead letter for the record, not one per attempt.
        assert len(driver.create_output_topic("dlq").read_records()) == dead_letters
        metrics = driver.task_metrics("0_0")
        assert (metrics["record-retries-total"], metrics["record-retries-exhausted-total"]) == (2, 1)
        if exhausted == "pause":
            assert driver.paused_tasks() == {TaskId(0, 0)}
            assert driver.committed("in") == 1  # the paused record: not committed past
        else:
            assert driver.get_key_value_store("counts").get("k") == 2


def test_exhausted_retries_fail_by_default_naming_the_setting() -> None:
    flaky = Flaky({"a": 99})
    settings = config(Retrying(), processing_retry_max_attempts=2)
    with TopologyTestDriver(flaky_after_a_store(flaky), settings) as driver, \
            pytest.raises(ProcessingError, match=r"processing.retry.exhausted.answer is 'fail'.*attempt 2"):
        driver.create_input_topic("in", STR, STR).pipe_input("k", "a")
    assert flaky.calls["a"] == 2


def test_a_handler_may_answer_otherwise_on_a_later_attempt() -> None:
    class RetryOnce(Retrying):
        def handle(self, context: ErrorContext, record: Any, exception: BaseException) -> Answer:
            super().handle(context, record, exception)
            return Answer.RETRY if context.attempt == 1 else Answer.CONTINUE

    flaky = Flaky({"a": 99})
    handler = RetryOnce()
    with TopologyTestDriver(flaky_after_a_store(flaky), config(handler)) as driver:
        source = driver.create_input_topic("in", STR, STR)
        source.pipe_input("k", "a")
        source.pipe_input("k", "b")
        assert handler.asked == [(0, 1), (0, 2)]
        assert driver.create_output_topic("out", STR, STR).read_values() == ["1"]
        assert driver.task_metrics("0_0")["record-retries-exhausted-total"] == 0


def test_one_record_at_a_time_the_task_waits_and_output_keeps_offset_order() -> None:
    flaky = Flaky({"a1": 2})
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=STR)
            .map_values(flaky, name="flaky")
            .to("out", key_serde=STR, value_serde=STR))
    with TopologyTestDriver(builder.build(), config(Retrying())) as driver:
        driver.create_input_topic("in", STR, STR).pipe_records([("A", "a1"), ("B", "b1"), ("A", "a2")])
        assert driver.create_output_topic("out", STR, STR).read_values() == ["A1", "B1", "A2"]


def test_a_deserialization_handler_may_not_answer_retry() -> None:
    settings = {"default.deserialization.exception.handler": Retrying()}
    builder = StreamsBuilder()
    builder.stream("in", key_serde=STR, value_serde=LongSerde()).to("out", key_serde=STR, value_serde=LongSerde())
    with TopologyTestDriver(builder.build(), settings) as driver, \
            pytest.raises(HandlerError, match="only a processing exception handler may answer"):
        driver.pipe_raw("in", b"k", b"not a long")


@pytest.mark.parametrize(("settings", "match"), [
    ({"processing.retry.backoff.ms": 500, "processing.retry.backoff.max.ms": 100},
     r"processing.retry.backoff.max.ms.*must be >= processing.retry.backoff.ms \(500\)"),
    ({"processing.retry.max.attempts": 0}, "processing.retry.max.attempts.*must be >= 1"),
    ({"processing.retry.exhausted.answer": "retry"}, "processing.retry.exhausted.answer.*must be one of"),
])
def test_retry_settings_are_checked(settings: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        StreamsConfig({"application.id": "a", "bootstrap.servers": "memory://x", **settings})
