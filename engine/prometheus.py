"""The Prometheus endpoint: ``KafkaStreams.metrics()`` served over HTTP (extra ``monitor``).

Started by ``KafkaStreams.start()`` when ``metrics.prometheus.port`` is set, stopped
by its close. Each scrape reads ``metrics()`` afresh (snapshots only, no stream
thread waits). Names follow Prometheus' rules, made from Kafka's group and name::

    group stream-thread-metrics, name process-rate, tags {thread-id: t}
      -> kafka_streams_stream_thread_metrics_process_rate{thread_id="t"}

Metrics whose Kafka name ends in ``-total`` are counters, the others gauges. A tag
named like a secret (``config.is_secret``) is exported as ``[hidden]``.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from streamloop.config import is_loopback, shown
from streamloop.errors import MissingExtraError

try:
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, start_http_server
    from prometheus_client.metrics_core import Metric as PrometheusMetric
except ImportError as exc:  # the 'prometheus' extra is optional
    raise MissingExtraError("The Prometheus endpoint (metrics.prometheus.port)", "prometheus",
                            "prometheus-client") from exc

log = logging.getLogger(__name__)

PREFIX = "kafka_streams"


class StreamsMetric(Protocol):
    """One metric in Kafka's shape, as ``KafkaStreams.metrics()`` gives it (``streamloop.client.Metric``).

    A protocol rather than an import so that the exporter, which the client starts, does not
    import the client back.
    """

    @property
    def group(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def tags(self) -> Mapping[str, str]: ...
    @property
    def value(self) -> float: ...


def prometheus_name(group: str, name: str) -> str:
    """``kafka_streams_<group>_<name>`` with every character Prometheus refuses made ``_``."""
    return _clean(f"{PREFIX}_{group}_{name}")


def label_name(tag: str) -> str:
    return _clean(tag)


def _clean(text: str) -> str:
    text = re.sub(r"[^a-zA-Z0-9_]", "_", text)
    return f"_{text}" if text[:1].isdigit() else text


def families(metrics: Iterable[StreamsMetric]) -> list[PrometheusMetric]:
    """Kafka-shaped metrics as Prometheus metric families, one per (group, name)."""
    by_name: dict[str, PrometheusMetric] = {}
    for metric in metrics:
        counter = metric.name.endswith("-total")
        base = prometheus_name(metric.group, metric.name[:-len("-total")] if counter else metric.name)
        family = by_name.get(base)
        if family is None:
            family = PrometheusMetric(base, f"{metric.group} {metric.name}", "counter" if counter else "gauge")
            by_name[base] = family
        labels = {label_name(k): str(shown(k, v)) for k, v in metric.tags.items()}
        family.add_sample(f"{base}_total" if counter else base, labels, metric.value)
    return list(by_name.values())


class _Collector:
    def __init__(self, read: Callable[[], Iterable[StreamsMetric]]) -> None:
        self._read = read

    def collect(self) -> Iterator[PrometheusMetric]:
        yield from families(self._read())


def exposition(read: Callable[[], Iterable[StreamsMetric]]) -> Callable[[], tuple[bytes, str]]:
    """A function that renders ``read()``'s metrics in Prometheus' text format: ``(body, content
    type)``, for a server other than the exporter's own (``streamloop.web``'s ``/metrics``)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(read))

    def render() -> tuple[bytes, str]:
        return generate_latest(registry), CONTENT_TYPE_LATEST

    return render


class PrometheusExporter:
    """An HTTP server on its own thread answering ``GET /metrics`` with ``read()``'s metrics."""

    def __init__(self, read: Callable[[], Iterable[StreamsMetric]], host: str, port: int) -> None:
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(_Collector(read))
        self._server: Any
        self._thread: threading.Thread
        self._server, self._thread = start_http_server(port, addr=host, registry=self._registry)
        self.host = host
        self.port: int = self._server.server_port
        log.info("Prometheus metrics at http://%s:%d/metrics", host, self.port)
        if not is_loopback(host):
            log.warning("The Prometheus endpoint listens on %s, off loopback: anyone who reaches port %d reads "
                        "the metrics, without a token (metrics.prometheus.host)", host, self.port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
