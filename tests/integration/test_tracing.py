"""Tracing end to end (``tracing.enabled``), on the memory broker and on real Kafka: each input
record's W3C ``traceparent`` is the parent of its span in the first sub-topology, whose span goes
through the repartition topic to be the parent of the record's span in the second, and each
count that leaves carries the span of the record it counted, whether it left at once or coalesced
in the record cache until a commit."""

from __future__ import annotations

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from streamloop import Materialized, StreamsBuilder
from streamloop.records import Headers
from streamloop.serdes import LongSerde, StringSerde
from streamloop.testing import eventually_async
from tests.support.apps import make_streams
from tests.support.cluster import Cluster

pytestmark = pytest.mark.asyncio

STR = StringSerde()
WORDS = ["x", "y", "x", "z", "x", "y", "x", "z"]
# Record i comes from a producer's span (PRODUCER_SPAN) of a trace of its own, so each span and
# output names the input record it belongs to by its trace id.
PRODUCER_SPAN = 0x00F067AA0BA902B7


def trace_of(index: int) -> int:
    return 0x4BF92F3577B34DA6A3CE929D0E0E0000 + index


def headers_of(index: int) -> Headers:
    return (("traceparent", f"00-{trace_of(index):032x}-{PRODUCER_SPAN:016x}-01".encode()),)


def traceparent(headers: Headers) -> tuple[int, int]:
    (value,) = [value for name, value in headers if name == "traceparent"]
    _version, trace_id, span_id, _flags = value.decode().split("-")
    return int(trace_id, 16), int(span_id, 16)


@pytest.mark.parametrize("cache", [0, 10 * 1024 * 1024], ids=["uncached", "cached"])
async def test_a_record_is_traced_through_a_repartition_and_a_count(cluster: Cluster, names, cache: int) -> None:
    source, sink = names("words"), names("counts")
    await cluster.create_topics({source: 1, sink: 1})
    builder = StreamsBuilder()
    (builder.stream(source, key_serde=STR, value_serde=STR)
            .select_key(lambda _key, word: word)
            .group_by_key(key_serde=STR, value_serde=STR)
            .count(materialized=Materialized("counts", persistent=False))
            .to_stream()
            .to(sink, key_serde=STR, value_serde=LongSerde()))
    await cluster.produce(source, [(str(i), w) for i, w in enumerate(WORDS)], STR, STR, partitions=1,
                          headers=headers_of)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    final = {word: WORDS.count(word) for word in WORDS}

    async with make_streams(builder.build(), cluster.bootstrap, names.app, commit_interval_ms=300,
                            cache_max_bytes_buffering=cache, tracing_enabled=True,
                            tracing_tracer_provider=provider):
        async def counted() -> bool:
            latest = {r.key: r.value for r in await cluster.read_all(sink)}
            return {STR.deserialize(k): LongSerde().deserialize(v) for k, v in latest.items()} == final

        await eventually_async(counted, timeout=60, what="the final counts")
    outputs = await cluster.read_all(sink)
    provider.shutdown()

    spans: dict[tuple[int, str], ReadableSpan] = {}  # (trace, task) -> the record's span there
    for span in exporter.get_finished_spans():
        if span.attributes["streamloop.outcome"] == "done":
            spans[(span.context.trace_id, span.attributes["streamloop.task.id"])] = span
    for index in range(len(WORDS)):
        first, second = spans[(trace_of(index), "0_0")], spans[(trace_of(index), "1_0")]
        assert first.parent.span_id == PRODUCER_SPAN
        assert first.attributes["messaging.destination.name"] == source
        assert first.attributes["messaging.kafka.offset"] == index
        # Read from the repartition topic, where the first sub-topology's sink wrote its span.
        assert second.parent.span_id == first.context.span_id
        assert second.attributes["messaging.destination.name"].endswith("-repartition")
    # A count of n for a word was made by the word's n-th record (a cache may have held it back
    # and let a later count of the word replace it, never change whose it is).
    nth = {(word, WORDS[: i + 1].count(word)): i for i, word in enumerate(WORDS)}
    assert outputs
    for output in outputs:
        index = nth[(STR.deserialize(output.key), LongSerde().deserialize(output.value))]
        assert traceparent(output.headers) == (trace_of(index), spans[(trace_of(index), "1_0")].context.span_id)
    if not cache:
        assert len(outputs) == len(WORDS)  # every update leaves at once, inside its record's span
