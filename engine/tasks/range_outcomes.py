"""What a range read on the executors means on the loop (``streamloop.tasks.bulk_exec``): its
records that did not decode or fit go to the handlers, in offset order, and its rows, when they
come back, go downstream in the context of the range's carrier record (the driver path's rules,
``streamloop.tasks.bulk``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from streamloop.errors import SparkBatchError, SparkSchemaError
from streamloop.processors.nodes import ProcessorNode, SourceNode
from streamloop.records import FetchedRecord, Record, TopicPartition
from streamloop.spark.kafka_source import (
    ERROR,
    HEADERS,
    KEY_FAILED,
    MISFIT,
    OFFSET,
    RAW_KEY,
    RAW_VALUE,
    TIMESTAMP,
    VALUE_FAILED,
    KafkaRange,
    RangeOutcome,
    unpack_error,
)
from streamloop.spark.stage import SparkBatchStage

from .processing import RecordPath

if TYPE_CHECKING:
    from .task import StreamTask


class RangeOutcomes:
    """Caller: ``ExecutorWindow``, on the task's loop."""

    def __init__(self, task: StreamTask, tp: TopicPartition, source: SourceNode, node: ProcessorNode,
                 stage: SparkBatchStage) -> None:
        self._task = task
        self._tp = tp
        self._source = source
        self._node = node
        self._stage = stage
        self.path = RecordPath(task, journal=False)
        # Where the handlers last asked about a range stopped: a PAUSE's offset (None: they did not).
        # The range's records end there, even when a resume comes before the range is finished.
        self.stopped_at: int | None = None

    def stop_at(self, offset: int | None) -> None:
        """The range's records end at ``offset`` (a PAUSE's, or a resume's start) if it is lower."""
        if offset is not None:
            self.stopped_at = offset if self.stopped_at is None else min(self.stopped_at, offset)

    def leaves(self, offset: int | None) -> bool:
        """Whether a range's output may leave with the carrier record at ``offset``: there is one (a
        record that decoded), and it is below a PAUSE or a resume's start (at or past it, the records
        are read again on resume: the driver path's rule, ``bulk._forward``)."""
        if offset is None or offset < 0:
            return False
        stop = self._task.paused_offset(self._tp)
        if self.stopped_at is not None:
            stop = self.stopped_at if stop is None else min(stop, self.stopped_at)
        return stop is None or offset < stop

    def _read_again(self, raw: FetchedRecord) -> bool:
        """Whether ``raw`` is read again on resume (so not asked about now): above the pause, or
        above a resume that came while the range ran."""
        return self._task.paused_below(raw) or (self.stopped_at is not None and raw.offset >= self.stopped_at)

    def raw(self, row: Mapping[str, Any]) -> FetchedRecord:
        headers = tuple((h["key"], h["value"]) for h in row[HEADERS] or ())
        return FetchedRecord(self._tp.topic, self._tp.partition, row[OFFSET], row[TIMESTAMP], row[RAW_KEY],
                             row[RAW_VALUE], headers)

    async def report_failures(self, outcome: RangeOutcome) -> None:
        """Each failed record of the range to its handler, in offset order (``bulk`` does the same
        for a driver batch); the records are decoded again here, only these few."""
        stage, source = self._stage, self._source
        for row in outcome.failures():
            raw = self.raw(row)
            if self._read_again(raw):
                break
            kind, error = row["__streamloop_kind"], unpack_error(row[ERROR])
            if kind in (KEY_FAILED, VALUE_FAILED):
                await self.path.deserialization_failed(raw, kind, error)
                continue
            assert kind == MISFIT
            mismatch = error.mismatch()
            record = Record(source.key_serde.deserialize(raw.key), source.value_serde.deserialize(raw.value),
                            raw.timestamp, raw.headers)
            failure = SparkSchemaError(stage.name, mismatch.field, mismatch.expected, mismatch.found, raw.topic,
                                       raw.partition, raw.offset)
            await self.path.processing_failed(raw, stage.name, record, failure)
        self.stop_at(self._task.paused_offset(self._tp))

    async def fail_each(self, kafka_range: KafkaRange, error: Exception, raws: RangeOutcome) -> None:
        """The range's job raised ``error``: each record of ``raws`` (the range read again, raw) to the
        processing handler with ``SparkBatchError``, or, one that does not decode, to the
        deserialization handler, as the driver path does."""
        stage, source = self._stage, self._source
        failure = SparkBatchError(stage.name, kafka_range.size, error)
        failure.__cause__ = error
        for row in raws.side:
            raw = self.raw(row)
            if self._read_again(raw):
                break
            what = "key"
            try:
                key = source.key_serde.deserialize(raw.key)
                what = "value"
                value = source.value_serde.deserialize(raw.value)
            except Exception as exc:
                await self.path.deserialization_failed(raw, what, exc)
                continue
            await self.path.processing_failed(raw, stage.name, Record(key, value, raw.timestamp, raw.headers),
                                               failure)
        self.stop_at(self._task.paused_offset(self._tp))

    async def forward(self, rows: list[dict[str, Any]], summary: Mapping[str, Any]) -> None:
        """The rows downstream, in the context of the range's carrier record (``bulk._forward``)."""
        task, tp = self._task, self._tp
        offset, timestamp = summary[OFFSET], summary[TIMESTAMP]
        if not rows or not self.leaves(offset):
            return
        from streamloop.spark.frames import to_records

        _job, key_column, value_columns, _schema = self._stage.executor_job()
        out = to_records(rows, key_column, value_columns, timestamp)
        ctx = task.context
        ctx.topic, ctx.partition, ctx.offset = tp.topic, tp.partition, offset
        ctx.timestamp, ctx.headers = timestamp, ()
        carrier = FetchedRecord(tp.topic, tp.partition, offset, timestamp, None, None)
        await self.path.forward_rows(self._node, carrier, out)
