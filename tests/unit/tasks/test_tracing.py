"""Tracing (``tracing.enabled``, streamloop.tasks.tracing) through the test driver, which builds its tasks
as a client does: a span per record per task, the W3C ``traceparent`` read from each input record
and written to its output, through a repartition and a count; and with tracing off, OpenTelemetry
is never imported."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from streamloop import Materialized, StreamsBuilder
from streamloop.errors import ConfigError
from streamloop.processors.api import BaseProcessor
from streamloop.records import Record
from streamloop.serdes import LongSerde, StringSerde
from streamloop.testing import TopologyTestDriver

ROOT = Path(__file__).resolve().parents[3]
STR = StringSerde()
TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
PARENT_SPAN = 0xB7AD6B7169203331
TRACEPARENT = f"00-{TRACE_ID:032x}-{PARENT_SPAN:016x}-01".encode()


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def traced(provider: TracerProvider, **settings: Any) -> dict[str, Any]:
    return {"application.id": "traced", "tracing.enabled": True, "tracing.tracer.provider": provider,
            **{key.replace("_", "."): value for key, value in settings.items()}}


def traceparent(headers: Any) -> tuple[int, int]:
    """(trace id, span id) of the one traceparent header of ``headers``."""
    found = [value for name, value in headers if name == "traceparent"]
    assert len(found) == 1, headers
    _version, trace_id, span_id, _flags = found[0].decode().split("-")
    return int(trace_id, 16), int(span_id, 16)


def of_topic(exporter: InMemorySpanExporter, topic: str) -> list[ReadableSpan]:
    """The spans of ``topic``'s records, in offset order."""
    return sorted((s for s in exporter.get_finished_spans() if s.name == f"process {topic}"),
                  key=lambda s: s.attributes["messaging.kafka.offset"])


def test_a_record_span_is_the_child_of_its_traceparent_and_its_output_carries_the_span(spans) -> None:
    provider, exporter = spans
    builder = StreamsBuilder()
    builder.stream("in", key_serde=STR, value_serde=STR).map_values(str.upper).to("out", key_serde=STR,
                                                                                  value_serde=STR)
    with TopologyTestDriver(builder.build(), traced(provider)) as driver:
        driver.create_input_topic("in", STR, STR).pipe_input(
            "k", "v", headers=(("other", b"kept"), ("traceparent", TRACEPARENT), ("tracestate", b"vendor=1")))
        (output,) = driver.create_output_topic("out", STR, STR).read_records()

    (span,) = exporter.get_finished_spans()
    assert span.name == "process in"
    assert span.kind is SpanKind.CONSUMER
    assert span.parent is not None and (span.parent.trace_id, span.parent.span_id) == (TRACE_ID, PARENT_SPAN)
    assert span.context.trace_id == TRACE_ID
    assert span.context.trace_state.to_header() == "vendor=1"
    assert dict(span.attributes) == {
        "messaging.system": "kafka", "messaging.operation.type": "process", "messaging.operation.name": "process",
        "messaging.consumer.group.name": "traced", "messaging.destination.name": "in",
        "messaging.destination.partition.id": "0", "messaging.kafka.offset": 0,
        "streamloop.task.id": "0_0", "streamloop.outcome": "done"}
    assert output.value == "V"
    # The input's trace headers are replaced by the span's; the others are kept.
    assert traceparent(output.headers) == (TRACE_ID, span.context.span_id)
    assert ("other", b"kept") in output.headers
    assert ("tracestate", b"vendor=1") in output.headers


def test_a_record_without_traceparent_starts_a_trace(spans) -> None:
    provider, exporter = spans
    builder = StreamsBuilder()
    builder.stream("in", key_serde=STR, value_serde=STR).to("out", key_serde=STR, value_serde=STR)
    with TopologyTestDriver(builder.build(), traced(provider)) as driver:
        driver.create_input_topic("in", STR, STR).pipe_input("k", "v", headers=(("traceparent", b"garbage"),))
        (output,) = driver.create_output_topic("out", STR, STR).read_records()

    (span,) = exporter.get_finished_spans()
    assert span.parent is None
    assert traceparent(output.headers) == (span.context.trace_id, span.context.span_id)


