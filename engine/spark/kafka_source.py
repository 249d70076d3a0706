"""Spark's executors read a task's offset range from Kafka themselves (``read="executors"``).

On the driver path (``streamloop.tasks.bulk``) every record passes through this process: fetched,
decoded, framed through Arrow. With ``spark.batch.read=executors`` (or a stage's ``read=``), the
task's loop (``streamloop.tasks.bulk_exec``) only picks an offset range of its partition
(``pick_range``) and runs a Spark job over a Python data source (``streamloop.spark.kafka_reader``)
whose reader, on an executor, fetches exactly that range with aiokafka, decodes each record with
the stage's own serdes and aligns it to the stage's ``schema`` with ``schema.align``: the same
code the driver path runs, so the frame the stage's function sees is the same.

Records that do not decode, or do not fit the schema, are not null rows: the reader emits them
as a side output (``KIND`` set, with their raw bytes, headers and the serde's error), and one
more row per range (``CARRIER``) says how many records it read, the largest timestamp and which
record the range's output leaves with (the driver path's ``carrier_of`` rule). Only those few
rows come back to this process, where the task hands each failed record to its handler before
its position passes it.

This module imports no pyspark at import time: the builder checks ``read=`` with it.
"""

from __future__ import annotations

import base64
import copyreg
import pickle
import struct
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from streamloop import config as cfg
from streamloop.errors import ConfigError, TopologyError
from streamloop.records import TopicPartition
from streamloop.serdes import Serde

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from streamloop.topology.topology import Topology

READS = (cfg.SPARK_READ_DRIVER, cfg.SPARK_READ_EXECUTORS)
SOURCE_NAME = "streamloop_kafka_range"

# The side output's columns, after the schema's: named so that no user schema plausibly has them.
_P = "__streamloop_"
KIND, OFFSET, TIMESTAMP, RAW_KEY, RAW_VALUE, HEADERS, ERROR, COUNT, MAX_TIMESTAMP = (
    f"{_P}{name}" for name in ("kind", "offset", "timestamp", "raw_key", "raw_value", "headers", "error",
                              "count", "max_timestamp"))
SIDE_COLUMNS = (KIND, OFFSET, TIMESTAMP, RAW_KEY, RAW_VALUE, HEADERS, ERROR, COUNT, MAX_TIMESTAMP)
# The index of a row's range in a job of several ranges: a column of each row read, and the Spark
# partition a row of a row-wise function's output leaves from (one partition per range).
PART = f"{_P}range"
# What a side row is: a record whose key or value did not decode (the deserialization handler's),
# a record that does not fit the schema (the processing handler's), the range's summary.
KEY_FAILED, VALUE_FAILED, MISFIT, CARRIER = "key", "value", "schema", "carrier"
# Raw mode (a job that raised): every record of the range, as fetched, for the handlers.
RAW = "raw"


