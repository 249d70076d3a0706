"""The Spark side of a stage reading on the executors (``streamloop.tasks.bulk_exec``): the jobs a
task's loop runs on worker threads, each under a job tag its loop can cancel by.

Each job is one call of ``streamloop.spark.kafka_reader`` with the stage's read and write specs
(what the executors need: the consumer's plain options, the ranges, the serdes, the schema); the
loop decides which job runs when, and what its outcome means for the task's position.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from streamloop.processors.nodes import SinkNode, SourceNode
from streamloop.spark.kafka_source import KafkaRange, RangeOutcome, ReadSpec
from streamloop.spark.parts import TransformJob
from streamloop.spark.stage import SparkBatchStage

if TYPE_CHECKING:
    from streamloop.spark.kafka_writer import WriteSpec
    from streamloop.spark.session import SparkSessions

    from .task import StreamTask

log = logging.getLogger(__name__)


class RangeWork:
    """Caller: ``ExecutorWindow``; every method but ``sessions`` runs on a worker thread."""

    def __init__(self, task: StreamTask, stage: SparkBatchStage, source: SourceNode,
                 options: Mapping[str, Any]) -> None:
        self._task = task
        self._stage = stage
        self._source = source
        self._options = options
        self._schema: Any = None  # the stage's schema, resolved on the first job

    def spec(self, session: Any, ranges: tuple[KafkaRange, ...]) -> ReadSpec:
        from streamloop.spark.schema import resolve_schema

        stage, source = self._stage, self._source
        _job, key_column, _value_columns, schema = stage.executor_job()
        if self._schema is None:
            self._schema = resolve_schema(session, schema)
        return ReadSpec(dict(self._options), ranges, source.key_serde, source.value_serde, key_column,
                        self._schema, stall_ms=int(self._options.get("request_timeout_ms", 40_000)) + 20_000)

    def sessions(self) -> SparkSessions:
        sessions = self._task.context.spark
        assert sessions is not None  # a Spark stage's init checked it
        return sessions

    def run(self, kafka_range: KafkaRange, tag: str) -> RangeOutcome:
        from streamloop.spark.kafka_reader import run_range_job

        session = self.sessions().get()
        with _tagged(session, tag):
            job = self._stage.executor_job()[0]
            return run_range_job(session, job, self.spec(session, (kafka_range,)), self._stage.name)

    def write_spec(self, sink: SinkNode, partitions: int, timestamp: int,
                   timestamps: tuple[int, ...] = ()) -> WriteSpec:
        from streamloop.spark.kafka_writer import WriteSpec

        _job, key_column, value_columns, _schema = self._stage.executor_job()
        assert isinstance(sink.topic, str) and self._options is not None
        return WriteSpec(dict(self._options), sink.topic, partitions, key_column,
                         None if value_columns is None else tuple(value_columns), sink.key_serde, sink.value_serde,
                         timestamp, timestamps)

    def read_ranges(self, ranges: tuple[KafkaRange, ...], tag: str) -> tuple[Any, list[RangeOutcome]]:
        from streamloop.spark.kafka_reader import read_ranges

        session = self.sessions().get()
        with _tagged(session, tag):
            return read_ranges(session, self.spec(session, ranges))

    def write_ranges(self, frame: Any, ranges: tuple[KafkaRange, ...], leaving: tuple[int, ...],
                     stamps: tuple[int, ...], sink: SinkNode, partitions: int, tag: str) -> str | None:
        """One range of a group's frame alone (``stamps``: its timestamp), or several in one job
        (``stamps``: every range's): ``kafka_reader.write_ranges``."""
        from streamloop.spark.kafka_reader import write_ranges

        session = self.sessions().get()
        job = self._stage.executor_job()[0]
        assert isinstance(job, TransformJob)
        write = (self.write_spec(sink, partitions, stamps[0]) if len(stamps) == 1
                 else self.write_spec(sink, partitions, -1, stamps))
        with _tagged(session, tag):
            return write_ranges(session, frame, job.fn, self.spec(session, ranges), write, leaving)

    def raw(self, kafka_range: KafkaRange, tag: str) -> RangeOutcome:
        from streamloop.spark.kafka_reader import run_raw_job

        session = self.sessions().get()
        with _tagged(session, tag):
            return run_raw_job(session, self.spec(session, (kafka_range,)))

    def cancel(self, tag: str) -> None:
        sessions = self.sessions()
        if not sessions.started:
            return
        try:
            sessions.get().sparkContext.cancelJobsWithTag(tag)
        except Exception:
            log.warning("Could not cancel the Spark jobs tagged %s", tag, exc_info=True)


@contextlib.contextmanager
def _tagged(session: Any, tag: str) -> Iterator[None]:
    """The jobs this worker thread starts meanwhile carry ``tag`` (cancelled by it on a timeout or
    a close) and are interrupted on cancel."""
    context = session.sparkContext
    context.addJobTag(tag)
    context.setInterruptOnCancel(True)
    try:
        yield
    finally:
        context.removeJobTag(tag)