def test_spans_follow_a_record_through_a_repartition_and_a_count(spans) -> None:
    """Sub-topology 0 writes its span into the repartition record, sub-topology 1 reads it as its
    parent, and the count's output carries the span of the record it counted."""
    provider, exporter = spans
    builder = StreamsBuilder()
    (builder.stream("words", key_serde=STR, value_serde=STR)
            .select_key(lambda _key, word: word)
            .group_by_key(key_serde=STR, value_serde=STR)
            .count(materialized=Materialized("counts", persistent=False))
            .to_stream()
            .to("counts", key_serde=STR, value_serde=LongSerde()))
    with TopologyTestDriver(builder.build(), traced(provider)) as driver:
        words = driver.create_input_topic("words", STR, STR)
        for index, word in enumerate("xyx"):
            words.pipe_input(str(index), word, headers=(("traceparent", TRACEPARENT),))
        outputs = driver.create_output_topic("counts", STR, LongSerde()).read_records()

    first = of_topic(exporter, "words")
    repartition = {s.attributes["messaging.destination.name"] for s in exporter.get_finished_spans()} - {"words"}
    second = of_topic(exporter, repartition.pop())
    assert [s.attributes["streamloop.task.id"] for s in first + second] == ["0_0"] * 3 + ["1_0"] * 3
    for one, two in zip(first, second, strict=True):
        assert one.parent.span_id == PARENT_SPAN
        assert two.parent.span_id == one.context.span_id
        assert two.context.trace_id == TRACE_ID
    assert [(r.key, r.value) for r in outputs] == [("x", 1), ("y", 1), ("x", 2)]
    assert [traceparent(r.headers)[1] for r in outputs] == [s.context.span_id for s in second]


class Failing(BaseProcessor):
    def process(self, record: Record) -> None:
        raise RuntimeError("boom")


def test_a_record_a_handler_drops_ends_its_span_with_an_error(spans) -> None:
    provider, exporter = spans
    builder = StreamsBuilder()
    builder.stream("in", key_serde=STR, value_serde=STR).process(Failing)
    settings = traced(provider,
                      processing_exception_handler="streamloop.handlers.LogAndContinueProcessingExceptionHandler")
    with TopologyTestDriver(builder.build(), settings) as driver:
        driver.create_input_topic("in", STR, STR).pipe_input("k", "v")

    (span,) = exporter.get_finished_spans()
    assert span.attributes["streamloop.outcome"] == "skipped"
    assert span.status.status_code is StatusCode.ERROR


class Awaiting(BaseProcessor):
    """An async processor that makes a span of its own: the record's span is its parent."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self.tracer = tracer

    async def process(self, record: Record) -> None:
        await asyncio.sleep(0)
        with self.tracer.start_as_current_span("lookup"):
            self.context.forward(record.with_value(record.value + "!"))


@pytest.mark.parametrize("threads", [1, 3], ids=["sequential", "in-flight"])
def test_an_async_processor_runs_in_its_record_span(spans, threads: int) -> None:
    provider, exporter = spans
    tracer = provider.get_tracer("test")
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=STR)
            .process(lambda: Awaiting(tracer))
            .to("out", key_serde=STR, value_serde=STR))
    with TopologyTestDriver(builder.build(), traced(provider, num_threads_per_task=threads)) as driver:
        driver.create_input_topic("in", STR, STR).pipe_records([(str(i), str(i)) for i in range(3)])
        outputs = driver.create_output_topic("out", STR, STR).read_records()

    records = of_topic(exporter, "in")
    lookups = [s for s in exporter.get_finished_spans() if s.name == "lookup"]
    assert len(records) == len(lookups) == len(outputs) == 3
    by_span = {s.context.span_id: s for s in lookups}
    for record_span, output in zip(records, outputs, strict=True):
        lookup = by_span[traceparent(output.headers)[1]]
        assert lookup.parent.span_id == record_span.context.span_id
        assert output.value == f"{record_span.attributes['messaging.kafka.offset']}!"


def test_tracing_on_without_opentelemetry_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "opentelemetry" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    builder = StreamsBuilder()
    builder.stream("in").to("out")
    with pytest.raises(ConfigError, match=r"tracing.enabled.*pip install 'streamloop\[otel\]'"):
        TopologyTestDriver(builder.build(), {"application.id": "a", "tracing.enabled": True})


OFF = """
import sys
from streamloop import Materialized, StreamsBuilder
from streamloop.serdes import LongSerde, StringSerde
from streamloop.testing import TopologyTestDriver
s = StringSerde()
builder = StreamsBuilder()
(builder.stream("in", key_serde=s, value_serde=s).group_by_key()
        .count(materialized=Materialized("c", persistent=False))
        .to_stream().to("out", key_serde=s, value_serde=LongSerde()))
with TopologyTestDriver(builder.build(), {"application.id": "off"}) as driver:
    driver.create_input_topic("in", s, s).pipe_input("k", "v", headers=(("traceparent", b"00-1-2-01"),))
    assert driver.create_output_topic("out", s, LongSerde()).read_records()[0].value == 1
loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry") or m == "streamloop.tasks.tracing")
print(loaded)
"""


def test_tracing_off_loads_no_opentelemetry() -> None:
    """In a fresh interpreter (this one has imported it): records run, nothing of tracing is loaded."""
    done = subprocess.run([sys.executable, "-c", OFF], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
