"""Spark jobs over the offset ranges of several tasks of a stream thread (``read="executors"``).

A stage reading on the executors with a direct sink takes two Spark jobs per range: a read (its
side rows come back, so the handlers are asked before anything is written) and a write. Most of a
job's time on a small batch is its fixed cost (planning the Python data source, scheduling), so
with ``spark.batch.shared`` (on by default) and a row-wise function (``streamloop.spark.row_wise``)
the tasks of a stream thread read their next ranges in one job and write them in one job, as the
driver path's tasks share a job (``streamloop.tasks.bulk_jobs``).

A ``RangeJobs`` (one per stage and stream thread) has at most one open ``RangeGroup``. Each task's
loop (``streamloop.tasks.bulk_exec.ExecutorWindow``) puts its next range into the open group; the
group is sealed once every task of the stage on the thread that has a range to read is in it, or
``max.wait.ms`` after it opened. Its read job reads every range, one Spark partition each, and
hands each task its own side rows. Each task then asks its handlers about its failed records and
says whether its range's output may leave (and with which timestamp); once every task of the
group answered (or left), one write job writes the ranges that may. Each task still moves and
commits only its own position, after the write returned. The first task there runs a job; if it
is cancelled (its task closed dirty), another task of the group runs it. A task that leaves the
group early is left out of its write; the last one out unpersists the group's frame.

Anything that does not go as planned is each task's own again: a read job that raised makes every
task read its range alone (the path of a task on its own, with its retries and handlers); a write
job that raised, or a plan that is not row-wise after all, makes each task write its range alone
from the group's frame.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from streamloop.tasks.run_once import RunOnce

if TYPE_CHECKING:
    from streamloop.spark.kafka_source import KafkaRange, RangeOutcome

# A read job: the group's ranges -> its persisted frame and each range's side rows.
ReadJob = Callable[[tuple["KafkaRange", ...]], Awaitable[tuple[Any, list["RangeOutcome"]]]]
# A write job: the frame, the ranges to write (indexes) and every range's timestamp -> why the
# plan is not row-wise (nothing written), or None once written.
WriteJob = Callable[[Any, tuple["KafkaRange", ...], Sequence[int], tuple[int, ...]], Awaitable[str | None]]
Release = Callable[[Any], Awaitable[None]]


class Stage(RunOnce):
    """One step (the read, the write) of a group: run once, by the first member there."""

    __slots__ = ("error", "value")

    def __init__(self) -> None:
        super().__init__()
        self.value: Any = None
        self.error: Exception | None = None

    async def settle(self, run: Callable[[], Awaitable[Any]]) -> None:
        async def step() -> None:
            try:
                self.value = await run()
            except Exception as exc:
                self.error = exc
            self.done = True
        await super().settle(step)


class RangeGroup:
    """The ranges of one read job, and then of one write job."""

    __slots__ = ("answers", "answered", "frame", "gone", "members", "opened", "outcomes", "ranges", "read",
                 "release", "sealed", "write")

    def __init__(self) -> None:
        self.ranges: list[KafkaRange] = []
        self.members: list[object] = []
        self.opened = time.monotonic()
        self.sealed = anyio.Event()
        self.read = Stage()
        self.write = Stage()
        self.frame: Any = None
        self.release: Release | None = None  # unpersists the frame (off the loop)
        self.outcomes: list[RangeOutcome] = []
        # Per range: its output's timestamp, or None when its output does not leave.
        self.answers: dict[int, int | None] = {}
        self.answered = anyio.Event()  # every member answered or left
        self.gone: set[int] = set()  # members out of the group (done, or their task closed)

    def outcome(self, index: int) -> RangeOutcome:
        return self.outcomes[index]

    def check_answered(self) -> None:
        if all(i in self.answers or i in self.gone for i in range(len(self.ranges))):
            self.answered.set()


class RangeJobs:
    """The groups of one stage on one stream thread (all on its loop)."""

    def __init__(self, max_wait_s: float) -> None:
        self.max_wait_s = max_wait_s
        self._windows: set[int] = set()  # the stage's task loops on the thread, by id
        self._idle: set[int] = set()  # of those, the ones with nothing to read now
        self._open: RangeGroup | None = None
        self.reads = 0  # read jobs run (tests and the benchmark look)
        self.writes = 0

    # -- which task loops take part --------------------------------------------------
    def join(self, window: object) -> None:
        self._windows.add(id(window))

    def leave(self, window: object) -> None:
        self._windows.discard(id(window))
        self._idle.discard(id(window))
        self._seal_if_full()

    def idle(self, window: object) -> None:
        """``window`` has no range to read now: a group does not wait for it."""
        self._idle.add(id(window))
        self._seal_if_full()

    def _seal_if_full(self) -> None:
        group = self._open
        if group is not None and {id(m) for m in group.members} >= self._windows - self._idle:
            self._seal(group)

    def _seal(self, group: RangeGroup) -> None:
        group.sealed.set()
        if self._open is group:
            self._open = None

    # -- one group ------------------------------------------------------------------
    async def read(self, window: object, kafka_range: KafkaRange, job: ReadJob,
                   release: Release) -> tuple[RangeGroup, int]:
        """Put ``kafka_range`` into the open group and wait for the group's read; the group and the
        range's index in it. The caller must call ``done`` with them whatever happens next (it
        checks ``group.read.error`` first). ``release`` unpersists a frame the read made."""
        self._idle.discard(id(window))
        group = self._open
        if group is None:
            group = self._open = RangeGroup()
        index = len(group.ranges)
        group.ranges.append(kafka_range)
        group.members.append(window)
        group.release = release
        self._seal_if_full()
        try:
            with anyio.move_on_after(max(0.0, group.opened + self.max_wait_s - time.monotonic())):
                await group.sealed.wait()
            self._seal(group)
            await group.read.settle(lambda: self._read(group, job))
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.done(group, index)
            raise
        return group, index

    async def _read(self, group: RangeGroup, job: ReadJob) -> None:
        group.frame, group.outcomes = await job(tuple(group.ranges))
        self.reads += 1

    async def write(self, group: RangeGroup, index: int, timestamp: int | None,
                    job: WriteJob) -> str | Exception | None:
        """Say whether range ``index``'s output leaves (``timestamp``: its records' timestamp; None:
        it does not), wait for the group's other members to say so too, and for the write of the
        ranges whose output leaves. None once written (or when nothing of the range leaves);
        otherwise why it was not written (a plan that is not row-wise, or the job's error): the
        caller then writes its range alone."""
        group.answers[index] = timestamp
        group.check_answered()
        if timestamp is None:
            return None
        await group.answered.wait()
        await group.write.settle(lambda: self._write(group, job))
        return group.write.error if group.write.error is not None else group.write.value

    async def _write(self, group: RangeGroup, job: WriteJob) -> str | None:
        ranges = tuple(group.ranges)
        stamps = tuple(-1 if (stamp := group.answers.get(i)) is None else stamp for i in range(len(ranges)))
        # A member whose task closed meanwhile is left out: its position is not committed, so its
        # range is read again by the next owner.
        leaving = [i for i in range(len(ranges)) if group.answers.get(i) is not None and i not in group.gone]
        problem = await job(group.frame, ranges, leaving, stamps)
        self.writes += 1
        return problem

    async def done(self, group: RangeGroup, index: int) -> None:
        """Member ``index`` is out of ``group``: the last one out unpersists the group's frame."""
        group.gone.add(index)
        group.check_answered()
        if len(group.gone) == len(group.ranges) and group.frame is not None and group.release is not None:
            frame, group.frame = group.frame, None
            await group.release(frame)
