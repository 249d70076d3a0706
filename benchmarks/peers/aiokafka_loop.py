"""A hand-written aiokafka consume→transform→produce loop: the practical ceiling of an aiokafka engine.

No state stores, no ordering guarantees beyond what it does by hand, auto-commit:
what a minimal service would do. ``count`` keeps its counts in a dict (lost on restart).
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
    return "one loop"


def prepare() -> None:
    pass


def command(run: PeerRun) -> list[str]:
    return python_command(__name__, run)


async def serve(run: PeerRun, stop: asyncio.Event) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    from benchmarks.workloads import enrich, keep, simulated_io

    consumer = AIOKafkaConsumer(run.source, bootstrap_servers=run.bootstrap, group_id=run.app_id,
                                auto_offset_reset="earliest", enable_auto_commit=True, max_poll_records=1000)
    producer = AIOKafkaProducer(bootstrap_servers=run.bootstrap, linger_ms=5, max_batch_size=64 * 1024)
    counts: Counter[bytes] = Counter()
    limit = asyncio.Semaphore(IN_FLIGHT_ASYNC)

    async def bounded_io(value: bytes) -> bytes:
        async with limit:
            return await simulated_io(value)

    async def in_order(records: list) -> None:  # type: ignore[type-arg]
        # gather keeps the input order, so the output of one partition leaves in offset order.
        for record, value in zip(records, await asyncio.gather(*(bounded_io(r.value) for r in records))):
            await producer.send(run.sink, value, key=record.key)

    await consumer.start()
    await producer.start()
    try:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=100, max_records=1000)
            if run.workload == "async-io":
                await asyncio.gather(*(in_order(records) for records in batch.values()))
                continue
            for records in batch.values():
                for record in records:
                    if run.workload == "stateless":
                        order = orjson.loads(record.value)
                        if keep(order):
                            await producer.send(run.sink, orjson.dumps(enrich(order)), key=record.key)
                    else:
                        counts[record.key] += 1
                        await producer.send(run.sink, b"%d" % counts[record.key], key=record.key)
        await producer.flush()
    finally:
        await producer.stop()
        await consumer.stop()


def main() -> None:
    run = parse_run()
    run_until_terminated(lambda stop: serve(run, stop))


if __name__ == "__main__":
    main()
