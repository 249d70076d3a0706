"""Spark jobs shared by the tasks of a stream thread: the batches of one stage from several tasks
go into one job (``streamloop.spark.parts``), so that the fixed cost of a Spark job is paid once for
all of them.

A ``StageJobs`` (one per stage and stream thread, from the task manager) has at most one open
``Job``. Each task's bulk loop (``streamloop.tasks.bulk.BatchWindow``) puts its records into its own
part of the open job: one offset range of its partition, which the task alone keeps, releases and
commits (a job finishing releases nothing by itself). The job is sealed when it holds
``max.records`` records or ``max.bytes`` bytes (keys and values), or ``max.wait.ms`` after it
opened, whichever comes first; then the next job opens and fills while it runs (pipelining). At
most ``max.in.flight`` jobs of the stage exist on the thread (the open one included); more
records wait in their tasks' buffers.

With ``spark.batch.eager`` (the default) an open job is also sealed as soon as Spark has room for
it: when no other job of the stage runs (with ``max.in.flight`` above 2, fewer than
``max.in.flight - 1``). Its first part's coroutine looks one loop turn after the part opened (the
tasks woken by the same fetch have put their records in by then), and a job that finishes seals
the open one. So at a low rate a record waits for the job before it, not for ``max.wait.ms``, and
at a high rate jobs still fill while one runs: Structured Streaming's default trigger, which
starts the next micro-batch when the last one ends.

Every part's coroutine waits for its job; the first one there runs it, and if that one is
cancelled (its task closed dirty), another part's coroutine runs it again. A job that raised is
not the error of every part: each part is then run again on its own, which tells whose records
fail (and a timeout is retried per part under its task's ``task.timeout.ms``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel

from streamloop.spark.parts import Part
from streamloop.tasks.run_once import RunOnce

if TYPE_CHECKING:
    from streamloop.processors.nodes import SinkNode
    from streamloop.records import ConsumerRecord
    from streamloop.serdes import Serde
    from streamloop.spark.stage import FetchedResult, SparkBatchStage

log = logging.getLogger(__name__)


class JobSplit(Exception):
    """A job of several tasks' parts ran past ``spark.batch.shared.max.ms``: each part runs alone."""


class JobPart:
    """A task's records in a job; ``raws`` grows while the job is open."""

    __slots__ = ("job", "key_serde", "raws", "sink", "value_serde", "wake")

    def __init__(self, job: Job, wake: Callable[[], None], key_serde: Serde, value_serde: Serde,
                 sink: SinkNode | None) -> None:
        self.job = job
        self.raws: list[ConsumerRecord] = []
        self.wake = wake  # the task's wake-up: its open part was sealed, or a slot came free
        self.key_serde, self.value_serde, self.sink = key_serde, value_serde, sink


class Job(RunOnce):
    """The parts of one Spark job and, once it ran, a result per part or the job's error."""

    __slots__ = ("bytes", "error", "holds_slot", "opened", "parts", "records", "results", "sealed", "waiting")

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[JobPart] = []
        self.records = 0
        self.bytes = 0
        self.opened = time.monotonic()
        self.sealed = anyio.Event()
        self.holds_slot = True  # of the stage's max.in.flight
        self.waiting = 0  # parts' coroutines still waiting for it
        self.results: list[FetchedResult] | None = None
        self.error: Exception | None = None

    def outcome(self, part: JobPart) -> FetchedResult | Exception:
        if self.error is not None:
            return self.error
        assert self.results is not None
        return self.results[self.parts.index(part)]


