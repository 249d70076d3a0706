"""Broker fault scenarios on a real Kafka broker: each one runs a client through a fault and
returns its figures. Used by ``tests/integration/test_broker_faults.py`` (which asserts on the
figures) and ``benchmarks/faults.py`` (which prints them).

Every scenario takes the :class:`~tests.support.kafka_broker.KafkaBroker` it may stop, freeze
and restart (never the session's shared broker) and returns a dict with at least:

``faults``
    faults injected (bounces, pauses).
``lost``
    input records whose output never appeared (waited for up to ``recover_bound_s``).
``duplicates``
    exactly-once: output records seen more than once by a ``read_committed`` reader (at-least-once
    may repeat records; the count is reported but allowed).
``stalled``
    1 when the output was not complete, or the lag of the client's tasks did not reach 0, within
    ``recover_bound_s`` after the broker was back; else 0.
``thread_deaths``
    the client's ``failed-stream-threads``.
``recover_s``
    seconds from the broker serving again to every record out and lag 0 (None when stalled).
``state``
    the client's state at the end (before close).
``error``
    what the uncaught-exception handler got first (``Type: message``), or None.

Input records are ``(i, {"i": i})`` with int keys over 2 partitions; a slow async processor
(``record_delay_s`` per record) keeps the tasks busy while the fault hits them, so produces,
commits and fetches all fail during it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import anyio

from streamloop import ClientState, KafkaStreams, StreamsBuilder
from streamloop.handlers import StreamThreadExceptionResponse
from streamloop.records import TopicPartition
from streamloop.serdes import IntegerSerde, JsonSerde
from streamloop.testing import eventually_async
from streamloop.transport import open_transport
from tests.support.cluster import Cluster
from tests.support.kafka_broker import KafkaBroker

log = logging.getLogger(__name__)

INT, JSON = IntegerSerde(), JsonSerde()
AT_LEAST_ONCE = "at_least_once"
EXACTLY_ONCE = "exactly_once_v2"
PARTITIONS = 2

# Short client timeouts: a fault shows up as retriable errors within seconds.
REQUEST_TIMEOUT_MS = 3_000
FAST_CLIENT: dict[str, Any] = {
    "request.timeout.ms": REQUEST_TIMEOUT_MS,
    "retry.backoff.ms": 100,
    "retry.backoff.max.ms": 1_000,
    # Longer than any outage here: the group survives it without a rebalance.
    "session.timeout.ms": 30_000,
    "heartbeat.interval.ms": 1_000,
    "max.poll.interval.ms": 120_000,
    "commit.interval.ms": 200,
    "poll.ms": 50,
    "linger.ms": 5,
    # Back-pressure engages within a fault's length (it pauses a partition at this many records).
    "buffered.records.per.partition": 100,
}


@dataclass
class Run:
    """One client on fresh topics of ``broker``, with what its uncaught-exception handler saw."""

    broker: KafkaBroker
    guarantee: str
    task_timeout_ms: int
    record_delay_s: float
    handler_answer: StreamThreadExceptionResponse = StreamThreadExceptionResponse.SHUTDOWN_CLIENT
    extra: dict[str, Any] = field(default_factory=dict)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    errors: list[BaseException] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.source, self.sink = f"faults-in-{self.run_id}", f"faults-out-{self.run_id}"
        self.cluster = Cluster(open_transport({"bootstrap.servers": self.broker.bootstrap}), self.broker.bootstrap)
        delay = self.record_delay_s

        async def slow(value: dict) -> dict:
            await anyio.sleep(delay)
            return value

        builder = StreamsBuilder()
        (builder.stream(self.source, key_serde=INT, value_serde=JSON)
                .map_values(slow)
                .to(self.sink, key_serde=INT, value_serde=JSON))
        self.streams = KafkaStreams(builder.build(), {
            **FAST_CLIENT,
            "application.id": f"faults-{self.run_id}",
            "bootstrap.servers": self.broker.bootstrap,
            "processing.guarantee": self.guarantee,
            "task.timeout.ms": self.task_timeout_ms,
            **self.extra,
        })

        def handler(exc: BaseException) -> StreamThreadExceptionResponse:
            self.errors.append(exc)
            return self.handler_answer

        self.streams.set_uncaught_exception_handler(handler)

    async def start(self) -> None:
        await self.cluster.create_topics({self.source: PARTITIONS, self.sink: PARTITIONS})
        await self.streams.start_async()

    async def produce(self, keys: range) -> None:
        await self.cluster.produce(self.source, [(i, {"i": i}) for i in keys], INT, JSON, partitions=PARTITIONS)
        self.sent.extend(keys)

    async def output_keys(self) -> list[int]:
        """Every key in the sink so far; exactly-once reads only committed transactions."""
        reader = self.cluster.transport.reader(f"faults-reader-{self.run_id}",
                                               read_committed=self.guarantee == EXACTLY_ONCE)
        await reader.start()
        tps = [TopicPartition(self.sink, p) for p in range(PARTITIONS)]
        reader.assign(tps)
        for tp in tps:
            reader.seek(tp, 0)
        keys: list[int] = []
        try:
            ends = await reader.end_offsets(tps)
            positions = {tp: 0 for tp in tps}
            # Read until the log end or until nothing more comes (a read_committed reader stops
            # at the last stable offset, below the end while a transaction is open).
            quiet_until = time.monotonic() + 1.0
            while any(positions[tp] < ends[tp] for tp in tps) and time.monotonic() < quiet_until:
                batch = await reader.poll(200, 10_000)
                for tp, records in batch.items():
                    if records:
                        quiet_until = time.monotonic() + 1.0
                        positions[TopicPartition(tp.topic, tp.partition)] = records[-1].offset + 1
                        keys.extend(INT.deserialize(r.key) for r in records)
        finally:
            await reader.close()
        return keys

    def total_lag(self) -> float | None:
        """The sum of the tasks' records-lag, or None until every task has been measured."""
        lags = [m.value for m in self.streams.metrics() if m.name == "records-lag"]
        return sum(lags) if len(lags) == PARTITIONS else None

    async def wait_for_everything(self, bound_s: float) -> tuple[list[int], float | None]:
        """Wait until every sent key is out and the lag is 0; the keys seen and the seconds it took
        (None when it did not happen within ``bound_s``)."""
        started = time.monotonic()
        seen: list[int] = []

        async def complete() -> bool:
            nonlocal seen
            if self.streams.state is ClientState.ERROR:
                raise _ClientFailed()
            seen = await self.output_keys()
            return set(self.sent) <= set(seen) and self.total_lag() == 0

        try:
            await eventually_async(complete, bound_s, "every record out and lag 0", interval=0.5)
        except (TimeoutError, _ClientFailed):
            return seen, None
        return seen, time.monotonic() - started

    def figures(self, faults: int, seen: list[int], recover_s: float | None) -> dict[str, Any]:
        counts = Counter(seen)
        first = self.errors[0] if self.errors else None
        return {
            "faults": faults,
            "lost": len(set(self.sent) - set(counts)),
            "duplicates": sum(n - 1 for n in counts.values() if n > 1),
            "stalled": int(recover_s is None),
            "thread_deaths": int(self.streams.metric("failed-stream-threads")),
            "recover_s": None if recover_s is None else round(recover_s, 1),
            "state": self.streams.state.name,
            "error": None if first is None else f"{type(first).__name__}: {first}",
            "error_type": None if first is None else type(first),
        }

    async def close(self) -> None:
        await self.streams.close_async(timeout=60)


