"""``read="executors"`` on a standalone Spark cluster (a Master and two Workers from the pyspark
install), short enough for ``make test``: the executors read the ranges from Kafka themselves and
give the driver path's output for the same input (the driver path runs beside it, in a process
of its own on ``local[2]``); a record that does not decode reaches the deserialization handler
(its dead letter is the one the driver path sends); and a worker killed mid-job loses nothing:
Spark reads its ranges again from the same offsets (and, writing the sink itself, writes their
records again), and the input is committed to its end only after the output is out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from streamloop.records import TopicPartition
from streamloop.serdes import BytesSerde, JsonSerde, StringSerde
from streamloop.testing import eventually, eventually_async
from streamloop.transport import open_transport
from tests.support.cluster import Cluster, committed_offset
from tests.support.spark_cluster import SparkCluster
from tests.support.spark_enrichment import EnrichmentProcess, check_output, customer, order

# About a minute on a quiet 2-core machine (a Master, two Workers, their executors and a local
# driver path); 3 minutes under load 14. WAIT is long for the first output: a session's first range
# (Spark's Python workers and their Kafka clients starting) took past 120 s once when the machine
# also ran another test suite.
pytestmark = [pytest.mark.asyncio, pytest.mark.kafka]

KEY, JSON = StringSerde(), JsonSerde()
WAIT = 240
PARTITIONS = 2
COUNT = 600
BAD = 250  # the order whose value is not JSON
HANDLER = {"default.deserialization.exception.handler": "streamloop.handlers.LogAndContinueExceptionHandler"}


@pytest.mark.timeout(900)
async def test_the_executors_on_a_cluster_give_the_driver_paths_output_through_a_bad_record_and_a_killed_worker(
        kafka_bootstrap: str, names: Any, tmp_path: Path) -> None:
    kafka = Cluster(open_transport({"bootstrap.servers": kafka_bootstrap}), kafka_bootstrap)
    source = names("orders")
    sinks = {"driver": names("enriched-driver"), "executors": names("enriched-executors")}
    dead = {"driver": names("dlq-driver"), "executors": names("dlq-executors")}
    apps = {"driver": names.app + "-driver", "executors": names.app + "-executors"}
    await kafka.create_topics({source: PARTITIONS, **{t: 1 for t in [*sinks.values(), *dead.values()]}})
    values = [b"{not json" if i == BAD else JSON.serialize(order(i)) for i in range(COUNT)]
    await kafka.produce(source, [(customer(i), values[i]) for i in range(COUNT)], KEY, BytesSerde(),
                        partitions=PARTITIONS)
    ends = await kafka.end_offsets([TopicPartition(source, p) for p in range(PARTITIONS)])

    async def committed_to_end(app: str) -> bool:
        return all([await committed_offset(kafka, app, tp) == end for tp, end in ends.items()])

    def start(path: str, settings: dict[str, Any]) -> EnrichmentProcess:
        settings = {**settings, **HANDLER, "errors.dead.letter.queue.topic.name": dead[path]}
        return EnrichmentProcess(tmp_path / f"{path}.out", "--bootstrap", kafka.bootstrap, "--application-id",
                                 apps[path], "--source", source, "--sink", sinks[path], "--settings",
                                 json.dumps(settings), "--max-records", "100", "--max-wait-ms", "200",
                                 "--slow-ms", "5")

    with SparkCluster(workers=2) as spark:
        running = {"driver": start("driver", {"spark.master": "local[2]", "spark.batch.read": "driver"})}
        try:
            running["executors"] = start("executors", {**spark.client_settings(), "spark.batch.read": "executors"})
            eventually(lambda: spark.executor_pids(0) and spark.executor_pids(1), WAIT, "both executors")
            assert await kafka.read(sinks["executors"], 1, timeout=WAIT)
            spark.kill_worker(0)
            for path, app in apps.items():
                await eventually_async(lambda app=app: committed_to_end(app), WAIT, f"{path}: all committed")
            # Read only now, to the end: the executors write the sink themselves, so a Spark task run
            # again after the kill writes its records twice (at-least-once).
            outputs = {path: await kafka.read_all(sink, timeout=WAIT) for path, sink in sinks.items()}
            letters = {path: await kafka.read_all(topic, timeout=WAIT) for path, topic in dead.items()}
            assert (spark.state() or {}).get("alive") == 1
        finally:
            codes = {path: app.stop() for path, app in running.items()}
    for path, app in running.items():
        assert codes[path] == 0, app.output()
        assert not app.events("handler"), app.output()
    decoded = {path: [(KEY.deserialize(r.key), JSON.deserialize(r.value)) for r in records]
               for path, records in outputs.items()}
    for path, records in decoded.items():
        # Every order but the bad one, each enriched right: the bad one went to the handler alone.
        assert check_output(records, COUNT) == [f"1 of {COUNT} ids missing (first: [{BAD}])"], path
    as_set = {path: {(k, json.dumps(v, sort_keys=True)) for k, v in records} for path, records in decoded.items()}
    assert as_set["executors"] == as_set["driver"]  # the same output, duplicates aside
    assert len(decoded["driver"]) == COUNT - 1  # the driver path wrote each once
    for path, records in letters.items():
        assert [(r.key, r.value) for r in records] == [(customer(BAD).encode(), b"{not json")], path
        headers = dict(records[0].headers)
        assert headers["__streams.errors.topic"] == source.encode(), path
