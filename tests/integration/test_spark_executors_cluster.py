"""``read="executors"`` on a standalone Spark cluster (a Master and two Workers from the pyspark
install): the executors read the ranges from Kafka, the enrichment's output is the driver path's
(every record checked), and a worker killed mid-job loses nothing: Spark reads its ranges again
from the same offsets (and, writing the sink itself, writes their records again), and the input is
committed to its end only after the output is out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from streamloop.records import TopicPartition
from streamloop.serdes import JsonSerde, StringSerde
from streamloop.testing import eventually, eventually_async
from streamloop.transport import open_transport
from tests.support.cluster import Cluster, committed_offset
from tests.support.spark_cluster import SparkCluster
from tests.support.spark_enrichment import EnrichmentProcess, check_output, order

# About 50 s on 2 cores (a Master, two Workers and their executors): behind `slow`, so that
# `make test` stays under 8 minutes; `make test-slow` runs it. Its first run, from a checkout
# whose engine the workers could reach only through PYTHONPATH, got no output; it passes since.
pytestmark = [pytest.mark.asyncio, pytest.mark.kafka, pytest.mark.slow]

KEY, JSON = StringSerde(), JsonSerde()
WAIT = 120
PARTITIONS = 2


@pytest.mark.timeout(300)
async def test_the_executors_read_on_a_cluster_and_a_worker_killed_mid_job_loses_nothing(
        kafka_bootstrap: str, names: Any, tmp_path: Path) -> None:
    kafka = Cluster(open_transport({"bootstrap.servers": kafka_bootstrap}), kafka_bootstrap)
    count = 1_200
    source, sink = names("orders"), names("enriched")
    await kafka.create_topics({source: PARTITIONS, sink: 1})
    await kafka.produce(source, [(order(i)["customer"], order(i)) for i in range(count)], KEY, JSON,
                        partitions=PARTITIONS)
    ends = await kafka.end_offsets([TopicPartition(source, p) for p in range(PARTITIONS)])

    async def committed_to_end() -> bool:
        return all([await committed_offset(kafka, names.app, tp) == end for tp, end in ends.items()])

    with SparkCluster(workers=2) as spark:
        settings = {**spark.client_settings(), "spark.batch.read": "executors"}
        app = EnrichmentProcess(tmp_path / "app.out", "--bootstrap", kafka.bootstrap, "--application-id", names.app,
                                "--source", source, "--sink", sink, "--settings", json.dumps(settings),
                                "--max-records", "200", "--max-wait-ms", "200", "--slow-ms", "5")
        try:
            eventually(lambda: spark.executor_pids(0) and spark.executor_pids(1), WAIT, "both executors")
            assert await kafka.read(sink, 1, timeout=WAIT)
            spark.kill_worker(0)
            await eventually_async(committed_to_end, WAIT, "all committed")
            # Read only now, to the end: the executors write the sink themselves, so a Spark task run
            # again after the kill writes its records twice, and `count` records may be read before
            # the last range's (at-least-once).
            output = await kafka.read_all(sink, timeout=WAIT)
            assert (spark.state() or {}).get("alive") == 1
        finally:
            code = app.stop()
    assert code == 0, app.output()
    assert not app.events("handler"), app.output()
    records = [(KEY.deserialize(r.key), JSON.deserialize(r.value)) for r in output]
    assert check_output(records, count) == []  # every order once at least, each enriched right