@dataclass(frozen=True, order=True)
class KafkaRange:
    """Offsets ``start`` (included) to ``end`` (excluded) of one partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def pick_range(tp: TopicPartition, position: int, end: int, max_records: int) -> KafkaRange | None:
    """The next range of ``tp`` for the executors: from the task's position to the partition's
    end offset (for a ``read_committed`` consumer, its last stable offset), at most
    ``max_records`` offsets; None when there is nothing past the position. Offsets, not records:
    transaction markers and aborted records take offsets too, so a range may hold fewer."""
    if max_records < 1:
        raise ValueError(f"max_records must be >= 1, got {max_records}")
    if position < 0 or end <= position:
        return None
    return KafkaRange(tp.topic, tp.partition, position, min(end, position + max_records))


@dataclass(frozen=True)
class ReadSpec:
    """What the executors need to read and decode ranges: picklable, shipped as a data source
    option. ``kafka``: aiokafka consumer keyword arguments (no group)."""

    kafka: Mapping[str, Any]
    ranges: tuple[KafkaRange, ...]
    key_serde: Serde
    value_serde: Serde
    key_column: str
    schema: Any  # a resolved StructType
    mode: str = "decode"  # or RAW
    # How long a reader waits for the broker without progress before it fails its Spark task.
    stall_ms: int = 60_000
    extra: Mapping[str, Any] = field(default_factory=dict)

    def encode(self) -> str:
        return encode_option(self)

    @staticmethod
    def decode(text: str) -> ReadSpec:
        spec = decode_option(text)
        assert isinstance(spec, ReadSpec)
        return spec


def encode_option(spec: object) -> str:
    """``spec`` as a data source option's text: cloudpickled, so that serdes defined in
    ``__main__`` travel by value."""
    from pyspark import cloudpickle

    _picklable_structs()
    return base64.b64encode(cloudpickle.dumps(spec)).decode("ascii")  # type: ignore[no-untyped-call]  # pyspark's vendored cloudpickle is untyped


def decode_option(text: str) -> Any:
    return pickle.loads(base64.b64decode(text))


# The sessions each of our data sources is registered with. Tasks of several stream threads start
# their first range at once, on worker threads: registering twice fails
# (DATA_SOURCE_ALREADY_EXISTS), so the check and the registration are one step.
_registered: dict[str, weakref.WeakSet[Any]] = {}
_registering = threading.Lock()


def register_source(session: Any, source: type) -> None:
    """Register the Python data source ``source`` with ``session`` (once per session; safe from any
    thread), and make ``session`` this thread's active one: Spark looks a Python data source up in
    the JVM thread's active session, which a worker thread other than the registering one lacks
    (a write then fails with DATA_SOURCE_NOT_FOUND). Call it before each use of the source."""
    name = source.name()  # type: ignore[attr-defined]  # a pyspark DataSource's classmethod
    _activate(session)
    with _registering:
        sessions = _registered.setdefault(name, weakref.WeakSet())
        if session in sessions:
            return
        try:
            session.dataSource.register(source)
        except Exception as exc:
            # Another wrapper of the same JVM session registered it already: that is what is wanted.
            if "DATA_SOURCE_ALREADY_EXISTS" not in str(exc):
                raise
        sessions.add(session)


def _activate(session: Any) -> None:
    jvm, jsession = getattr(session, "_jvm", None), getattr(session, "_jsparkSession", None)
    if jvm is not None and jsession is not None:  # Spark Classic (a Connect session has neither)
        jvm.org.apache.spark.sql.SparkSession.setActiveSession(jsession)


def _picklable_structs() -> None:
    """Built-in serdes keep a precompiled ``struct.Struct``, which does not pickle; it travels as
    its format and is compiled again on the executor."""
    copyreg.pickle(struct.Struct, _struct_by_format)


def _struct_by_format(compiled: struct.Struct) -> tuple[type[struct.Struct], tuple[str]]:
    return struct.Struct, (compiled.format,)


# aiokafka consumer options the executors take over from the group consumer. A group's options
# (group id, heartbeats, the assignor) mean nothing to a reader of a fixed range, and an SSL
# context or a token provider is not something to ship to executors: those stay behind (see
# docs/spark.md for what an executor needs to reach a secured cluster).
_EXECUTOR_OPTIONS = frozenset({
    "bootstrap_servers", "client_id", "request_timeout_ms", "retry_backoff_ms", "fetch_max_bytes",
    "max_partition_fetch_bytes", "isolation_level", "security_protocol", "sasl_mechanism",
    "sasl_plain_username", "sasl_plain_password", "api_version", "connections_max_idle_ms",
    "metadata_max_age_ms", "check_crcs", "fetch_max_wait_ms", "fetch_min_bytes",
})


def executor_options(consumer_options: Mapping[str, object]) -> dict[str, object]:
    """The options of the group consumer an executor's reader takes: plain values only."""
    plain = (str, int, float, bool)
    return {key: value for key, value in consumer_options.items()
            if key in _EXECUTOR_OPTIONS and isinstance(value, plain)}


# -- checks ----------------------------------------------------------------------------------------
def check_stage_read(stage: str, read: str | None, after_source: bool, topics: int, schema: Any) -> None:
    """A stage's ``read=``; raises ``TopologyError`` naming the stage and what to set."""
    if read is None or read == cfg.SPARK_READ_DRIVER:
        if read is not None and not isinstance(read, str):
            raise TopologyError(f"read= of Spark stage '{stage}' must be one of {list(READS)}, got {read!r}")
        return
    if read != cfg.SPARK_READ_EXECUTORS:
        raise TopologyError(f"read= of Spark stage '{stage}' must be one of {list(READS)}, got {read!r}")
    why = executors_refusal(after_source, topics, schema)
    if why is not None:
        raise TopologyError(f"Spark stage '{stage}' cannot have read='executors': {why}; "
                            "set read='driver' (or leave read= out) for it")


def executors_refusal(after_source: bool, topics: int, schema: Any) -> str | None:
    """Why a stage cannot read on the executors, None if it can."""
    if not after_source:
        return ("the executors read only the records of a source: the stage must come right after "
                "builder.stream(...), with no processor in between")
    if topics != 1:
        return f"its source reads {topics} topics; the executors read ranges of one topic's partition"
    if schema is None:
        return "it has no schema=: the executors need the stage's columns and types before they read"
    return None


