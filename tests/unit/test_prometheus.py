"""Kafka-shaped metrics in Prometheus' naming and text format."""

from __future__ import annotations

import pytest

from streamloop.client import Metric

pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry, generate_latest

from streamloop.prometheus import families, prometheus_name


def test_names_join_group_and_name_with_underscores() -> None:
    assert prometheus_name("stream-thread-metrics", "process-latency-avg") == \
        "kafka_streams_stream_thread_metrics_process_latency_avg"
    assert prometheus_name("my.group", "9lives") == "kafka_streams_my_group_9lives"


def test_totals_are_counters_and_the_rest_gauges_with_tags_as_labels() -> None:
    metrics = [
        Metric("stream-task-metrics", "records-processed-total", {"thread-id": "t-1", "task-id": "0_0"}, 5.0),
        Metric("stream-task-metrics", "records-processed-total", {"thread-id": "t-1", "task-id": "0_1"}, 7.0),
        Metric("stream-thread-metrics", "process-rate", {"thread-id": "t-1"}, 1.5),
    ]

    class Source:
        def collect(self):  # type: ignore[no-untyped-def]
            return families(metrics)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Source())  # type: ignore[arg-type]
    text = generate_latest(registry).decode()

    assert "# TYPE kafka_streams_stream_task_metrics_records_processed_total counter" in text
    assert 'kafka_streams_stream_task_metrics_records_processed_total{task_id="0_0",thread_id="t-1"} 5.0' in text
    assert 'kafka_streams_stream_task_metrics_records_processed_total{task_id="0_1",thread_id="t-1"} 7.0' in text
    assert "# TYPE kafka_streams_stream_thread_metrics_process_rate gauge" in text
    assert 'kafka_streams_stream_thread_metrics_process_rate{thread_id="t-1"} 1.5' in text


def test_a_tag_named_like_a_secret_is_exported_hidden() -> None:
    metrics = [Metric("client-metrics", "info", {"client-id": "c-1", "sasl.password": "hunter2"}, 1.0)]
    [family] = families(metrics)
    [sample] = family.samples
    assert sample.labels == {"client_id": "c-1", "sasl_password": "[hidden]"}
