"""KIP-572 cost to the innocent: throughput of one task while another task of the same stream
thread keeps timing out, against the same task's rate when nothing times out.

Partition 1's records pass straight through an async processor; partition 0's records time out
(``asyncio.TimeoutError``) on every attempt, so its task is retried under ``task.timeout.ms``
the whole run. The target (issue 5) is that partition 1 keeps at least 80% of its unimpeded rate.
Run: ``python benchmarks/task_timeouts.py`` (real broker, started here) or ``--memory``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamloop import KafkaStreams, StreamsBuilder
from streamloop.serdes import IntegerSerde, JsonSerde
from streamloop.transport import open_transport
from tests.support.cluster import Cluster

INT, JSON = IntegerSerde(), JsonSerde()


async def rate_of_partition_one(bootstrap: str, records: int, sabotage: bool) -> float:
    run = uuid.uuid4().hex[:6]
    source, sink = f"timeouts-in-{run}", f"timeouts-out-{run}"
    cluster = Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)
    await cluster.create_topics({source: 2, sink: 1})
    data = [(1, {"p": 1, "i": i}) for i in range(records)] + [(0, {"p": 0, "i": i}) for i in range(100)]
    await cluster.produce(source, data, INT, JSON, partitions=2)

    async def call_service(value: dict) -> dict:
        if sabotage and value["p"] == 0:
            raise TimeoutError("the service for partition 0 is down")
        return value

    # Both runs have the same graph; only partition 1's records reach the sink.
    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .map_values(call_service)
            .filter(lambda _k, v: v["p"] == 1)
            .to(sink, key_serde=INT, value_serde=JSON))
    streams = KafkaStreams(builder.build(), {
        "application.id": f"timeouts-{run}", "bootstrap.servers": bootstrap, "num.stream.threads": 1,
        "task.timeout.ms": 600_000, "retry.backoff.ms": 10, "retry.backoff.max.ms": 100, "commit.interval.ms": 1000,
    })
    async with streams:
        reader = cluster.transport.reader("bench-reader")
        await reader.start()
        from streamloop.records import TopicPartition

        tp = TopicPartition(sink, 0)
        first = None
        deadline = time.monotonic() + 300
        while True:
            end = (await reader.end_offsets([tp]))[tp]
            now = time.monotonic()
            if end and first is None:
                first = now
            if end >= records:
                break
            if now > deadline:
                raise TimeoutError(f"{end} of {records} records after 300 s")
            await asyncio.sleep(0.01)
        await reader.close()
    return records / max(now - (first or now), 1e-6)


async def main_async(bootstrap: str, records: int, runs: int) -> None:
    print(f"{records} records on partition 1; partition 0's task times out on every attempt (sabotaged run);"
          f" {runs} alternating runs each, medians\n")
    clean: list[float] = []
    impeded: list[float] = []
    for _ in range(runs):
        clean.append(await rate_of_partition_one(bootstrap, records, sabotage=False))
        impeded.append(await rate_of_partition_one(bootstrap, records, sabotage=True))
    for label, rates in (("partition 1 alone", clean), ("partition 1 beside a timing-out task", impeded)):
        print(f"  {label:<38} median {statistics.median(rates):>9,.0f} records/s "
              f"(min {min(rates):,.0f}, max {max(rates):,.0f})")
    print(f"\n  ratio of medians: {statistics.median(impeded) / statistics.median(clean):.2f} (target >= 0.80)")


def main() -> None:
    import logging

    logging.basicConfig(level=logging.ERROR)  # the expected timeout warnings would drown the figures
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", help="an existing broker; default: start the test broker")
    parser.add_argument("--memory", action="store_true", help="use the embedded broker")
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if args.memory:
        asyncio.run(main_async(f"memory://timeouts-bench-{uuid.uuid4().hex[:6]}", args.records, args.runs))
    elif args.bootstrap:
        asyncio.run(main_async(args.bootstrap, args.records, args.runs))
    else:
        from tests.support.kafka_broker import KafkaBroker

        with KafkaBroker() as broker:
            asyncio.run(main_async(broker.bootstrap, args.records, args.runs))


if __name__ == "__main__":
    main()