@dataclass(frozen=True)
class StageRead:
    """What the builder recorded of a Spark stage, for the client's check (``check_spark_reads``)."""

    read: str | None
    after_source: bool
    topics: int
    has_schema: bool


def check_spark_reads(stages: Mapping[str, StageRead], config: Mapping[str, Any]) -> None:
    """When the client is created: each stage's read (its own ``read=``, else ``spark.batch.read``)
    must be one it can do. Raises ``ConfigError`` naming the stage and what to set."""
    default = config.get(cfg.SPARK_BATCH_READ, cfg.SPARK_READ_DRIVER)
    for name, stage in sorted(stages.items()):
        read = stage.read or default
        if read != cfg.SPARK_READ_EXECUTORS:
            continue
        if stage.read is None:
            why = executors_refusal(stage.after_source, stage.topics, True if stage.has_schema else None)
            if why is not None:
                raise ConfigError(cfg.SPARK_BATCH_READ, f"Spark stage '{name}' cannot read on the executors: {why}; "
                                  f"give it read='driver' or set {cfg.SPARK_BATCH_READ}=driver")
        if config.get(cfg.PROCESSING_GUARANTEE) == cfg.EXACTLY_ONCE_V2:
            raise ConfigError(cfg.PROCESSING_GUARANTEE, f"Spark stage '{name}' reads on the executors "
                              f"(read='executors' or {cfg.SPARK_BATCH_READ}=executors), which is at-least-once: "
                              "its output is not part of the task's transaction; set "
                              f"{cfg.PROCESSING_GUARANTEE}=at_least_once or give the stage read='driver'")
        servers = str(config.get(cfg.BOOTSTRAP_SERVERS, ""))
        if servers.startswith("memory://"):
            raise ConfigError(cfg.SPARK_BATCH_READ, f"Spark stage '{name}' reads on the executors, which read "
                              f"from Kafka, but {cfg.BOOTSTRAP_SERVERS} is the in-process memory broker; "
                              f"give it read='driver' or set {cfg.SPARK_BATCH_READ}=driver")


def stage_reads(topology: Topology) -> Mapping[str, StageRead]:
    return getattr(topology, "spark_reads", {})


# -- the driver's side of a job ------------------------------------------------------------------------
@dataclass
class RangeOutcome:
    """What a job over one range gave back: the function's rows (None for a write), the side
    rows (failed records and the summary, as dicts), or every record (raw mode)."""

    rows: list[dict[str, Any]] | None
    side: list[dict[str, Any]]

    def summary(self) -> dict[str, Any] | None:
        return next((row for row in self.side if row[KIND] == CARRIER), None)

    def failures(self) -> list[dict[str, Any]]:
        return sorted((row for row in self.side if row[KIND] not in (CARRIER, RAW)), key=lambda row: row[OFFSET])


def full_schema(schema: StructType) -> StructType:
    """The data source's schema: the stage's columns, then the side columns, then the index of the
    row's range in the job (``PART``). Built in Python: a
    data source's schema is asked for in a Python worker, which has no JVM to parse DDL."""
    from pyspark.sql.types import ArrayType, BinaryType, LongType, StringType, StructField, StructType

    for name in schema.fieldNames():
        if name.startswith(_P):
            raise TopologyError(f"schema field '{name}' clashes with the executors' side columns ({_P}*)")
    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    types = {KIND: StringType(), OFFSET: LongType(), TIMESTAMP: LongType(), RAW_KEY: BinaryType(),
             RAW_VALUE: BinaryType(), HEADERS: ArrayType(header), ERROR: BinaryType(), COUNT: LongType(),
             MAX_TIMESTAMP: LongType()}
    return StructType([*schema.fields, *(StructField(name, types[name]) for name in SIDE_COLUMNS),
                       StructField(PART, LongType())])


class ExecutorDecodeError(Exception):
    """A serde's error on an executor that could not be brought back as itself (it does not pickle):
    its type's name and message."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind


def pack_error(exc: BaseException) -> bytes:
    try:
        return pickle.dumps(exc)
    except Exception:
        return pickle.dumps(ExecutorDecodeError(type(exc).__name__, str(exc)))


def unpack_error(data: bytes | None) -> Any:
    if data is None:
        return None
    try:
        return pickle.loads(data)
    except Exception as exc:
        return ExecutorDecodeError(type(exc).__name__, f"the executor's error did not unpickle: {exc}")


__all__ = ["KafkaRange", "ReadSpec", "check_spark_reads", "check_stage_read", "pick_range"]
