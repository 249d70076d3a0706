"""The Spark side of a stage reading on the executors (``streamloop.tasks.bulk_exec``): the jobs a
task's loop runs on worker threads, each under a job tag its loop can cancel by, a timeout
(``spark.batch.timeout.ms``) and, for timeouts and lost executors, retries under ``task.timeout.ms``.

Each job is one call of ``streamloop.spark.kafka_reader`` with the stage's read and write specs
(what the executors need: the consumer's plain options, the ranges, the serdes, the schema); the
loop decides which job runs when, and what its outcome means for the task's position.

A range's size adapts to the cluster's pace (``RangeLimit``): a read that runs past
``spark.batch.timeout.ms`` is retried with half its offsets, not whole, so a range too big for
the cluster is read in parts instead of timing out again until ``task.timeout.ms`` runs out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import itertools
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import anyio
import anyio.to_thread

from streamloop import config as cfg
from streamloop.errors import SparkBatchTimeoutError
from streamloop.processors.nodes import SinkNode, SourceNode
from streamloop.spark.failures import SparkBatchTransientError, is_transient
from streamloop.spark.kafka_source import KafkaRange, RangeOutcome, ReadSpec
from streamloop.spark.parts import TransformJob
from streamloop.spark.stage import SparkBatchStage

from .timeouts import is_timeout

if TYPE_CHECKING:
    from streamloop.spark.kafka_writer import WriteSpec
    from streamloop.spark.session import SparkSessions

    from .task import StreamTask

log = logging.getLogger(__name__)


class Closed(enum.Enum):
    """``RangeWork.settle``'s answer when the task closed during a back-off: the range is read again
    by the next owner."""

    CLOSED = "closed"


CLOSED = Closed.CLOSED
_tags = itertools.count()
T = TypeVar("T")


class _Handoff(Generic[T]):
    """A job's result between its worker thread and the loop. When the loop stops waiting for it (a
    cancel or a timeout: the thread is abandoned, and a job it starts after the cancel by tag runs
    to its end), ``release`` lets go of what the job made (a persisted frame): on the worker when it
    finishes after that, else on the loop's side, for a result made but not taken."""

    def __init__(self, work: Callable[[str], T], release: Callable[[T], None]) -> None:
        self._work = work
        self._release = release
        self._lock = threading.Lock()
        self._abandoned = False
        self._made: list[T] = []

    def run(self, tag: str) -> T:
        made = self._work(tag)
        with self._lock:
            abandoned = self._abandoned
            if not abandoned:
                self._made.append(made)
        if abandoned:
            self._let_go(made)
        return made

    def abandon(self) -> None:
        with self._lock:
            self._abandoned = True
            made, self._made = self._made, []
        for result in made:
            self._let_go(result)

    def _let_go(self, made: T) -> None:
        # Best effort: on the cancel path an error here would replace the cancellation (a session
        # stopped under a closing client cannot unpersist, and has nothing cached any more).
        try:
            self._release(made)
        except Exception as exc:
            log.warning("Could not let go of an abandoned Spark job's result: %r", exc)


def release_read(made: tuple[Any, list[RangeOutcome]]) -> None:
    """What a read left behind, when nobody takes it: its persisted frame."""
    made[0].unpersist()


