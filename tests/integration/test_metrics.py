"""metrics() after a known workload, and the same figures through the Prometheus endpoint."""

from __future__ import annotations

import asyncio
import math
import threading
import time
import urllib.error
import urllib.request

import pytest

from streamloop import KafkaStreams, StreamsBuilder
from streamloop.handlers import LogAndContinueProcessingExceptionHandler
from streamloop.serdes import IntegerSerde, JsonSerde
from streamloop.testing import eventually_async
from tests.support.apps import streams_config
from tests.support.cluster import Cluster

pytest.importorskip("prometheus_client")

pytestmark = pytest.mark.asyncio

INT, JSON = IntegerSerde(), JsonSerde()
RECORDS = 1000
WINDOW_MS = 60_000


def reject_tens(value: dict) -> dict:
    if value["n"] % 10 == 0:
        raise ValueError(f"{value['n']} is a multiple of ten")
    return value


async def scrape(port: int) -> str:
    def get() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            return answer.read().decode()

    return await asyncio.to_thread(get)


async def test_metrics_after_a_known_workload_and_through_prometheus(cluster: Cluster, names) -> None:
    source, sink = names("input"), names("output")
    await cluster.create_topics({source: 2, sink: 2})
    await cluster.produce(source, [(i, {"n": i}) for i in range(RECORDS)], INT, JSON, partitions=2)
    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .map_values(reject_tens)
            .to(sink, key_serde=INT, value_serde=JSON))
    config = streams_config(cluster.bootstrap, names.app,
                            processing_exception_handler=LogAndContinueProcessingExceptionHandler)
    config.update({"metrics.sample.window.ms": WINDOW_MS, "metrics.num.samples": 2, "metrics.prometheus.port": 0})
    streams = KafkaStreams(builder.build(), config)
    began = time.monotonic()
    async with streams:
        assert streams.prometheus is not None
        port = streams.prometheus.port
        await cluster.read(sink, RECORDS - RECORDS // 10)

        def metric(group: str, name: str) -> float:
            return sum(m.value for m in streams.metrics() if m.group == group and m.name == name)

        await eventually_async(lambda: metric("stream-thread-metrics", "process-total") == RECORDS, 30,
                               "every record processed")
        await eventually_async(lambda: metric("stream-thread-metrics", "commit-rate") > 0, 30, "a commit sampled")
        elapsed_s = time.monotonic() - began
        thread = {m.name: m.value for m in streams.metrics() if m.group == "stream-thread-metrics"}
        # Kafka's Rate pads the elapsed time to (samples - 1) windows: with one 60 s window
        # and less than that run, the rate is the count over 60 s plus the time run so far.
        assert RECORDS / (WINDOW_MS / 1000 + elapsed_s) <= thread["process-rate"] <= RECORDS / (WINDOW_MS / 1000)
        assert thread["poll-rate"] > 0
        assert 0 < thread["process-latency-avg"] <= thread["process-latency-max"]
        assert not math.isnan(thread["process-latency-max"])
        tasks: dict[str, dict[str, float]] = {}
        for m in streams.metrics():
            if m.group == "stream-task-metrics":
                tasks.setdefault(m.tags["task-id"], {})[m.name] = m.value
        assert sorted(tasks) == ["0_0", "0_1"]
        assert sum(t["records-processed-total"] for t in tasks.values()) == RECORDS
        assert sum(t["dropped-records-total"] for t in tasks.values()) == RECORDS // 10
        assert all(t["paused"] == 0 and t["timeout-retries-total"] == 0 for t in tasks.values())
        await eventually_async(lambda: all(m.value == 0 for m in streams.metrics() if m.name == "records-lag")
                               and sum(m.name == "records-lag" for m in streams.metrics()) == 2, 30,
                               "lag measured as 0 for both tasks")
        states = [m for m in streams.metrics() if m.name == "client-state"]
        assert [(m.tags["state"], m.value) for m in states] == [("RUNNING", 1.0)]

        text = await scrape(port)
        thread_id = next(m.tags["thread-id"] for m in streams.metrics() if "thread-id" in m.tags)
        assert f'kafka_streams_stream_thread_metrics_process_total{{thread_id="{thread_id}"}} {float(RECORDS)}' in text
        assert "# TYPE kafka_streams_stream_thread_metrics_process_total counter" in text
        assert "# TYPE kafka_streams_stream_thread_metrics_process_rate gauge" in text
        dropped = [line for line in text.splitlines()
                   if line.startswith("kafka_streams_stream_task_metrics_dropped_records_total{")]
        assert len(dropped) == 2 and sum(float(line.rsplit(" ", 1)[1]) for line in dropped) == RECORDS // 10
        assert f'kafka_streams_stream_metrics_client_state{{client_id="{streams.client_id}",state="RUNNING"}} 1.0' \
            in text
        assert f'kafka_streams_stream_metrics_alive_stream_threads{{client_id="{streams.client_id}"}} 1.0' in text
    assert streams.prometheus is None
    with pytest.raises(urllib.error.URLError):
        await scrape(port)


async def test_records_lag_follows_processing_with_a_long_commit_interval(cluster: Cluster, names) -> None:
    """The lag is the log end minus the live position, measured every second whatever the commit
    interval (Kafka Streams' default is 30 s): it shows a backlog growing and going away."""
    source, sink = names("input"), names("output")
    await cluster.create_topics({source: 1, sink: 1})
    released = threading.Event()

    async def gate(value: dict) -> dict:
        while not released.is_set():
            await asyncio.sleep(0.01)  # stands in for a slow call; the test releases it
        return value

    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .map_values(gate)
            .to(sink, key_serde=INT, value_serde=JSON))
    streams = KafkaStreams(builder.build(), streams_config(cluster.bootstrap, names.app, commit_interval_ms=60_000))

    def lag() -> float | None:
        values = [m.value for m in streams.metrics() if m.name == "records-lag"]
        return sum(values) if values else None

    async with streams:
        await eventually_async(lambda: lag() == 0, 30, "the lag measured once")
        await cluster.produce(source, [(i, {"n": i}) for i in range(50)], INT, JSON, partitions=1)
        await eventually_async(lambda: lag() == 50, 10, "a lag of 50 while the first record waits")
        released.set()
        await cluster.read(sink, 50)
        await eventually_async(lambda: lag() == 0, 10, "the lag back to 0 once the records are processed")
