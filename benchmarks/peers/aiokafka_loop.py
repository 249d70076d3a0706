"""A hand-written aiokafka consume→transform→produce loop: the practical ceiling of an aiokafka engine.

It does what an engine on aiokafka cannot do less of: poll, transform, append the
output to one record batch per output partition (``create_batch``/``send_batch``,
Kafka's default murmur2 partitioning), hand the batches over after each poll, and
let auto-commit commit. No state stores, no ordering beyond what it does by hand,
no error handling; ``count`` keeps its counts in a dict (lost on a restart).
"""

from __future__ import annotations

import asyncio
from collections import Counter

import orjson

from benchmarks.peers.process import PeerRun, installed_version, parse_run, python_command, run_until_terminated

NAME = "raw aiokafka"
IN_FLIGHT_ASYNC = 32


def version() -> str:
    return installed_version("aiokafka")


def setting(workload: str) -> str:
    if workload == "async-io":
        return f"{IN_FLIGHT_ASYNC} records in flight per partition, output in order"
    return "one loop, record batches per partition"


def missing_feature(workload: str) -> str | None:
    from benchmarks.dsl_workloads import not_available

    return not_available(workload)


def prepare() -> None:
    pass


def command(run: PeerRun) -> list[str]:
    return python_command(__name__, run)


class BatchWriter:
    """Output appended to one open record batch per partition, sent when full or on ``send_open``."""

    def __init__(self, producer, topic: str, partitions: int) -> None:  # type: ignore[no-untyped-def]
        from aiokafka.partitioner import murmur2

        self._murmur2 = murmur2
        self._producer = producer
        self._topic = topic
        self._partitions = partitions
        self._open: dict[int, object] = {}

    async def add(self, key: bytes, value: bytes) -> None:
        partition = (self._murmur2(key) & 0x7FFFFFFF) % self._partitions
        batch = self._open.get(partition)
        if batch is None:
            batch = self._open[partition] = self._producer.create_batch()
        if batch.append(timestamp=None, key=key, value=value) is None:  # type: ignore[attr-defined]
            await self._send(partition)
            batch = self._open[partition] = self._producer.create_batch()
            batch.append(timestamp=None, key=key, value=value)  # type: ignore[attr-defined]

    async def send_open(self) -> None:
        for partition in list(self._open):
            await self._send(partition)

    async def _send(self, partition: int) -> None:
        batch = self._open.pop(partition)
        batch.close()  # type: ignore[attr-defined]
        await self._producer.send_batch(batch, self._topic, partition=partition)


async def serve(run: PeerRun, stop: asyncio.Event) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    from benchmarks.workloads import PARTITIONS, enrich, keep, simulated_io

    consumer = AIOKafkaConsumer(run.source, bootstrap_servers=run.bootstrap, group_id=run.app_id,
                                auto_offset_reset="earliest", enable_auto_commit=True, max_poll_records=1000)
    producer = AIOKafkaProducer(bootstrap_servers=run.bootstrap, linger_ms=5, max_batch_size=64 * 1024)
    out = BatchWriter(producer, run.sink, PARTITIONS)
    counts: Counter[bytes] = Counter()
    limit = asyncio.Semaphore(IN_FLIGHT_ASYNC)

    async def bounded_io(value: bytes) -> bytes:
        async with limit:
            return await simulated_io(value)

    async def in_order(records: list) -> list[bytes]:  # type: ignore[type-arg]
        # gather keeps the input order, so the output of one partition leaves in offset order.
        return await asyncio.gather(*(bounded_io(r.value) for r in records))

    await consumer.start()
    await producer.start()
    try:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=100, max_records=1000)
            if run.workload == "async-io":
                per_partition = list(batch.values())
                results = await asyncio.gather(*(in_order(records) for records in per_partition))
                for records, values in zip(per_partition, results, strict=True):
                    for record, value in zip(records, values, strict=True):
                        await out.add(record.key, value)
            else:
                for records in batch.values():
                    for record in records:
                        if run.workload == "stateless":
                            order = orjson.loads(record.value)
                            if keep(order):
                                await out.add(record.key, orjson.dumps(enrich(order)))
                        else:
                            counts[record.key] += 1
                            await out.add(record.key, b"%d" % counts[record.key])
            await out.send_open()
        await producer.flush()
    finally:
        await producer.stop()
        await consumer.stop()


def main() -> None:
    run = parse_run()
    run_until_terminated(lambda stop: serve(run, stop))


if __name__ == "__main__":
    main()