class StageJobs:
    """The jobs of one Spark stage on one stream thread (all on its loop)."""

    def __init__(self, stage: SparkBatchStage) -> None:
        self._stage = stage  # the first task's: the same function, schema and settings as the others'
        self.max_records, self.max_wait_s, self.max_in_flight = stage.batching()
        self.max_bytes = stage.max_bytes
        self.max_shared_s = stage.max_shared_ms / 1000.0 if stage.max_shared_ms else None
        # A job that writes is never given up for its parts to run alone: both writes would land.
        self._split_after_s = None if stage.writes else self.max_shared_s
        # Jobs sealed and holding a slot below which the open job seals at once (None: never).
        self._eager_below = max(1, self.max_in_flight - 1) if stage.eager else None
        self._open: Job | None = None
        self._in_flight = 0  # jobs opened and not finished (or given up)
        self._blocked: dict[int, Callable[[], None]] = {}  # tasks waiting for a slot: id -> wake
        self.jobs = 0

    def part_for(self, owner: object, wake: Callable[[], None], key_serde: Serde, value_serde: Serde,
                 sink: SinkNode | None) -> JobPart | None:
        """A new part in the open job for a task (``owner``), opening a job if fewer than
        ``max.in.flight`` exist; None when none may open (``wake`` is called once one may)."""
        job = self._open
        if job is None:
            if self._in_flight >= self.max_in_flight:
                self._blocked[id(owner)] = wake
                return None
            job = self._open = Job()
            self._in_flight += 1
        part = JobPart(job, wake, key_serde, value_serde, sink)
        job.parts.append(part)
        return part

    def room(self, job: Job) -> int:
        return self.max_records - job.records

    def added(self, job: Job, records: int, size: int) -> None:
        job.records += records
        job.bytes += size
        if job.records >= self.max_records or (self.max_bytes and job.bytes >= self.max_bytes):
            self.seal(job)

    def seal(self, job: Job) -> None:
        if job.sealed.is_set():
            return
        job.sealed.set()
        if self._open is job:
            self._open = None
        for part in job.parts:
            part.wake()  # each task opens its part of the next job

    async def settle(self, part: JobPart) -> FetchedResult | Exception:
        """Wait for ``part``'s job to seal and run (running it if no one does); its outcome."""
        job = part.job
        job.waiting += 1
        try:
            if self._eager_below is not None and job is self._open:
                await anyio.lowlevel.checkpoint()  # the other tasks of this turn put their records in
                self._seal_if_room(job)  # this job only: one opened meanwhile waits for its own turn
            with anyio.move_on_after(max(0.0, job.opened + self.max_wait_s - time.monotonic())):
                await job.sealed.wait()
            self.seal(job)
            await job.settle(lambda: self._run(job))  # ``_run`` sets ``done`` (``_finished``)
        finally:
            job.waiting -= 1
            if not job.done and job.waiting == 0:
                # Every part's task gave up on it (closed dirty): nobody is left to run it.
                self._finished(job)
        return job.outcome(part)

    async def _run(self, job: Job) -> None:
        parts = [Part(part.raws, part.key_serde, part.value_serde, part.sink) for part in job.parts]
        shared = len(parts) > 1
        async with anyio.create_task_group() as group:
            # Past shared.max.ms a job stops holding a slot of the stage, so that one task's slow
            # records do not hold the thread's other tasks back (their own slots still count).
            group.start_soon(self._free_slot_after, job)
            try:
                # A job of several tasks is given up then, and each part runs on its own.
                with anyio.move_on_after(self._split_after_s if shared else None) as scope:
                    job.results = await self._stage.run_parts(parts)
                if scope.cancelled_caught:
                    log.info("A Spark job of stage '%s' shared by %d tasks ran past spark.batch.shared.max.ms; "
                             "each task's part runs on its own", self._stage.name, len(parts))
                    job.error = JobSplit()
            except Exception as exc:
                job.error = exc
            group.cancel_scope.cancel()
        self.jobs += 1
        self._finished(job)

    async def _free_slot_after(self, job: Job) -> None:
        if self.max_shared_s is not None:
            await anyio.sleep(self.max_shared_s)
            self._free_slot(job)

    def _finished(self, job: Job) -> None:
        if job.done:
            return
        job.done = True
        self._free_slot(job)

    def _seal_if_room(self, job: Job | None) -> None:
        """Seal ``job`` if it is the open one, holds records and fewer jobs run than ``spark.batch.eager`` allows."""
        if job is not None and job is self._open and job.records and self._eager_below is not None and \
                self._in_flight - 1 < self._eager_below:  # the open job holds a slot too
            self.seal(job)

    def _free_slot(self, job: Job) -> None:
        if not job.holds_slot:
            return
        job.holds_slot = False
        self._in_flight -= 1
        self._seal_if_room(self._open)
        blocked, self._blocked = self._blocked, {}
        for wake in blocked.values():
            wake()
