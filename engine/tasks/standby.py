"""Standby tasks (``num.standby.replicas``): a task's persistent stores kept warm on another instance.

A standby task opens its task's stores in the task's own state directory and reads their
changelog partitions continuously: no processing, no output, no commits. Every
``commit.interval.ms`` (and when it closes) it flushes the stores and writes the task's
checkpoint, so when the task later becomes active on this instance the existing restore path
(``TaskStateManager.restore``) starts at the checkpoint and reads only the tail.

An update is applied only once the input record that caused it is committed (the changelog's
source header, read against the group's committed offsets, as restoring does): an update of a
record past the commit would be made again when the record is processed again after a failover,
so applying it (and checkpointing past it) would count it twice. A partition whose next update
is not committed yet waits (paused, its fetched records held) until a commit covers it.

Only persistent logged stores are kept warm (the assignor gives standbys only to tasks that have
one): an in-memory store would have to be handed over to the active task object, which Kafka
Streams does by recycling the task and this engine does not.

Caller: the stream thread's loop (``StandbyTasks.update`` on each assignment, ``shutdown`` at the
end); each standby runs as a coroutine in the thread's task group.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence

import anyio
import anyio.abc

from streamloop.completed_offsets import decode_completed
from streamloop.ids import TaskId
from streamloop.logcontext import LogContext
from streamloop.records import ConsumerRecord, TopicPartition
from streamloop.serdes import Serde
from streamloop.state import checkpoint
from streamloop.state.bytes_stores import BytesStore
from streamloop.state.changelog import decode_source
from streamloop.state.restore import ProcessedInput
from streamloop.state.segments import layout_reset
from streamloop.state.store import StateStore
from streamloop.state.task_state import StateSettings, TaskStateManager
from streamloop.topology.topology import Topology
from streamloop.transport.base import Consumer, OffsetAndMetadata

log = logging.getLogger(__name__)

# How often a standby waiting for a commit asks for the committed offsets again.
COMMITTED_REFRESH_MS = 500


def _no_changelog_writes(*_args: object) -> None:
    raise RuntimeError("a standby task never writes to its changelogs")


class StandbyTask:
    """One standby task: its stores, its changelog reader, its checkpoint."""

    def __init__(self, task_id: TaskId, inputs: Sequence[TopicPartition], state: TaskStateManager,
                 reader_factory: Callable[[], Consumer],
                 committed: Callable[[TopicPartition], Awaitable[OffsetAndMetadata | None]],
                 checkpoint_interval_ms: int, logger: LogContext, poll_ms: int = 100) -> None:
        self.id = task_id
        self.inputs = tuple(sorted(inputs))
        self.state = state
        self._reader_factory = reader_factory
        self._committed = committed
        self._checkpoint_interval_ms = checkpoint_interval_ms
        self._log = logger
        self._poll_ms = poll_ms
        self._stop = anyio.Event()
        self.finished = anyio.Event()
        self.positions: dict[TopicPartition, int] = {}
        """Per changelog partition: every update below it is in the stores (or was left out)."""
        self.applied = 0
        self._processed: dict[str, ProcessedInput] = {}
        self._pending: dict[TopicPartition, list[ConsumerRecord]] = {}
        self._next_refresh_ms = 0
        self._checkpointed: dict[TopicPartition, int] = {}
        # Cancelled by a stop while the stores are still being opened (a lock may hold that up).
        self._opening: anyio.CancelScope | None = None

    async def close(self) -> None:
        """Stop reading, write the checkpoint, close the stores; returns once they are released."""
        self.request_stop()
        await self.finished.wait()

    async def run(self) -> None:
        reader: Consumer | None = None
        opened = False
        try:
            with anyio.CancelScope() as self._opening:
                if self._stop.is_set():
                    return
                await self.state.open_stores()
                opened = True
            self._opening = None
            if not opened:
                return
            logged = {tp: self.state.stores[name] for name, tp in self.state.changelogs.items()
                      if self.state.stores[name].persistent}
            if logged:
                reader = self._reader_factory()
                await reader.start()
                await self._start_positions(reader, logged)
                await self._follow(reader, logged)
            else:
                await self._stop.wait()
        except Exception:
            # A standby is an optimisation: its failure must not fail the thread. The stores are
            # closed below; the task restores as it would without a standby.
            self._log.exception("Standby task %s failed; it stops until the next assignment", self.id)
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    if opened:
                        await self._checkpoint()
                except Exception:
                    self._log.exception("Could not write the checkpoint of standby task %s", self.id)
                self.state.close(clean=True)
                if reader is not None:
                    try:
                        await reader.close(leave_group=False)
                    except Exception as exc:  # closing must go on
                        self._log.warning("Closing the changelog reader of standby task %s failed: %r", self.id, exc)
                self.finished.set()

    async def _start_positions(self, reader: Consumer, logged: dict[TopicPartition, StateStore]) -> None:
        """From the checkpoint where it is valid; from the start (after a wipe) otherwise."""
        offsets = checkpoint.read(self.state.directory)
        ends = await reader.end_offsets(list(logged))
        reader.assign(list(logged))
        for tp, store in logged.items():
            start = offsets.get(tp)
            if start is None or start > ends.get(tp, 0) or layout_reset(store.durable):
                store.durable.wipe()
                start = 0
            reader.seek(tp, start)
            self.positions[tp] = start
        self._checkpointed = dict(offsets)
        self._log.info("Standby task %s reads its changelogs from %s", self.id,
                       {str(tp): o for tp, o in sorted(self.positions.items())})

    async def _follow(self, reader: Consumer, logged: dict[TopicPartition, StateStore]) -> None:
        stores = {tp: store.durable for tp, store in logged.items()}
        next_checkpoint = _now_ms() + self._checkpoint_interval_ms
        while not self._stop.is_set():
            if self._pending:
                await self._drain(reader, stores)
            batch = await reader.poll(self._poll_ms)
            for tp, records in batch.items():
                if tp in stores and records:
                    self._apply(reader, tp, stores[tp], records)
            if _now_ms() >= next_checkpoint:
                await self._checkpoint()
                next_checkpoint = _now_ms() + self._checkpoint_interval_ms

    def _apply(self, reader: Consumer, tp: TopicPartition, store: BytesStore,
               records: Sequence[ConsumerRecord]) -> None:
        held = self._pending.get(tp)
        if held is not None:
            # Fetched before the pause took effect; a re-fetch after a pause repeats none of it.
            held.extend(r for r in records if r.offset > held[-1].offset)
            return
        put = store.put
        for i, record in enumerate(records):
            if record.offset < self.positions[tp]:
                continue
            source = decode_source(record.headers)
            if source is not None and not self._covered(source):
                # Its input record is not committed: hold this update and the rest until it is.
                self._pending[tp] = list(records[i:])
                reader.pause(tp)
                return
            put(record.key, record.value)  # type: ignore[arg-type]  # a changelog record has a key
            self.applied += 1
            self.positions[tp] = record.offset + 1

    def _covered(self, source: tuple[str, int]) -> bool:
        processed = self._processed.get(source[0])
        return processed is not None and processed.covers(source[1])

    async def _drain(self, reader: Consumer, stores: dict[TopicPartition, BytesStore]) -> None:
        now = _now_ms()
        if now < self._next_refresh_ms:
            return
        self._next_refresh_ms = now + COMMITTED_REFRESH_MS
        await self._refresh_committed()
        for tp in list(self._pending):
            held = self._pending.pop(tp)
            reader.resume(tp)
            self._apply(reader, tp, stores[tp], held)

    async def _refresh_committed(self) -> None:
        for tp in self.inputs:
            om = await self._committed(tp)
            if om is not None:
                done = decode_completed(om.offset, om.metadata) if om.metadata else set()
                self._processed[tp.topic] = ProcessedInput(om.offset, frozenset(done))

    async def _checkpoint(self) -> None:
        if self.positions and self.positions != self._checkpointed:
            await self.state.write_checkpoint(self.positions)
            self._checkpointed = dict(self.positions)

    def request_stop(self) -> None:
        self._stop.set()
        if self._opening is not None:
            self._opening.cancel()


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


class StandbyTasks:
    """A stream thread's standby tasks. Caller: the thread's loop only."""

    def __init__(self, application_id: str, topology: Topology, settings: StateSettings, key_serde: Serde,
                 value_serde: Serde, committed: Callable[[TopicPartition], Awaitable[OffsetAndMetadata | None]],
                 spawn: Callable[[StandbyTask], None], checkpoint_interval_ms: int, logger: LogContext) -> None:
        self._application_id = application_id
        self._topology = topology
        self._settings = settings
        self._key_serde = key_serde
        self._value_serde = value_serde
        self._committed = committed
        self._spawn = spawn
        self._checkpoint_interval_ms = checkpoint_interval_ms
        self._log = logger
        self.tasks: dict[TaskId, StandbyTask] = {}

    async def update(self, wanted: Iterable[TaskId], partitions_of: Callable[[TaskId], list[TopicPartition]]) -> None:
        """Close the standbys no longer wanted (a promoted one first releases its stores to the new
        active task), then open the new ones."""
        wanted = set(wanted)
        # A standby that failed is opened again: the failure may have been passing (a broker away).
        gone = [task for task_id, task in self.tasks.items() if task_id not in wanted or task.finished.is_set()]
        await self._close(gone)
        for task_id in sorted(wanted - set(self.tasks)):
            task = self._create(task_id, partitions_of(task_id))
            self.tasks[task_id] = task
            self._spawn(task)
        if gone or wanted:
            self._log.info("Standby tasks %s", [str(t) for t in sorted(self.tasks)])

    async def shutdown(self) -> None:
        await self._close(list(self.tasks.values()))

    async def _close(self, tasks: list[StandbyTask]) -> None:
        for task in tasks:
            task.request_stop()
        for task in tasks:
            await task.close()
            self.tasks.pop(task.id, None)

    def _create(self, task_id: TaskId, inputs: list[TopicPartition]) -> StandbyTask:
        settings = self._settings
        logger = self._log.child(f"standby [{task_id}] ")
        state = TaskStateManager(
            str(task_id), self._application_id, settings.state_dir, task_id.partition,
            self._topology.stores_of(task_id.subtopology), settings.default_persistent, self._key_serde,
            self._value_serde, _no_changelog_writes, None, lambda: 0, lambda: None, logger)
        return StandbyTask(task_id, inputs, state, settings.reader_factory, self._committed,
                           self._checkpoint_interval_ms, logger)


def replicated(topology: Topology, default_persistent: bool) -> Callable[[int], bool]:
    """Whether a sub-topology's tasks get standbys: they have a persistent store with a changelog."""

    def check(subtopology: int) -> bool:
        return any(b.logging and b.is_persistent(default_persistent) for b in topology.stores_of(subtopology))

    return check
