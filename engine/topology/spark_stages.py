"""The Spark stages of the DSL (``KStream.spark_batch``, ``KStream.to_spark``): a processor node
that runs micro-batches of a task's records on Spark, with the checks made when it is added
(where executors may read Kafka, and that no Spark stage follows another in a sub-topology).

PySpark is imported only when a stage is added: a topology without one never needs it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from streamloop.errors import TopologyError
from streamloop.topology.specs import NodeKind

if TYPE_CHECKING:
    from streamloop.topology.builder import KStream

__all__ = ["ROWS", "spark_batch_stage", "spark_sink_stage"]

ROWS = "dict (a Spark stage's rows)"
"""What the values after a stage are: a batch's rows are new records, no serde of the input fits
them, and each value is a dict."""


def spark_batch_stage(stream: KStream, fn: Callable[[Any], Any], max_records: int | None, max_wait_ms: int | None,
                      max_batches_in_flight: int | None, key_column: str, value_columns: Sequence[str] | None,
                      schema: Any, name: str | None, read: str | None) -> str:
    """``stream.spark_batch(...)``: adds the stage; returns its node's name (the stream of its
    result rows goes on from it, with values of kind ``ROWS``)."""
    from streamloop.spark.session import require_pyspark
    from streamloop.spark.stage import BatchSettings, SparkBatchStage, transform_job

    require_pyspark("spark_batch()")
    if not callable(fn):
        raise TypeError(f"spark_batch() needs a callable, got {fn!r}")
    node_name = stream._builder._name(name, "KSTREAM-SPARK-BATCH")
    settings = BatchSettings(max_records, max_wait_ms, max_batches_in_flight)
    settings.check(node_name)
    columns = None if value_columns is None else tuple(value_columns)
    job = transform_job(fn, node_name)
    _check_read(stream, node_name, read, schema)
    return _add_stage(stream, node_name, settings, lambda: SparkBatchStage(
        node_name, job, settings, key_column, columns, schema, read=read))


def spark_sink_stage(stream: KStream, path: str | None, table: str | None, format: str, mode: str,
                     options: Mapping[str, str] | None, max_records: int | None, max_wait_ms: int | None,
                     max_batches_in_flight: int | None, key_column: str, schema: Any, name: str | None,
                     read: str | None) -> None:
    """``stream.to_spark(...)``: a terminal stage writing each batch with Spark."""
    from streamloop.spark.session import require_pyspark
    from streamloop.spark.sink import WRITE_MODES, write_job
    from streamloop.spark.stage import BatchSettings, SparkBatchStage

    require_pyspark("to_spark()")
    node_name = stream._builder._name(name, "KSTREAM-SPARK-SINK")
    if (path is None) == (table is None):
        raise TopologyError(f"Spark sink '{node_name}' needs exactly one of path= or table=")
    if mode not in WRITE_MODES:
        raise TopologyError(f"mode of Spark sink '{node_name}' must be one of {list(WRITE_MODES)}, got {mode!r}")
    settings = BatchSettings(max_records, max_wait_ms, max_batches_in_flight)
    settings.check(node_name)
    job = write_job(path, table, format, mode, options)
    _check_read(stream, node_name, read, schema)
    _add_stage(stream, node_name, settings, lambda: SparkBatchStage(
        node_name, job, settings, key_column, None, schema, read=read))


def _check_read(stream: KStream, node_name: str, read: str | None, schema: Any) -> None:
    """``read=`` of a Spark stage: executors read Kafka only for a stage right after its
    source (nothing in between runs on the executors), and need the columns before reading."""
    from streamloop.spark.kafka_source import StageRead, check_stage_read

    topology = stream._builder._topology
    spec = topology.spec(stream._node)
    after_source = spec.kind is NodeKind.SOURCE
    check_stage_read(node_name, read, after_source, len(spec.topics), schema)
    topology.spark_reads[node_name] = StageRead(read, after_source, len(spec.topics), schema is not None)


def _add_stage(stream: KStream, node_name: str, settings: Any, supplier: Callable[[], Any]) -> str:
    builder = stream._builder
    topology = builder._topology
    upstream = _upstream_spark_stage(stream)
    if upstream is not None:
        # A batch's rows leave with one record, so they would reach the next stage one at a
        # time, each waiting for a batch of its own.
        raise TopologyError(
            f"Spark stage '{node_name}' follows Spark stage '{upstream}' in the same sub-topology; "
            "write the first one's output to a topic and read it again in between")
    topology.add_processor(node_name, supplier, stream._node)
    builder._spark_stages.add(node_name)
    # Records of a batch wait in flight together; "key" ordering would let only one per key in.
    topology.set_concurrency(node_name, settings.window, "partition")
    return node_name


def _upstream_spark_stage(stream: KStream) -> str | None:
    builder = stream._builder
    topology = builder._topology
    pending, seen = [stream._node], set()
    while pending:
        name = pending.pop()
        if name in builder._spark_stages:
            return name
        if name not in seen:
            seen.add(name)
            pending.extend(topology.spec(name).parents)
    return None