class RangeLimit:
    """How many offsets a task's next range takes at most: the stage's ``max_records``, halved each
    time one of its jobs runs past ``spark.batch.timeout.ms``, and doubled back (up to
    ``max_records``) after a full range that took less than a quarter of it. Caller: the task's loop."""

    def __init__(self, max_records: int) -> None:
        self.max_records = max_records
        self.records = max_records

    def timed_out(self, size: int) -> None:
        self.records = max(1, min(self.records, size) // 2)

    def narrowed(self, kafka_range: KafkaRange) -> KafkaRange:
        """``kafka_range`` cut to the limit (its start kept)."""
        if kafka_range.size <= self.records:
            return kafka_range
        return dataclasses.replace(kafka_range, end=kafka_range.start + self.records)

    def finished(self, size: int, elapsed_ms: float, timeout_ms: int) -> None:
        """A range of ``size`` offsets was done in ``elapsed_ms``: twice as many fit the timeout
        with a margin when it took under a quarter of it."""
        if self.records < self.max_records and size >= self.records and elapsed_ms * 4 < timeout_ms:
            self.records = min(self.max_records, self.records * 2)
            log.info("Ranges of up to %d offsets again (%d offsets took %.0f ms)", self.records, size, elapsed_ms)


class RangeWork:
    """Caller: ``ExecutorWindow``. ``settle`` and ``off_loop`` run on the task's loop and hand a job
    (any other method but ``sessions`` and ``timeout_ms``) to a worker thread."""

    def __init__(self, task: StreamTask, stage: SparkBatchStage, source: SourceNode,
                 options: Mapping[str, Any]) -> None:
        self._task = task
        self._stage = stage
        self._source = source
        self._options = options
        self._schema: Any = None  # the stage's schema, resolved on the first job
        self.limit = RangeLimit(stage.batching()[0])

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

    @property
    def timeout_ms(self) -> int:
        """``spark.batch.timeout.ms`` (0: none)."""
        timeout_ms: int = self.sessions().config.get(cfg.SPARK_BATCH_TIMEOUT_MS, 0)
        return timeout_ms

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

    def read_range(self, kafka_range: KafkaRange, tag: str) -> tuple[Any, list[RangeOutcome]]:
        return self.read_ranges((kafka_range,), tag)

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
        self.sessions().cancel_tagged(tag)

    async def settle(self, work: Callable[[KafkaRange, str], T], kafka_range: KafkaRange, narrow: bool = False,
                     release: Callable[[T], None] | None = None) -> tuple[KafkaRange, T | Exception | Closed]:
        """The outcome of ``work`` (a job over the range), retrying timeouts and lost executors
        under ``task.timeout.ms``; an exception when the job raised otherwise; ``CLOSED`` when the
        task closed meanwhile (a sentinel: a job's own outcome may be None). With ``narrow`` (a
        read) a job that ran past ``spark.batch.timeout.ms`` is retried over the range cut to
        the halved limit: the range the outcome is of comes first. ``release``: ``off_loop``'s."""
        task, stage = self._task, self._stage
        timer = task.timer
        while True:
            started = task.monotonic_ms()
            try:
                outcome = await self.off_loop(functools.partial(work, kafka_range), kafka_range, release)
            except Exception as exc:
                if is_transient(exc) and not is_timeout(exc):
                    transient = SparkBatchTransientError(stage.name, kafka_range.size, exc)
                    transient.__cause__ = exc
                    exc = transient
                if not is_timeout(exc):
                    return kafka_range, exc
                await task.back_off(exc, f"Spark stage '{stage.name}' reading {kafka_range.topic}-"
                                         f"{kafka_range.partition} offsets {kafka_range.start}.."
                                         f"{kafka_range.end - 1} on the executors", started)
                if task.closing:
                    return kafka_range, CLOSED
                if isinstance(exc, SparkBatchTimeoutError):
                    self.timed_out(kafka_range)
                    if narrow:
                        kafka_range = self.limit.narrowed(kafka_range)
                continue
            if timer.deadline_ms is not None and timer.cleared_by_processing:
                timer.clear()
            return kafka_range, outcome

    def timed_out(self, kafka_range: KafkaRange) -> None:
        """A job over ``kafka_range`` ran past ``spark.batch.timeout.ms``: the next ranges take half."""
        self.limit.timed_out(kafka_range.size)
        log.warning("Spark stage '%s': a job over %s ran past %s; reading at most %d offsets at a time "
                    "(of its max_records %d) until a range takes under a quarter of it", self._stage.name,
                    kafka_range, cfg.SPARK_BATCH_TIMEOUT_MS, self.limit.records, self.limit.max_records)

    async def off_loop(self, work: Callable[[str], T], kafka_range: KafkaRange,
                       release: Callable[[T], None] | None = None) -> T:
        """``work`` on a worker thread, under ``spark.batch.timeout.ms``; a timeout or a cancel
        cancels the job by its tag (the thread is left to end with it), and ``release`` lets go of
        what the job made, if it makes it anyway (a read's persisted frame: ``release_read``)."""
        stage = self._stage
        tag = f"streamloop-exec-{self._task.context.application_id}-{self._task.id}-{stage.name}-{next(_tags)}"
        timeout_ms = self.timeout_ms
        handoff = None if release is None else _Handoff(work, release)
        try:
            with anyio.fail_after(timeout_ms / 1000.0 if timeout_ms else None):
                # Abandoned on cancel: a task closed dirty must not wait for the cluster.
                return await anyio.to_thread.run_sync(work if handoff is None else handoff.run, tag,
                                                      abandon_on_cancel=True)
        except TimeoutError as exc:
            await anyio.to_thread.run_sync(self._abandon, tag, handoff)
            raise SparkBatchTimeoutError(stage.name, kafka_range.size, timeout_ms) from exc
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._abandon, tag, handoff)
            raise

    def _abandon(self, tag: str, handoff: _Handoff[Any] | None) -> None:
        self.cancel(tag)
        if handoff is not None:
            handoff.abandon()


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
