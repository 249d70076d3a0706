"""A hand-written aiokafka loop with records in flight: the peer of ``benchmarks/in_flight.py``.

What a programmer writes on aiokafka alone to keep ``level`` records of each partition in flight
with the output in input order per partition: the poll loop puts each partition's records in its
own queue (pausing a partition whose queue holds more than two windows); per partition, a starter
takes a record as soon as one of the partition's ``level`` places is free and starts its processing
as an asyncio task, and an emitter awaits those tasks in offset order and sends each result
(``producer.send``, linger 5 ms) before it frees the place. Auto-commit commits; nothing is
retried and no state is kept.

It runs on an event loop of its own, on its own OS thread (``PeerThread``), so the benchmark
reads its CPU time apart from the harness's, as it reads the stream thread's of streamloop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

THREAD_NAME = "aiokafka-in-flight"


async def serve(bootstrap: str, group: str, source: str, sink: str, level: int,
                process: Callable[[bytes], Awaitable[bytes]], stop: asyncio.Event) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    consumer = AIOKafkaConsumer(source, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                                enable_auto_commit=True, max_poll_records=1000)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    queues: dict[Any, asyncio.Queue[Any]] = {}
    lanes: list[asyncio.Task[None]] = []

    async def starter(tp: Any, queue: asyncio.Queue[Any], started: asyncio.Queue[Any],
                      places: asyncio.Semaphore) -> None:
        while True:
            record = await queue.get()
            await places.acquire()
            await started.put((record, asyncio.create_task(process(record.value))))

    async def emitter(started: asyncio.Queue[Any], places: asyncio.Semaphore) -> None:
        while True:
            record, result = await started.get()
            value = await result
            await producer.send(sink, value, key=record.key)
            places.release()

    def lane(tp: Any) -> asyncio.Queue[Any]:
        queue = queues.get(tp)
        if queue is None:
            queue = queues[tp] = asyncio.Queue()
            started: asyncio.Queue[Any] = asyncio.Queue()
            places = asyncio.Semaphore(level)
            lanes.append(asyncio.create_task(starter(tp, queue, started, places)))
            lanes.append(asyncio.create_task(emitter(started, places)))
        return queue

    await consumer.start()
    await producer.start()
    try:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=100, max_records=1000)
            for tp, records in batch.items():
                queue = lane(tp)
                for record in records:
                    queue.put_nowait(record)
            # Back-pressure: a partition with more than two windows waiting is not fetched.
            full = [tp for tp, q in queues.items() if q.qsize() > 2 * level]
            ready = [tp for tp, q in queues.items() if q.qsize() <= level]
            if full:
                consumer.pause(*full)
            if ready:
                consumer.resume(*ready)
            if not batch:
                await asyncio.sleep(0)
        await producer.flush()
    finally:
        for task in lanes:
            task.cancel()
        await asyncio.gather(*lanes, return_exceptions=True)
        await producer.stop()
        await consumer.stop()


class PeerThread:
    """``serve`` on its own event loop and OS thread, until ``stop``; ``native_id`` for its CPU time."""

    def __init__(self, *args: Any) -> None:
        self._args = args
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name=THREAD_NAME, daemon=True)

    def start(self) -> None:
        self.thread.start()
        self._ready.wait()

    @property
    def native_id(self) -> int | None:
        return self.thread.native_id

    def _main(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self._ready.set()
            await serve(*self._args, self._stop)

        try:
            asyncio.run(main())
        except BaseException as exc:
            self.error = exc
        finally:
            self._ready.set()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self.thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self.thread.join()
