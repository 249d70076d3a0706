"""Exactly-once cost: records/s of the stateless and stateful pipelines under exactly_once_v2 and
at_least_once, same run, same data, with the ratio.

On a real broker (started here unless ``--bootstrap`` is given): N records on 4
partitions, one stream thread. Stateless: ``map_values`` to a sink; stateful:
``group_by_key().count()`` with the record cache on. A run ends when the sink
(stateless) or the store (stateful) has everything. Rounds alternate the two
guarantees; the figure is the median. Under exactly-once ``commit.interval.ms``
keeps its default of 100 ms (a transaction per task per 100 ms); at-least-once
keeps its 30 s.
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

from engine import ClientState, KafkaStreams, StreamsBuilder  # noqa: E402
from engine.serdes import IntegerSerde, JsonSerde, LongSerde, StringSerde  # noqa: E402
from engine.state import Materialized  # noqa: E402
from engine.transport import open_transport  # noqa: E402
from engine.transport.base import ProducerSettings  # noqa: E402
from tests.support.cluster import Cluster  # noqa: E402

PARTITIONS = 4
STR, LONG, INT, JSON = StringSerde(), LongSerde(), IntegerSerde(), JsonSerde()
GUARANTEES = ("at_least_once", "exactly_once_v2")


def stateless(source: str, sink: str, done: list[int]):
    def double(value: dict) -> dict:
        done[0] += 1
        return {"n": value["n"], "double": value["n"] * 2}

    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .map_values(double)
            .to(sink, key_serde=INT, value_serde=JSON))
    return builder.build()


def stateful(source: str, sink: str):
    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .group_by_key()
            .count(materialized=Materialized("counts", persistent=False))
            .to_stream()
            .to(sink, key_serde=INT, value_serde=LONG))
    return builder.build()


async def run_once(bootstrap: str, cluster: Cluster, source: str, records: int, guarantee: str,
                   kind: str) -> float:
    app = f"bench-eos-{uuid.uuid4().hex[:6]}"
    sink = f"{app}-out"
    await cluster.create_topics({sink: PARTITIONS})
    config = {"application.id": app, "bootstrap.servers": bootstrap, "processing.guarantee": guarantee,
              "linger.ms": 5, "poll.ms": 50}
    with tempfile.TemporaryDirectory() as state_dir:
        done = [0]
        topology = stateless(source, sink, done) if kind == "stateless" else stateful(source, sink)
        streams = KafkaStreams(topology, {**config, "state.dir": state_dir})
        started = time.perf_counter()
        async with streams:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                if kind == "stateless":
                    if done[0] >= records:
                        break
                elif streams.state is ClientState.RUNNING:
                    store = streams.store("counts")
                    if sum(v for _, v in store.all()) == records:
                        break
                await asyncio.sleep(0.02)
            else:
                raise TimeoutError(f"{kind} {guarantee} did not finish within 300 s")
            elapsed = time.perf_counter() - started
    return records / elapsed


async def main_async(bootstrap: str, records: int, rounds: int) -> None:
    cluster = Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)
    source = f"bench-eos-in-{uuid.uuid4().hex[:6]}"
    await cluster.create_topics({source: PARTITIONS})
    producer = cluster.transport.producer(ProducerSettings(client_id="bench-input"))
    await producer.start()
    for i in range(records):
        producer.append(source, i % PARTITIONS, INT.serialize(i % 1000), JSON.serialize({"n": i}), None, ())
    await producer.flush()
    await producer.close()
    print(f"{records} records, {PARTITIONS} partitions, 1 stream thread, {rounds} round(s) alternating; "
          f"broker {bootstrap}")
    print(f"{'pipeline':<12}{'at_least_once':>16}{'exactly_once_v2':>18}{'ratio':>8}")
    for kind in ("stateless", "stateful"):
        rates: dict[str, list[float]] = {g: [] for g in GUARANTEES}
        for _ in range(rounds):
            for guarantee in GUARANTEES:
                rates[guarantee].append(await run_once(bootstrap, cluster, source, records, guarantee, kind))
        alos, eos = (statistics.median(rates[g]) for g in GUARANTEES)
        print(f"{kind:<12}{alos:>16,.0f}{eos:>18,.0f}{eos / alos:>8.2f}")
    print("records/s from start (including the group join) to everything done; ratio = exactly_once_v2 / "
          "at_least_once")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", help="an existing broker; default: start the test broker")
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    if args.bootstrap:
        asyncio.run(main_async(args.bootstrap, args.records, args.rounds))
        return
    from tests.support.kafka_broker import KafkaBroker

    with KafkaBroker() as broker:
        asyncio.run(main_async(broker.bootstrap, args.records, args.rounds))


if __name__ == "__main__":
    main()
