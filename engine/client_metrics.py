"""A client's metrics in Kafka Streams' shape, read from its threads' views.

Safe from any thread: every figure is a plain attribute read on a stream thread's
view; nothing waits for a stream thread's loop.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from streamloop.client_states import ClientState
from streamloop.threads.states import StreamThreadState
from streamloop.threads.stream_thread import StreamThread


@dataclass(frozen=True)
class Metric:
    """One metric in Kafka's shape."""

    group: str
    name: str
    tags: Mapping[str, str]
    value: float


def client_metrics(client_id: str, state: ClientState, threads: Iterable[StreamThread],
                   failed_threads: int) -> list[Metric]:
    """``stream-metrics`` (client), ``stream-thread-metrics`` and ``stream-task-metrics``
    (see ``KafkaStreams.metrics``)."""
    tags = {"client-id": client_id}
    threads = list(threads)
    result = [
        Metric("stream-metrics", "alive-stream-threads", tags, float(sum(t.is_alive for t in threads))),
        Metric("stream-metrics", "failed-stream-threads", tags, float(failed_threads)),
        Metric("stream-metrics", "client-state", {**tags, "state": state.name}, 1.0),
    ]
    for thread in threads:
        if thread.state.state is StreamThreadState.DEAD:
            continue
        result.extend(_thread_metrics(thread))
    return result


def _thread_metrics(thread: StreamThread) -> list[Metric]:
    result = []
    thread_tags = {"thread-id": thread.name}
    for name, value in thread.counters().items():
        result.append(Metric("stream-thread-metrics", name, thread_tags, value))
    for name, value in thread.sensors.values().items():
        result.append(Metric("stream-thread-metrics", name, thread_tags, value))
    for name, value in thread.rebalances.metrics().items():
        result.append(Metric("stream-thread-metrics", name, thread_tags, value))
    for task_id, values in thread.task_counters():
        task_tags = {**thread_tags, "task-id": str(task_id)}
        for name, value in values.items():
            result.append(Metric("stream-task-metrics", name, task_tags, value))
    result.append(Metric("stream-thread-metrics", "cache-size-bytes", thread_tags, float(thread.cache_size)))
    for task_id, lag in thread.task_lags().items():
        result.append(Metric("stream-task-metrics", "records-lag", {**thread_tags, "task-id": str(task_id)},
                             float(lag)))
    errors = thread.errors
    if errors is not None:
        result.append(Metric("stream-thread-metrics", "dropped-records-total", thread_tags,
                             float(errors.records_dropped)))
        # Pauses so far; how many tasks are paused now is paused-tasks-total (the thread's counters).
        result.append(Metric("stream-thread-metrics", "pause-total", thread_tags, float(errors.paused)))
    return result
