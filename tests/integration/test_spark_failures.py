"""Spark failures on a standalone cluster go through the task's handling like any processor error:
a worker lost mid-job is Spark's to recover (or, when no worker is left, the batch's timeout
cancels the job and the task retries it under ``task.timeout.ms``); a job that raises goes to the
uncaught-exception handler at once, and nothing is committed past the batch that failed."""

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

# Each test starts a cluster and a child app with its own Spark driver: minutes on 2 cores, so they
# run with `make test-slow`; `make test` runs the cluster test and the classifier's unit tests.
pytestmark = [pytest.mark.asyncio, pytest.mark.kafka, pytest.mark.slow]

KEY, JSON = StringSerde(), JsonSerde()
WAIT = 120


async def orders_topic(kafka: Cluster, names: Any, count: int, partitions: int) -> tuple[str, str]:
    source, sink = names("orders"), names("enriched")
    await kafka.create_topics({source: partitions, sink: 1})
    await kafka.produce(source, [(order(i)["customer"], order(i)) for i in range(count)], KEY, JSON,
                        partitions=partitions)
    return source, sink


def start_app(tmp_path: Path, kafka: Cluster, app: str, source: str, sink: str, settings: dict[str, Any],
              *extra: str) -> EnrichmentProcess:
    return EnrichmentProcess(tmp_path / f"{app}.out", "--bootstrap", kafka.bootstrap, "--application-id", app,
                             "--source", source, "--sink", sink, "--settings", json.dumps(settings), *extra)


async def committed_to_end(kafka: Cluster, app: str, source: str, partitions: int) -> bool:
    ends = await kafka.end_offsets([TopicPartition(source, p) for p in range(partitions)])
    return all([await committed_offset(kafka, app, tp) == end for tp, end in ends.items()])


def decoded(records: list[Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(KEY.deserialize(r.key), JSON.deserialize(r.value)) for r in records]


@pytest.fixture
def kafka(kafka_bootstrap: str) -> Cluster:
    return Cluster(open_transport({"bootstrap.servers": kafka_bootstrap}), kafka_bootstrap)


async def test_a_worker_killed_mid_job_loses_nothing(kafka: Cluster, names: Any, tmp_path: Path) -> None:
    count = 1_200
    source, sink = await orders_topic(kafka, names, count, partitions=2)
    with SparkCluster(workers=2) as spark:
        app = start_app(tmp_path, kafka, names.app, source, sink, spark.client_settings(),
                        "--max-records", "300", "--max-wait-ms", "200", "--slow-ms", "5")
        try:
            # Batches run one after the other, each ~1 s on the executors: kill a worker (and its
            # executor) as soon as both executors are up and the first output is out.
            eventually(lambda: spark.executor_pids(0) and spark.executor_pids(1), WAIT, "both executors")
            first = await kafka.read(sink, 1, timeout=WAIT)
            assert first
            spark.kill_worker(0)
            output = await kafka.read(sink, count, timeout=WAIT)
            await eventually_async(lambda: committed_to_end(kafka, names.app, source, 2), WAIT, "all committed")
            assert spark.state() is not None
            assert spark.state()["alive"] == 1  # type: ignore[index]
        finally:
            code = app.stop()
    assert code == 0, app.output()
    assert not app.events("handler"), app.output()
    assert check_output(decoded(output), count) == []


@pytest.mark.timeout(240)
async def test_the_only_worker_lost_mid_job_is_a_timeout_retried_until_a_worker_is_back(
        kafka: Cluster, names: Any, tmp_path: Path) -> None:
    count = 600
    source, sink = await orders_topic(kafka, names, count, partitions=1)
    # A fresh executor's first job (JVM warm-up, the broadcast) must fit in the batch timeout.
    settings = {"spark.batch.timeout.ms": 10_000, "task.timeout.ms": 120_000, "retry.backoff.ms": 200}
    with SparkCluster(workers=1) as spark:
        app = start_app(tmp_path, kafka, names.app, source, sink, {**spark.client_settings(), **settings},
                        "--max-records", "200", "--max-wait-ms", "200", "--slow-ms", "5")
        try:
            eventually(lambda: spark.executor_pids(0), WAIT, "the executor")
            await kafka.read(sink, 1, timeout=WAIT)
            spark.kill_worker(0)
            # With no executor the running batch cannot end; its timeout cancels the job and the
            # task retries it (and keeps retrying while no worker is there).
            eventually(lambda: "will retry in" in app.output(400), WAIT, "a retried batch")
            spark.add_worker()
            spark.wait_for_workers(1)
            try:
                output = await kafka.read(sink, count, timeout=WAIT)
            except TimeoutError as exc:
                raise AssertionError(f"{exc}\n{app.output(60)}\n{spark.logs()}") from exc
            await eventually_async(lambda: committed_to_end(kafka, names.app, source, 1), WAIT, "all committed")
        finally:
            code = app.stop()
    assert code == 0, app.output()
    assert not app.events("handler"), app.output()
    assert check_output(decoded(output), count) == []


async def test_a_job_that_raises_goes_to_the_uncaught_handler_and_nothing_past_its_batch_is_committed(
        kafka: Cluster, names: Any, tmp_path: Path) -> None:
    count, bad = 800, 500
    source, sink = await orders_topic(kafka, names, count, partitions=1)
    with SparkCluster(workers=1) as spark:
        # A long task.timeout.ms: a retry of this error would keep the handler waiting past WAIT.
        settings = {**spark.client_settings(), "task.timeout.ms": 600_000}
        app = start_app(tmp_path, kafka, names.app, source, sink, settings,
                        "--max-records", "250", "--max-wait-ms", "60000", "--fail-at", str(bad))
        try:
            eventually(lambda: app.events("final"), WAIT, "the client to stop on the handler's answer")
        finally:
            code = app.stop()
    assert code == 0, app.output()
    handled = app.events("handler")
    assert len(handled) == 1, app.output()
    # The thread's error, from the stage's, from the JVM's: raise_error ran on an executor.
    assert "SparkBatchError" in handled[0]["chain"], handled
    assert "TaskTimeoutError" not in handled[0]["chain"]
    assert "order 500 is bad" in handled[0]["error"]
    assert [e["state"] for e in app.events("final")] == ["ERROR"]
    # Batches of 250 in one partition: the one holding order 500 starts at offset 500.
    assert await committed_offset(kafka, names.app, TopicPartition(source, 0)) in (None, 0, 250, 500)
    ids = {value["id"] for _key, value in decoded(await kafka.read_all(sink))}
    assert ids <= set(range(500))
