"""The one per-record path of a task: every rule a record meets, whoever runs it.

A record goes one way::

    deserialize ──> extract its timestamp ──> run the graph (``Forwarder.start``; ``drain`` when a
    processor is async) ──> one ``Outcome``: DONE / SKIPPED (a handler said CONTINUE) / PAUSED (a
    handler said PAUSE) / RETRY (a timeout: backed off under task.timeout.ms, run it again; or the
    processing handler said RETRY: the loop waits out its back-off, ``streamloop.tasks.retries``,
    then runs it again) / ABANDONED (the task was closed dirty meanwhile)

with the task's store journal begun before the graph and ended (or undone, when the record runs
again) by the outcome, and the task's KIP-572 timer cleared by a record that gets through. Once
the loop moves the task's position past the record, ``RecordPath.passed`` moves stream time and
runs the stream-time punctuations due. ``RecordPath.process`` and ``passed`` are that path; a
failure anywhere in the task's graph (a record, a punctuation, a cache flush, a Spark batch's
output) is named and wrapped by ``failure`` (``ProcessingError`` unless it is the engine's own).

Three run loops call it, and the test driver through them (``streamloop.tasks.loops`` picks one):

- ``SequentialLoop`` (``sequential.py``): records one at a time in chunks, the hot path. ``process``
  stays synchronous while nothing needs awaiting, so a record costs no task, event or coroutine
  unless a processor is async or an error is handled.
- ``InFlightWindow`` (``in_flight.py``): several records concurrently, one slot each.
- ``BatchWindow`` (``bulk.py``): a Spark stage's records in batches; failures per record here.

What an outcome means for the committable position is the loop's to apply.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any

from streamloop.config import PROCESSING_RETRY_MAX_ATTEMPTS
from streamloop.errors import DeserializationError, ProcessingError, StreamsError, TaskCorruptedError, TaskError
from streamloop.handlers.responses import Answer
from streamloop.ids import TaskId
from streamloop.processors.context import CURRENT
from streamloop.processors.nodes import Forwarder, Node, SourceNode
from streamloop.records import ConsumerRecord, Record
from streamloop.timestamps import ConsumedRecord, InvalidTimestampError

from .timeouts import is_timeout

if TYPE_CHECKING:
    from .task import StreamTask

log = logging.getLogger(__name__)

class Outcome(Enum):
    DONE = "done"
    SKIPPED = "skipped"
    PAUSED = "paused"
    RETRY = "retry"
    ABANDONED = "abandoned"


# Module constants: the hot path compares against them per record, and an Enum's class attribute
# lookup costs several times a global's.
_DONE, _SKIPPED, _ABANDONED = Outcome.DONE, Outcome.SKIPPED, Outcome.ABANDONED
# What RecordPath._extract returns when the extractor raised: any negative number drops a record,
# this one (which no extractor returns in practice) sends it to the deserialization handler.
_FAILED = -(2**63)


def failed_node(forwarder: Forwarder, where: str) -> str:
    """The node that ran last when the task's graph failed (else ``where``); the forwarder's queued
    work is dropped."""
    node = forwarder.node.name if forwarder.node is not None else where
    forwarder.reset()
    return node


def failure(task_id: TaskId, forwarder: Forwarder, where: str, exc: Exception) -> StreamsError:
    """A failure in the task's graph outside a record (a punctuation, a cache flush), as the task
    reports it: the engine's own errors as they are, anything else a ``ProcessingError`` naming
    the node that ran last (else ``where``)."""
    node = failed_node(forwarder, where)
    if isinstance(exc, StreamsError):
        return exc
    error = ProcessingError(task_id, node, None, None, None, exc)
    error.__cause__ = exc
    return error


class RecordPath:
    """One record of a task from bytes to an ``Outcome``, and past it. Caller: the run loops.

    ``journal``: whether store updates are journaled per record, so that a record run again
    (RETRY, or a resume after PAUSE) does not apply them twice. Records in flight each have a
    journal of their own (the task state manager's journal follows the record in flight).
    """

    __slots__ = ("_ctx", "_error", "_forwarder", "_input", "_journal", "_sources", "_task", "process")

    def __init__(self, task: StreamTask, journal: bool) -> None:
        self._task = task
        self._input = task.input
        self._ctx = task.context
        self._forwarder = task.context.forwarder
        self._sources = task.graph.sources
        manager = task.state_manager
        self._journal = manager if journal and manager is not None and manager.stores else None
        self._error: Exception | None = None
        process = self._bind()
        # Chosen once per task, so that a record pays for tracing only when it is on.
        self.process = process if task.tracing is None else task.tracing.traced(process)

    def passed(self, timestamp: int) -> Awaitable[None] | None:
        """The task's position moved past a record of ``timestamp`` (-1: it could not be read):
        stream time moves to it if it is later, and the stream-time punctuations due run: the
        awaitable that runs them, None when none is due (the hot path awaits nothing then)."""
        group = self._input
        if timestamp > group.stream_time:
            group.stream_time = timestamp
            schedules = self._ctx.stream_time_schedules
            if schedules.next_due() is not None:
                return self._task.punctuations.run(schedules.due(timestamp), timestamp)
        return None

    def _bind(self) -> Callable[[ConsumerRecord], Outcome | Coroutine[Any, Any, Outcome]]:
        """``process``, as a closure: what it reads per record are its own cells, not attributes (the
        hot path runs it for every record; the slow paths are methods)."""
        task, ctx, sources, forwarder, journal = self._task, self._ctx, self._sources, self._forwarder, self._journal
        deserialization_failed, drain, failed = self._deserialization_failed, self._drain, self._failed
        extract, timestamp_failed = self._extract, self._timestamp_failed
        begin_record, end_record = journal.record_hooks() if journal is not None else (None, None)

        def process(raw: ConsumerRecord) -> Outcome | Coroutine[Any, Any, Outcome]:
            """The outcome, or a coroutine to await for it when something is async (the graph or an error)."""
            timer = task.timer  # read per record: a revived task gets its predecessor's timer
            # Only a retry needs to know when its attempt started (the final-attempt rule).
            started = task.monotonic_ms() if timer.deadline_ms is not None else 0
            source = sources[raw.topic]
            ctx.topic = raw.topic
            ctx.partition = raw.partition
            ctx.offset = raw.offset
            ctx.timestamp = raw.timestamp
            ctx.headers = raw.headers
            what = "key"
            try:
                key = raw.key if source.raw_keys else source.key_serde.deserialize(raw.key)
                what = "value"
                value = raw.value if source.raw_values else source.value_serde.deserialize(raw.value)
            except Exception as exc:  # any serde failure is a deserialization error
                return deserialization_failed(raw, what, exc)
            timestamp = raw.timestamp
            if source.timestamp_extractor is not None:
                timestamp = extract(raw, source, key, value)
                if timestamp < 0:
                    return timestamp_failed(raw, timestamp)
                ctx.timestamp = timestamp
                slot = CURRENT.get()
                if slot is not None:  # records in flight: each reads its own (NodeContext.timestamp)
                    slot.timestamp = timestamp
            elif timestamp < 0:  # FailOnInvalidTimestamp, the default, inlined
                return timestamp_failed(raw, timestamp)
            # The time the record passes with (stream time moves with it, even if a handler drops
            # it later): the sequential loop reads it here, records in flight in their slot.
            task.record_time = timestamp
            record = Record(key, value, timestamp, raw.headers)
            if begin_record is not None:
                begin_record()
            try:
                # ``Forwarder.start`` inlined: a source forwards to its children and answers None.
                forwarder.node = source
                source.process(record)
                if forwarder.pending:
                    return drain(raw, source, record, started)
            except Exception as exc:  # classified in _failed
                return failed(raw, source, record, exc, started)
            # Done: the same steps as _done, inlined.
            if end_record is not None:
                end_record()
            if timer.deadline_ms is not None and timer.cleared_by_processing:
                timer.clear()
            return _DONE

        return process

    def _extract(self, raw: ConsumerRecord, source: SourceNode, key: object, value: object) -> int:
        """The source's extractor's timestamp for ``raw``, or ``_FAILED`` (a negative number) when it
        raised; then ``self._error`` holds the exception for ``_timestamp_failed``."""
        tp = (raw.topic, raw.partition)
        stamps = self._input.head_stamps
        stamp = stamps.pop(tp, None) if stamps else None
        if stamp is not None and stamp[0] == raw.offset:
            timestamp = stamp[1]  # extracted when the record was chosen (head_timestamp)
        else:
            try:
                timestamp = self._call_extractor(raw, source, key, value)
            except Exception as exc:  # the extractor's failure goes to the deserialization handler
                self._error = exc
                return _FAILED
        partition_times = self._input.partition_times
        if timestamp > partition_times.get(tp, -1):
            partition_times[tp] = timestamp
        return timestamp

    def _call_extractor(self, raw: ConsumerRecord, source: SourceNode, key: object, value: object) -> int:
        consumed = ConsumedRecord(raw.topic, raw.partition, raw.offset, raw.timestamp, key, value, raw.headers)
        extractor = source.timestamp_extractor
        timestamp = extractor.extract(consumed, self._input.partition_times.get((raw.topic, raw.partition), -1))  # type: ignore[union-attr]  # called only for sources with one
        if not isinstance(timestamp, int):
            raise TypeError(f"{extractor!r}.extract() returned {timestamp!r}, not an int of ms")
        return timestamp

    def head_timestamp(self, raw: ConsumerRecord) -> int:
        """The timestamp that orders ``raw`` among the task's partition heads: its extractor's,
        remembered for when it runs. A record that cannot be read orders by its own timestamp;
        its error comes when it runs. Caller: ``PartitionGroup.next_queue`` (sources with extractors)."""
        source = self._sources[raw.topic]
        if source.timestamp_extractor is None:
            return raw.timestamp
        stamp = self._input.head_stamps.get((raw.topic, raw.partition))
        if stamp is not None and stamp[0] == raw.offset:
            return stamp[1]
        try:
            key = source.key_serde.deserialize(raw.key)
            value = source.value_serde.deserialize(raw.value)
            timestamp = self._call_extractor(raw, source, key, value)
        except Exception:  # the same failure comes again when the record runs, and is handled there
            return raw.timestamp
        self._input.head_stamps[(raw.topic, raw.partition)] = (raw.offset, timestamp)
        return timestamp

    def _timestamp_failed(self, raw: ConsumerRecord, timestamp: int) -> Outcome | Coroutine[Any, Any, Outcome]:
        """An invalid timestamp: the extractor raised (``_FAILED``), the default extractor met a
        negative one (its error, to the deserialization handler), or another extractor returned a
        negative one (the record is dropped, as Kafka Streams' RecordQueue does)."""
        task = self._task
        _untimed(task)
        source = self._sources[raw.topic]
        if timestamp == _FAILED:
            exc, self._error = self._error, None
            return self._deserialization_failed(raw, "timestamp", exc)  # type: ignore[arg-type]  # set with _FAILED
        if source.timestamp_extractor is None:
            consumed = ConsumedRecord(raw.topic, raw.partition, raw.offset, raw.timestamp, None, None, raw.headers)
            error = InvalidTimestampError(consumed, "the extractor is FailOnInvalidTimestamp (the default)")
            return self._deserialization_failed(raw, "timestamp", error)
        log.warning("Task %s drops the record at %s-%s offset %s: its extracted timestamp %s is negative",
                    task.id, raw.topic, raw.partition, raw.offset, timestamp)
        task.dropped += 1
        if self._journal is not None:
            self._journal.end_record()
        return _SKIPPED

    def _done(self) -> Outcome:
        if self._journal is not None:
            self._journal.end_record()
        timer = self._task.timer
        if timer.deadline_ms is not None and timer.cleared_by_processing:
            timer.clear()
        return _DONE

    async def _drain(self, raw: ConsumerRecord, source: SourceNode, record: Record, started: int) -> Outcome:
        try:
            await self._forwarder.drain()
        except Exception as exc:  # classified in _failed
            return await self._failed(raw, source, record, exc, started)
        if self._task.closed:
            return _ABANDONED  # closed dirty while the record was in flight: nothing more to do
        if _read_again(self._task, raw):
            self._undo()  # read again on resume (a PAUSE below it came meanwhile): its updates apply then
            return Outcome.PAUSED
        return self._done()

    async def _failed(self, raw: ConsumerRecord, source: SourceNode, record: Record, exc: Exception,
                      started: int) -> Outcome:
        task = self._task
        node = failed_node(self._forwarder, source.name)
        if is_timeout(exc):
            # Never skipped: the record runs again after the back-off.
            self._undo()
            where = f"{raw.topic}-{raw.partition} offset {raw.offset}"
            what = f"sending for {where}" if isinstance(exc, StreamsError) else f"Processor '{node}' on {where}"
            await task.back_off(exc, what, started)
            return Outcome.RETRY
        if isinstance(exc, StreamsError):
            raise exc
        if _read_again(task, raw):
            # Records that fail together (a Spark batch, records in flight) ask the handler once: the
            # records above the pause are read again on resume, and asked about then if they fail again.
            self._undo()
            return Outcome.PAUSED
        outcome = await self.processing_failed(raw, node, record, exc, retry=True)
        if outcome is Outcome.PAUSED or outcome is Outcome.RETRY:
            self._undo()  # resume() or the retry runs the record again: its updates apply once
            if outcome is Outcome.RETRY and task.exactly_once and CURRENT.get() is None:
                # One record at a time, the failed attempt's output went into the open transaction:
                # running the record again would send it twice. As for a timeout, the transaction is
                # aborted and the task revived from its last commit; it keeps its timer, and with it
                # the record's attempts and back-off (``streamloop.tasks.retries``).
                raise TaskCorruptedError(task.id, f"the processing handler answered RETRY for {raw.topic}-"
                                         f"{raw.partition} offset {raw.offset}") from exc
            return outcome
        if self._journal is not None:
            self._journal.end_record()
        return Outcome.SKIPPED

    async def forward_rows(self, node: Node, carrier: ConsumerRecord, out: Sequence[Record]) -> None:
        """A Spark batch's output records downstream of its stage ``node``, in the context of the
        ``carrier`` record they leave with (the caller set it). A failure downstream is the
        carrier's, and the rest of the rows go with it: CONTINUE drops them, PAUSE reads it again."""
        forwarder, children = self._forwarder, node.children
        for record in out:
            try:
                forwarder.node = node
                forwarder.forward(children, record)
                if forwarder.pending:
                    await forwarder.drain()
            except Exception as exc:
                failed = failed_node(forwarder, node.name)
                if isinstance(exc, StreamsError):
                    raise
                await self.processing_failed(carrier, failed, record, exc)
                return

    async def processing_failed(self, raw: ConsumerRecord, node: str, record: Record, exc: Exception,
                                retry: bool = False) -> Outcome:
        """Ask the processing handler about ``raw``: FAIL raises, PAUSE pauses the task (PAUSED),
        CONTINUE drops the record (SKIPPED), RETRY schedules it to run again after its back-off
        (RETRY; only where the caller can run it again, ``retry``, and while attempts are left:
        else ``processing.retry.exhausted.answer`` applies). Also the bulk Spark path's way to ask,
        record by record."""
        task = self._task
        error = ProcessingError(task.id, node, raw.topic, raw.partition, raw.offset, exc)
        error.__cause__ = exc
        errors = task.errors
        if errors is None:
            raise error from exc
        retries = task.timer.records
        attempt = retries.failed_attempts(raw) + 1
        action = await errors.on_processing_error(task.id, raw, node, record, error, attempt)
        if action is Answer.RETRY:
            policy = errors.retry
            if not retry:
                why = "the records of a Spark stage are not run again one by one"
            elif attempt >= policy.max_attempts:
                why = f"{PROCESSING_RETRY_MAX_ATTEMPTS} is {policy.max_attempts}"
            else:
                delay_ms = policy.delay_ms(attempt)
                retries.schedule(raw, attempt, task.monotonic_ms() + delay_ms)
                task.retries += 1
                task.log.info("Processor %s failed on %s-%s offset %s (attempt %d of %d): %s: %s; the handler "
                              "answered RETRY, running it again in %d ms", node, raw.topic, raw.partition,
                              raw.offset, attempt, policy.max_attempts, type(exc).__name__, exc, delay_ms)
                return Outcome.RETRY
            task.retries_exhausted += 1
            action = await errors.retries_exhausted(task.id, raw, node, error, attempt, why)
        if retries.waiting:
            retries.forget(raw)
        return self._act_on(action, raw, error, exc)

    async def deserialization_failed(self, raw: ConsumerRecord, what: str, exc: Exception) -> Outcome:
        """Ask the deserialization handler about ``raw`` (see ``processing_failed``)."""
        return await self._deserialization_failed(raw, what, exc)

    async def _deserialization_failed(self, raw: ConsumerRecord, what: str, exc: Exception) -> Outcome:
        task = self._task
        _untimed(task)  # not taken to process: stream time stays
        if _read_again(task, raw):
            return Outcome.PAUSED  # asked about when it is read again, if it fails again
        error = DeserializationError(task.id, raw.topic, raw.partition, raw.offset, what, exc)
        error.__cause__ = exc
        if task.errors is None:
            raise error from exc
        action = await task.errors.on_deserialization_error(task.id, raw, error)
        return self._act_on(action, raw, error, exc)

    def _act_on(self, action: Answer, raw: ConsumerRecord, error: TaskError, exc: Exception) -> Outcome:
        """A handler's answer: FAIL raises, PAUSE pauses the task, CONTINUE drops the record."""
        if action is Answer.FAIL:
            raise error from exc
        if action is Answer.PAUSE:
            task = self._task
            task.pause(raw)
            slot = CURRENT.get()
            if slot is not None and task.paused_at is not None and task.paused_at[0] != slot.tp:
                # In flight on another partition than the one paused at (which it was already): read
                # again from it on resume, so its attempt is void and its offset is not done.
                slot.stale = True
            return Outcome.PAUSED
        self._task.dropped += 1
        return Outcome.SKIPPED

    def _undo(self) -> None:
        if self._journal is not None:
            self._journal.undo_record()


def _read_again(task: StreamTask, raw: ConsumerRecord) -> bool:
    """Whether ``raw``'s attempt is void: the task is paused below it, or it is a record in flight
    that a resume since it was taken reads again (``InFlightWindow.resumed``)."""
    if task.paused_below(raw):
        return True
    slot = CURRENT.get()
    return slot is not None and slot.stale


def _untimed(task: StreamTask) -> None:
    """The record in progress could not be read: it passes without a time (stream time stays)."""
    task.record_time = -1
    slot = CURRENT.get()
    if slot is not None:
        slot.timestamp = -1
