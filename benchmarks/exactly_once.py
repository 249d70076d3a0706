"""Exactly-once cost: records/s of the stateless and stateful pipelines under exactly_once_v2 and
at_least_once, same run, same data, with the ratio.

On a real broker (started here unless ``--bootstrap`` is given): N records on 4
partitions, one stream thread. Stateless: ``map_values`` to a sink; stateful:
``group_by_key().count()`` with the record cache on. Throughput is measured from
the first record the pipeline sees to the last (group join and restore left out,
as in ``stateless_pipeline.py``); the commits in between are paid for. Rounds alternate the two
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

from streamloop import ClientState, KafkaStreams, StreamsBuilder
from streamloop.serdes import IntegerSerde, JsonSerde, LongSerde, StringSerde
from streamloop.state import Materialized
from streamloop.transport import open_transport
from streamloop.transport.base import ProducerSettings
from tests.support.cluster import Cluster

PARTITIONS = 4
STR, LONG, INT, JSON = StringSerde(), LongSerde(), IntegerSerde(), JsonSerde()
GUARANTEES = ("at_least_once", "exactly_once_v2")


class Progress:
    """Counts records seen by the pipeline, with the times of the first and the last one."""

    def __init__(self) -> None:
        self.count = 0
        self.first = 0.0
        self.last = 0.0

    def __call__(self, _key: object, _value: object) -> None:
        now = time.perf_counter()
        if self.count == 0:
            self.first = now
        self.count += 1
        self.last = now


def stateless(source: str, sink: str, progress: Progress):
    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .peek(progress)
            .map_values(lambda value: {"n": value["n"], "double": value["n"] * 2})
            .to(sink, key_serde=INT, value_serde=JSON))
    return builder.build()


def stateful(source: str, sink: str, progress: Progress):
    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .peek(progress)
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
        progress = Progress()
        topology = (stateless if kind == "stateless" else stateful)(source, sink, progress)
        streams = KafkaStreams(topology, {**config, "state.dir": state_dir})
        async with streams:
            deadline = time.monotonic() + 300
            while progress.count < records:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{kind} {guarantee} did not finish within 300 s")
                await asyncio.sleep(0.02)  # a benchmark polls its own progress; tests never sleep
            if kind == "stateful":
                while streams.state is not ClientState.RUNNING or sum(  # noqa: ASYNC110 - polls its own progress
                        v for _, v in streams.store("counts").all()) != records:
                    await asyncio.sleep(0.02)
    return records / (progress.last - progress.first)


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
    print("records/s from the first record processed to the last; ratio = exactly_once_v2 / at_least_once")


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
