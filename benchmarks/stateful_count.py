"""Stateful count per key: records/s through ``group_by_key().count()``, and restore speed.

On a real broker (started here unless ``--bootstrap`` is given): N records over
K keys on 4 partitions are counted by streamloop with the record cache on
(10 MiB) and off, in-memory and RocksDB stores; the run ends when the counts in
the store are complete. Then a fresh client with an empty ``state.dir`` restores
the in-memory store from its changelog, timed from start to RUNNING-with-all-
counts. Figures: records/s (median of the rounds), output updates written (the
cache's coalescing), restore records/s. Peers (faust tables, quixstreams state,
Kafka Streams) are measured against the same data by ``benchmarks/compare.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamloop import ClientState, KafkaStreams, StreamsBuilder
from streamloop.serdes import LongSerde, StringSerde
from streamloop.state import Materialized
from streamloop.transport import open_transport
from tests.support.cluster import Cluster

PARTITIONS = 4
STR, LONG = StringSerde(), LongSerde()


def topology(source: str, sink: str, persistent: bool):
    builder = StreamsBuilder()
    (builder.stream(source, key_serde=STR, value_serde=STR)
            .group_by_key()
            .count(materialized=Materialized("counts", persistent=persistent))
            .to_stream()
            .to(sink, key_serde=STR, value_serde=LONG))
    return builder.build()


async def wait_counted(streams: KafkaStreams, keys: int, total: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if streams.state is ClientState.RUNNING:
            store = streams.store("counts")
            if sum(v for _, v in store.all()) == total and store.approximate_num_entries() >= 0:
                return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"counts incomplete after {timeout} s")


async def run_once(bootstrap: str, cluster: Cluster, source: str, records: int, keys: int, cache: int,
                   persistent: bool) -> tuple[float, int, float]:
    app = f"bench-count-{uuid.uuid4().hex[:6]}"
    sink = f"{app}-out"
    await cluster.create_topics({sink: PARTITIONS})
    config = {"application.id": app, "bootstrap.servers": bootstrap, "cache.max.bytes.buffering": cache,
              "commit.interval.ms": 1000, "linger.ms": 5}
    with tempfile.TemporaryDirectory() as state_dir:
        streams = KafkaStreams(topology(source, sink, persistent), {**config, "state.dir": state_dir})
        started = time.perf_counter()
        async with streams:
            await wait_counted(streams, keys, records, 300)
            elapsed = time.perf_counter() - started
        updates = len(await cluster.read_all(sink))
    # Restore: a new client with an empty state.dir rebuilds the store from the changelog.
    with tempfile.TemporaryDirectory() as state_dir:
        streams = KafkaStreams(topology(source, sink, False), {**config, "state.dir": state_dir})
        started = time.perf_counter()
        async with streams:
            await wait_counted(streams, keys, records, 300)
            restore = time.perf_counter() - started
    return records / elapsed, updates, restore


async def main_async(bootstrap: str, records: int, keys: int, rounds: int) -> None:
    cluster = Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)
    source = f"bench-count-in-{uuid.uuid4().hex[:6]}"
    await cluster.create_topics({source: PARTITIONS})
    await cluster.produce(source, ((f"key-{i % keys}", f"v{i}") for i in range(records)), STR, STR,
                          partitions=PARTITIONS)
    print(f"{records} records, {keys} keys, {PARTITIONS} partitions, {rounds} round(s); broker {bootstrap}")
    print(f"{'variant':<28}{'records/s':>12}{'updates out':>14}{'restore s':>11}")
    for label, cache, persistent in (("cache 10 MiB, in-memory", 10 << 20, False),
                                     ("cache 10 MiB, RocksDB", 10 << 20, True),
                                     ("cache off, in-memory", 0, False)):
        results = [await run_once(bootstrap, cluster, source, records, keys, cache, persistent)
                   for _ in range(rounds)]
        rate = statistics.median(r[0] for r in results)
        restore = statistics.median(r[2] for r in results)
        print(f"{label:<28}{rate:>12,.0f}{results[0][1]:>14,}{restore:>11.2f}")
    print("restore time includes start-up and the group join; the changelog holds one update per key "
          "per flush with the cache on, one per record with it off")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", help="an existing broker; default: start the test broker")
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    if args.bootstrap:
        asyncio.run(main_async(args.bootstrap, args.records, args.keys, args.rounds))
        return
    from tests.support.kafka_broker import KafkaBroker

    with KafkaBroker() as broker:
        asyncio.run(main_async(broker.bootstrap, args.records, args.keys, args.rounds))


if __name__ == "__main__":
    main()
