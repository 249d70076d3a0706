"""A Spark stage pointed at a standalone Spark cluster (a Master and two Workers on loopback, from
the pyspark install) with ``spark.master=spark://…``: the order enrichment runs on the cluster's
executors, every output record is right, and the input is committed to its end."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamloop.records import TopicPartition
from streamloop.serdes import JsonSerde, StringSerde
from streamloop.testing import eventually_async
from streamloop.transport import open_transport
from tests.support.cluster import Cluster, committed_offset
from tests.support.spark_cluster import SparkCluster
from tests.support.spark_enrichment import EnrichmentProcess, check_output, order

pytestmark = [pytest.mark.asyncio, pytest.mark.kafka]

KEY, JSON = StringSerde(), JsonSerde()
# A first job on the cluster starts the executors' Python workers, which import the stage's
# modules: alone it comes in seconds, but in make test at load 11 one job's first stage was still
# running 72 s after it started (twice in one day, the output read then timed out at 90 s).
WAIT = 240
ORDERS = 2_000
PARTITIONS = 2


@pytest.fixture(scope="module")
def spark_cluster() -> Iterator[SparkCluster]:
    with SparkCluster(workers=2) as cluster:
        yield cluster


async def produce_orders(kafka: Cluster, names: Any, count: int) -> tuple[str, str]:
    source, sink = names("orders"), names("enriched")
    await kafka.create_topics({source: PARTITIONS, sink: 1})
    await kafka.produce(source, [(order(i)["customer"], order(i)) for i in range(count)], KEY, JSON,
                        partitions=PARTITIONS)
    return source, sink


async def all_committed(kafka: Cluster, app: str, source: str) -> bool:
    ends = await kafka.end_offsets([TopicPartition(source, p) for p in range(PARTITIONS)])
    for tp, end in ends.items():
        if await committed_offset(kafka, app, tp) != end:
            return False
    return True


def start_app(tmp_path: Path, kafka: Cluster, app: str, source: str, sink: str, settings: dict[str, Any],
              *extra: str) -> EnrichmentProcess:
    return EnrichmentProcess(tmp_path / f"{app}.out", "--bootstrap", kafka.bootstrap, "--application-id", app,
                             "--source", source, "--sink", sink, "--settings", json.dumps(settings), *extra)


@pytest.mark.timeout(600)
async def test_the_enrichment_runs_on_a_standalone_cluster_and_every_record_is_right(
        kafka_bootstrap: str, names: Any, spark_cluster: SparkCluster, tmp_path: Path) -> None:
    kafka = Cluster(open_transport({"bootstrap.servers": kafka_bootstrap}), kafka_bootstrap)
    source, sink = await produce_orders(kafka, names, ORDERS)
    app = start_app(tmp_path, kafka, names.app, source, sink, spark_cluster.client_settings(),
                    "--max-records", "500", "--max-wait-ms", "200")
    try:
        output = await kafka.read(sink, ORDERS, timeout=WAIT)
        await eventually_async(lambda: all_committed(kafka, names.app, source), WAIT, "input committed to its end")
        # The client's application ran on the cluster, on both workers' executors.
        apps = (spark_cluster.state() or {}).get("activeapps", [])
        assert [a["cores"] for a in apps] == [2], apps
    finally:
        code = app.stop()
    assert code == 0, app.output()
    assert [e["state"] for e in app.events("final")] == ["NOT_RUNNING"]
    assert not app.events("handler")
    records = [(KEY.deserialize(r.key), JSON.deserialize(r.value)) for r in output]
    assert check_output(records, ORDERS) == []
    assert len(records) == ORDERS  # a clean run: no record twice