class _ClientFailed(Exception):
    """The client went to ERROR while a scenario waited for its output."""


async def ensure_serving(broker: KafkaBroker) -> None:
    """Undo a fault a failed scenario may have left behind (frozen or stopped broker)."""
    if broker.paused:
        broker.resume()
    if not broker.running:
        await anyio.to_thread.run_sync(broker.start_process)


async def _warm_up(run: Run, count: int = 100) -> None:
    await run.start()
    await run.produce(range(count))
    await eventually_async(lambda: _has(run, set(range(count))), 60, "the first records out", interval=0.3)


async def _has(run: Run, keys: set[int]) -> bool:
    return keys <= set(await run.output_keys())


async def bounce(broker: KafkaBroker, *, guarantee: str = AT_LEAST_ONCE, down_s: float = 10.0,
                 task_timeout_ms: int = 120_000, records: int = 2_000, record_delay_s: float = 0.004,
                 recover_bound_s: float = 90.0, kill: bool = False,
                 buffered_per_partition: int | None = None) -> dict[str, Any]:
    """Stop the broker for ``down_s`` while the tasks are busy, start it again on the same data and
    port, produce more, and wait for every record's output. ``buffered_per_partition`` overrides
    the back-pressure limit (100 here)."""
    await ensure_serving(broker)
    extra = {} if buffered_per_partition is None else {"buffered.records.per.partition": buffered_per_partition}
    run = Run(broker, guarantee, task_timeout_ms, record_delay_s, extra=extra)
    try:
        await _warm_up(run)
        await run.produce(range(100, 100 + records))  # busy for records * delay / PARTITIONS s
        await anyio.to_thread.run_sync(lambda: broker.bounce(down_s, kill=kill))
        await run.produce(range(100 + records, 200 + records))
        seen, recover_s = await run.wait_for_everything(recover_bound_s)
        return run.figures(1, seen, recover_s)
    finally:
        await ensure_serving(broker)
        await run.close()


