"""Run one streams client in its own process, for tests that need several processes.

    python -m tests.support.app_process --bootstrap HOST:PORT --application-id APP \\
        --source IN --sink OUT [--threads N] [--response SHUTDOWN_APPLICATION] [--exactly-once]
        [--count] [--state-dir DIR] [--buffered-records-per-partition N] [--session-timeout-ms MS]
        [--commit-interval-ms MS] [--progress-every N] [--group-instance-id ID]

The app reads int keys and JSON values ``{"n": int}`` from ``--source`` and writes
``{"n": n}`` to ``--sink`` (with ``--count``: the count of the key so far, a long); a value
with ``"poison": true`` makes it raise, every time. The uncaught-exception handler answers
``--response``. The process prints one JSON object per line on stdout and exits once the
client is in a terminal state (ERROR or NOT_RUNNING), or on SIGTERM after closing it:

    {"event": "state", "state": "RUNNING", "at": 1.0}    each client state change
    {"event": "tasks", "count": 1}            the number of local active tasks, when it changes
    {"event": "processed", "n": 2}            each value the app saw (before it could fail); with
                                              --progress-every N only each n divisible by N
    {"event": "starting", "at": 1.0}          the client's start (``at``: wall-clock seconds)
    {"event": "restore", "start": 0, "end": 9, "total": 7, "began": 1.0, "at": 1.2}
                                              each store restore as it ends (its listener's figures)
    {"event": "handler", "error": "..."}      each call of the handler
    {"event": "final", "state": "ERROR"}      last line: the state the client ended in
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import threading
import time
from typing import Any

from streamloop import ClientState, KafkaStreams, StreamsBuilder
from streamloop.handlers import StreamThreadExceptionResponse
from streamloop.serdes import IntegerSerde, JsonSerde, LongSerde
from streamloop.state import Materialized
from tests.support.apps import streams_config

_print_lock = threading.Lock()


def emit(event: str, **fields: Any) -> None:
    with _print_lock:
        sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
        sys.stdout.flush()


class PoisonedValue(RuntimeError):
    pass


PROGRESS_EVERY = [1]


def see(_key: int, value: dict[str, Any]) -> None:
    if value["n"] % PROGRESS_EVERY[0] == 0:
        emit("processed", n=value["n"])
    if value.get("poison"):
        raise PoisonedValue(f"poison value {value['n']}")


def build(args: argparse.Namespace) -> KafkaStreams:
    builder = StreamsBuilder()
    stream = builder.stream(args.source, key_serde=IntegerSerde(), value_serde=JsonSerde()).peek(see)
    if args.io_ms:
        io_s = args.io_ms / 1000

        async def call_a_service(value: dict[str, Any]) -> dict[str, Any]:
            # Random I/O times: records in flight finish out of offset order.
            await asyncio.sleep(random.uniform(0, io_s))
            return value

        stream = stream.map_values(call_a_service)
    if args.count:
        (stream.group_by_key()
               .count(materialized=Materialized("counts"))
               .to_stream()
               .to(args.sink, key_serde=IntegerSerde(), value_serde=LongSerde()))
    else:
        (stream.map_values(lambda value: {"n": value["n"]})
               .to(args.sink, key_serde=IntegerSerde(), value_serde=JsonSerde()))
    config = streams_config(args.bootstrap, args.application_id, num_stream_threads=args.threads,
                            num_threads_per_task=args.threads_per_task, processing_ordering=args.ordering)
    if args.state_dir:
        config["state.dir"] = args.state_dir
    if args.count:
        config["cache.max.bytes.buffering"] = 0  # every input is one count update
    if args.exactly_once:
        config["processing.guarantee"] = "exactly_once_v2"
    if args.buffered_records_per_partition is not None:
        config["buffered.records.per.partition"] = args.buffered_records_per_partition
    if args.group_instance_id is not None:
        config["group.instance.id"] = args.group_instance_id  # static membership: a restart rejoins at once
    if args.commit_interval_ms is not None:
        config["commit.interval.ms"] = args.commit_interval_ms
    PROGRESS_EVERY[0] = args.progress_every
    if args.session_timeout_ms is not None:
        # A killed instance stays in the group this long: its restart waits for that.
        config["session.timeout.ms"] = args.session_timeout_ms
    streams = KafkaStreams(builder.build(), config)
    response = StreamThreadExceptionResponse[args.response]

    def handler(exc: BaseException) -> StreamThreadExceptionResponse:
        emit("handler", error=repr(exc))
        return response

    streams.set_uncaught_exception_handler(handler)
    streams.set_state_listener(lambda new, _old: emit("state", state=new.name, at=time.time()))
    streams.set_global_state_restore_listener(RestoreEvents())
    return streams


class RestoreEvents:
    """Tells each store restore as it ends, with where it started."""

    def __init__(self) -> None:
        self._started: dict[tuple[str, str], tuple[int, int, float]] = {}

    def on_restore_start(self, partition: Any, store: str, start_offset: int, end_offset: int) -> None:
        self._started[(str(partition), store)] = (start_offset, end_offset, time.time())

    def on_batch_restored(self, partition: Any, store: str, batch_end_offset: int, restored: int) -> None:
        pass

    def on_restore_end(self, partition: Any, store: str, total_restored: int) -> None:
        start, end, began = self._started.pop((str(partition), store), (-1, -1, time.time()))
        emit("restore", partition=str(partition), store=store, start=start, end=end, total=total_restored,
             began=began, at=time.time())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.app_process")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--application-id", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--sink", required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--threads-per-task", type=int, default=1, help="num.threads.per.task: records in flight")
    parser.add_argument("--ordering", default="partition", help="processing.ordering")
    parser.add_argument("--io-ms", type=float, default=0, help="an async step of up to this much I/O per record")
    parser.add_argument("--exactly-once", action="store_true", help="processing.guarantee=exactly_once_v2")
    parser.add_argument("--count", action="store_true",
                        help="count per key (a RocksDB store, no cache) instead of relaying the values")
    parser.add_argument("--state-dir", default=None)
    parser.add_argument("--buffered-records-per-partition", type=int, default=None)
    parser.add_argument("--session-timeout-ms", type=int, default=None)
    parser.add_argument("--commit-interval-ms", type=int, default=None)
    parser.add_argument("--group-instance-id", default=None)
    parser.add_argument("--progress-every", type=int, default=1, help="a processed line for each n divisible by this")
    parser.add_argument("--response", default="SHUTDOWN_APPLICATION",
                        choices=[r.name for r in StreamThreadExceptionResponse])
    args = parser.parse_args(argv)

    streams = build(args)
    return run_until_stopped(streams)


def run_until_stopped(streams: KafkaStreams) -> int:
    """Run ``streams`` until it fails or stops or SIGTERM comes, telling each change of its task
    count (``tasks``) and the state it ended in (``final``). Also the Spark enrichment app's loop."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    emit("starting", at=time.time())
    streams.start()
    terminal = (ClientState.ERROR, ClientState.NOT_RUNNING)
    tasks = -1
    while not stop.is_set() and not streams.wait_for_state(*terminal, timeout=0.1):
        count = sum(len(t.active_tasks) for t in streams.metadata_for_local_threads())
        if count != tasks:
            tasks = count
            emit("tasks", count=count)
    streams.close(timeout=60)
    emit("final", state=streams.state.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
