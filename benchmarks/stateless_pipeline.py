"""Stateless JSON filter/map: streamloop vs a bare aiokafka consume→transform→produce loop.

Both read the same N records (4 partitions) from the same real broker in the
same run and write to their own output topic. Throughput is measured on the
output side, from the first output record to the last, so group-join time does
not count for either. Run: ``make bench`` (starts the test broker) or
``python benchmarks/stateless_pipeline.py --bootstrap host:port``. ``--tracing`` turns the engine's
tracing on (``tracing.enabled``, the ``otel`` extra) with an SDK tracer provider that exports
nothing: what spans and trace headers cost, without an exporter's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamloop import KafkaStreams, StreamsBuilder
from streamloop.serdes import BytesSerde, JsonSerde

PARTITIONS = 4


def keep(order: dict) -> bool:
    return order["amount"] >= 10


def enrich(order: dict) -> dict:
    return {**order, "vip": order["amount"] > 1000}


async def create_topics(bootstrap: str, names: list[str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(n, PARTITIONS, 1) for n in names])
    finally:
        await admin.close()


async def produce_input(bootstrap: str, topic: str, count: int, seed: int) -> int:
    rng = random.Random(seed)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=256 * 1024)
    await producer.start()
    kept = 0
    try:
        batches = {p: producer.create_batch() for p in range(PARTITIONS)}
        for i in range(count):
            order = {"id": i, "customer": f"customer-{rng.randrange(1000)}",
                     "amount": round(rng.expovariate(1 / 200), 2), "currency": "EUR"}
            kept += keep(order)
            p = i % PARTITIONS
            if batches[p].append(key=order["customer"].encode(), value=orjson.dumps(order), timestamp=None) is None:
                batches[p].close()
                await (await producer.send_batch(batches[p], topic, partition=p))
                batches[p] = producer.create_batch()
                batches[p].append(key=order["customer"].encode(), value=orjson.dumps(order), timestamp=None)
        for p, batch in batches.items():
            batch.close()
            await (await producer.send_batch(batch, topic, partition=p))
    finally:
        await producer.stop()
    return kept


async def watch_output(bootstrap: str, topic: str, expected: int, timeout: float) -> float:
    """Seconds from the first output record to the last, read from the end offsets."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    first = None
    deadline = time.monotonic() + timeout
    try:
        while True:
            total = sum((await consumer.end_offsets(tps)).values())
            now = time.monotonic()
            if total and first is None:
                first = now
            if total >= expected:
                return now - (first or now)
            if now > deadline:
                raise TimeoutError(f"{topic}: {total} of {expected} records after {timeout} s")
            await asyncio.sleep(0.02)
    finally:
        await consumer.stop()


async def raw_loop(bootstrap: str, source: str, sink: str, count: int, stop: asyncio.Event) -> None:
    """The practical ceiling: what a hand-written aiokafka service does."""
    consumer = AIOKafkaConsumer(source, bootstrap_servers=bootstrap, group_id=f"raw-{uuid.uuid4().hex[:6]}",
                                auto_offset_reset="earliest", enable_auto_commit=True, max_poll_records=1000)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=64 * 1024)
    await consumer.start()
    await producer.start()
    seen = 0
    try:
        while seen < count and not stop.is_set():
            batch = await consumer.getmany(timeout_ms=100, max_records=1000)
            for records in batch.values():
                for record in records:
                    order = orjson.loads(record.value)
                    if keep(order):
                        await producer.send(sink, orjson.dumps(enrich(order)), key=record.key)
                seen += len(records)
        await producer.flush()
    finally:
        await producer.stop()
        await consumer.stop()


async def measure(name: str, bootstrap: str, sink: str, expected: int,
                  run: Callable[[asyncio.Event], Awaitable[None]]) -> float:
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch_output(bootstrap, sink, expected, timeout=300))
    runner = asyncio.create_task(run(stop))
    seconds = await watcher
    stop.set()
    with contextlib.suppress(asyncio.CancelledError):
        await runner
    rate = expected / seconds if seconds else float("inf")
    print(f"  {name:<28} {expected:>8} records out in {seconds:6.2f} s = {rate:>10,.0f} records/s")
    return rate


def tracing_settings(on: bool) -> dict[str, object]:
    if not on:
        return {}
    from opentelemetry.sdk.trace import TracerProvider

    return {"tracing.enabled": True, "tracing.tracer.provider": TracerProvider()}


async def one_round(bootstrap: str, count: int, threads: int, round_no: int,
                    tracing: bool = False) -> dict[str, float]:
    run_id = uuid.uuid4().hex[:6]
    source, raw_sink, engine_sink = f"bench-in-{run_id}", f"bench-raw-{run_id}", f"bench-engine-{run_id}"
    await create_topics(bootstrap, [source, raw_sink, engine_sink])
    expected = await produce_input(bootstrap, source, count, seed=7)
    if round_no == 0:
        print(f"{count} JSON orders on {PARTITIONS} partitions, {expected} pass the filter\n")
    rates = {}
    rates["raw"] = await measure("bare aiokafka loop", bootstrap, raw_sink, expected,
                                 lambda stop: raw_loop(bootstrap, source, raw_sink, count, stop))

    builder = StreamsBuilder()
    (builder.stream(source, key_serde=BytesSerde(), value_serde=JsonSerde())
            .filter(lambda _key, order: keep(order))
            .map_values(enrich)
            .to(engine_sink, key_serde=BytesSerde(), value_serde=JsonSerde()))
    topology = builder.build()

    async def run_engine(stop: asyncio.Event) -> None:
        streams = KafkaStreams(topology, {
            "application.id": f"bench-{run_id}", "bootstrap.servers": bootstrap,
            "num.stream.threads": threads, "commit.interval.ms": 1000, "linger.ms": 5,
            **tracing_settings(tracing),
        })
        async with streams:
            await stop.wait()

    traced = ", traced" if tracing else ""
    rates["engine"] = await measure(f"streamloop ({threads} thread{'s' if threads > 1 else ''}{traced})",
                                    bootstrap, engine_sink, expected, run_engine)
    return rates


async def main_async(bootstrap: str, count: int, threads: int, rounds: int, tracing: bool = False) -> None:
    results = [await one_round(bootstrap, count, threads, i, tracing) for i in range(rounds)]
    raw = statistics.median(r["raw"] for r in results)
    ours = statistics.median(r["engine"] for r in results)
    ratios = [r["engine"] / r["raw"] for r in results]
    print(f"\n  medians of {rounds} rounds: bare aiokafka {raw:,.0f} records/s, streamloop {ours:,.0f} records/s")
    print(f"  ratio streamloop / bare aiokafka: {ours / raw:.2f}x (per round: "
          f"{', '.join(f'{x:.2f}' for x in ratios)}; target >= 0.8x; quixstreams ~0.6x, faust ~0.05x "
          "per the project brief)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", help="an existing broker; default: start the test broker")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians are reported")
    parser.add_argument("--tracing", action="store_true", help="tracing.enabled, exporting nothing")
    args = parser.parse_args()
    if args.bootstrap:
        asyncio.run(main_async(args.bootstrap, args.records, args.threads, args.rounds, args.tracing))
        return
    from tests.support.kafka_broker import KafkaBroker

    with KafkaBroker() as broker:
        asyncio.run(main_async(broker.bootstrap, args.records, args.threads, args.rounds, args.tracing))


if __name__ == "__main__":
    main()