async def pause(broker: KafkaBroker, *, guarantee: str = AT_LEAST_ONCE, frozen_s: float | None = None,
                task_timeout_ms: int = 120_000, records: int = 400, record_delay_s: float = 0.02,
                recover_bound_s: float = 90.0) -> dict[str, Any]:
    """Freeze the broker (SIGSTOP) for ``frozen_s`` (2 x request.timeout.ms by default) while the
    tasks are busy, thaw it, produce more, and wait for every record's output."""
    frozen_s = 2 * REQUEST_TIMEOUT_MS / 1000 if frozen_s is None else frozen_s
    await ensure_serving(broker)
    run = Run(broker, guarantee, task_timeout_ms, record_delay_s)
    try:
        await _warm_up(run)
        await run.produce(range(100, 100 + records))
        broker.pause()
        try:
            await anyio.sleep(frozen_s)  # the fault's length, not a wait for a condition
        finally:
            broker.resume()
        await run.produce(range(100 + records, 200 + records))
        seen, recover_s = await run.wait_for_everything(recover_bound_s)
        return run.figures(1, seen, recover_s)
    finally:
        await ensure_serving(broker)
        await run.close()


async def outage_past_task_timeout(broker: KafkaBroker, *, guarantee: str = AT_LEAST_ONCE,
                                   task_timeout_ms: int = 4_000, records: int = 400,
                                   record_delay_s: float = 0.02, bound_s: float = 60.0) -> dict[str, Any]:
    """Stop the broker while the tasks are busy and keep it down until the client fails (the
    default answer, SHUTDOWN_CLIENT) or ``bound_s`` passes; then start it again."""
    await ensure_serving(broker)
    run = Run(broker, guarantee, task_timeout_ms, record_delay_s)
    try:
        await _warm_up(run)
        await run.produce(range(100, 100 + records))
        await anyio.to_thread.run_sync(broker.stop_process)
        failed = await run.streams.wait_for_state_async(ClientState.ERROR, timeout=bound_s)
        await ensure_serving(broker)
        return {**run.figures(1, [], None), "lost": None, "stalled": int(not failed)}
    finally:
        await ensure_serving(broker)
        await run.close()


async def thread_added_during_outage(broker: KafkaBroker, *, down_s: float = 6.0, task_timeout_ms: int = 60_000,
                                     guarantee: str = AT_LEAST_ONCE, recover_bound_s: float = 60.0) -> dict[str, Any]:
    """Stop the broker, add a stream thread while it is down, start the broker after ``down_s``:
    the new thread's start-up (admin, producer, consumer, topic check) waits for it."""
    await ensure_serving(broker)
    run = Run(broker, guarantee, task_timeout_ms, 0.0)
    try:
        await _warm_up(run)
        await anyio.to_thread.run_sync(broker.stop_process)
        added = await run.streams.add_stream_thread_async()
        await anyio.sleep(down_s)  # the outage's length, not a wait for a condition
        await anyio.to_thread.run_sync(broker.start_process)
        await run.produce(range(100, 200))
        seen, recover_s = await run.wait_for_everything(recover_bound_s)
        # The added thread's first join rebalances the group once more.
        await run.streams.wait_for_state_async(ClientState.RUNNING, ClientState.ERROR, timeout=recover_bound_s)
        alive = int(run.streams.metric("alive-stream-threads"))
        return {**run.figures(1, seen, recover_s), "added": added, "alive_threads": alive}
    finally:
        await ensure_serving(broker)
        await run.close()


async def thread_added_during_long_outage(broker: KafkaBroker, *, task_timeout_ms: int = 3_000,
                                          bound_s: float = 60.0) -> dict[str, Any]:
    """Add a stream thread while the broker is down for longer than task.timeout.ms: its start-up
    gives up with a typed error through the uncaught-exception handler."""
    await ensure_serving(broker)
    run = Run(broker, AT_LEAST_ONCE, task_timeout_ms, 0.0, StreamThreadExceptionResponse.SHUTDOWN_THREAD)
    try:
        await _warm_up(run)
        await anyio.to_thread.run_sync(broker.stop_process)
        await run.streams.add_stream_thread_async()
        await eventually_async(lambda: run.errors, bound_s, "the added thread to fail", interval=0.1)
        return {**run.figures(1, [], None), "lost": None, "stalled": None}
    finally:
        await ensure_serving(broker)
        await run.close()


