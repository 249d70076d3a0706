"""``TopologyTestDriver``: run a topology in the calling thread, with no broker and no real time.

The driver is a stream thread without its poll loop: it builds the engine's own
``TaskManager``, ``StreamTask``s, ``RecordCollector``, ``Committer`` and
``ErrorHandling`` over in-driver topic logs, and schedules the tasks itself. Each
call (``pipe_input``, ``advance_wall_clock_time``, ``resume``, a fault) runs to
completion before it returns: the record goes through its task, output written to a
topic the topology also reads goes through the task that reads it, and then offsets
are committed (after every record unless ``commit.interval.ms`` is given, as Kafka's
driver does). Tasks are visited in task-id order, on a loop whose time is virtual, so the
same inputs always give the same outputs in the same order.

Async processors run on an event loop the driver owns (``VirtualTimeLoop``): a
back-off, a ``task.timeout.ms`` deadline or an ``asyncio.sleep`` takes no real time,
and a processor that awaits something that never happens fails the call with
``DriverTimeoutError`` naming it once ``task.timeout.ms + max.poll.interval.ms`` of
that virtual time has passed (when nothing else is scheduled, the driver first gives
work on other threads, such as ``asyncio.to_thread``, up to a second of real time).
The calls are plain functions: called from a coroutine on a running loop they raise
``IllegalStateError`` (run them in a worker thread, e.g.
``await anyio.to_thread.run_sync(driver.pipe_input, ...)``).

Records run as a client runs them: one at a time, or several in flight
(``num.threads.per.task``, a processor's ``concurrency=``) in ``processing.ordering``, by the
same run loops (``streamloop.tasks.loops``); a call returns once none is buffered or in flight.
One difference from a ``KafkaStreams`` client, by design: ``blocking=True`` functions run
inline (no OS threads). State stores are the engine's, in a temporary ``state.dir`` of the
driver's own, restored from the driver's changelog topics after ``crash()`` or
``rebalance()``; ``get_key_value_store`` / ``get_window_store`` read them. A record piped
to a global table's topic updates the table at once (``streamloop.testing.driver_global``).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

from streamloop import config as cfg
from streamloop.clock import ManualClock
from streamloop.collector import RecordCollector
from streamloop.commit import Committer
from streamloop.config import StreamsConfig
from streamloop.errors import IllegalStateError, InvalidStateStoreError, TopologyError
from streamloop.ids import TaskId
from streamloop.logcontext import LogContext
from streamloop.processors.builtin import FunctionNode
from streamloop.processors.nodes import SourceNode
from streamloop.records import Headers, Record, TopicPartition
from streamloop.serdes import Serde, as_serde
from streamloop.state.cache import ThreadCache
from streamloop.state.metadata import KeyQueryMetadata, StreamsMetadata, StreamsMetadataState
from streamloop.state.query import ReadOnlyKeyValueStore, ReadOnlyWindowStore
from streamloop.state.session_windows import ReadOnlySessionStore
from streamloop.state.store import StateStore
from streamloop.state.stores import StoreType
from streamloop.tasks import wiring
from streamloop.tasks.task import StreamTask, TaskState
from streamloop.testing.driver_errors import UnusedTopics, UnusedTopicsError
from streamloop.testing.driver_global import DriverGlobalTables
from streamloop.testing.driver_loop import DriverLoop
from streamloop.testing.driver_patterns import adopt_pattern_topic
from streamloop.testing.driver_transport import DriverConsumer, DriverProducer, DriverReader
from streamloop.testing.scenario import AdvanceWallClock, BadRecord, Crash, Input, ProcessorTimeout, Rebalance, Step
from streamloop.testing.topics import TestInputTopic, TestOutputTopic, TopicLog
from streamloop.threads.view import task_counters
from streamloop.timestamps import load_timestamp_extractor
from streamloop.topology.topology import Topology

log = logging.getLogger(__name__)

# What the driver assumes when the config leaves it out; the bootstrap is never contacted.
_DEFAULTS: dict[str, Any] = {
    cfg.APPLICATION_ID: "topology-test-driver",
    cfg.BOOTSTRAP_SERVERS: "memory://topology-test-driver",
    cfg.COMMIT_INTERVAL_MS: 0,
}


class _TimingOutSource(SourceNode):
    """Stands in for a task's source node: its next records time out (a ``ProcessorTimeout`` fault)."""

    def __init__(self, inner: SourceNode, budget: list[int]) -> None:
        super().__init__(inner.name, inner.topics, inner.key_serde, inner.value_serde)
        self.children = inner.children
        self.forwarder = inner.forwarder
        self._inner = inner
        self._budget = budget

    def process(self, record: Record) -> None:
        if self._budget[0] > 0:
            self._budget[0] -= 1
            raise TimeoutError(f"timeout injected by the test driver into source '{self.name}'")
        self._inner.process(record)


# -- the driver ---------------------------------------------------------------------------
class TopologyTestDriver:
    """Runs ``topology`` with ``config`` in the calling thread (see the module docstring).

    ``partitions`` gives topics more than one partition (every topic has one by
    default); ``initial_wall_clock_ms`` starts the wall clock. With ``strict_topics``
    ``close()`` raises ``UnusedTopicsError`` when a source topic got no input or an
    output topic was written but never read; otherwise it logs a warning.
    """

    def __init__(self, topology: Topology, config: Mapping[str, Any] | None = None, *,
                 partitions: Mapping[str, int] | None = None, initial_wall_clock_ms: int = 0,
                 strict_topics: bool = False) -> None:
        if not isinstance(topology, Topology):
            raise TypeError(f"TopologyTestDriver needs a Topology (StreamsBuilder().build()), "
                            f"got {type(topology).__name__}")
        topology.validate()
        self.topology = topology
        self.config = StreamsConfig({**_DEFAULTS, **(config or {})})
        load_timestamp_extractor(self.config)  # a bad one fails here, before anything is opened
        topology.check_sink_serdes(self.config[cfg.DEFAULT_KEY_SERDE], self.config[cfg.DEFAULT_VALUE_SERDE])
        topology.set_application_id(self.config[cfg.APPLICATION_ID])
        self._strict = strict_topics
        self._partition_counts = dict(partitions or {})
        for topic, count in self._partition_counts.items():
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError(f"Topic '{topic}' needs at least 1 partition, got {count!r}")
        self._clock = ManualClock(initial_wall_clock_ms)
        self._logs: dict[str, TopicLog] = {}
        self._fed: set[str] = set()
        self._read: set[str] = set()
        self._closed = False
        self._round_robin = 0
        self._log_context = LogContext(log, f"test-driver [{self.config[cfg.APPLICATION_ID]}] ")

        if topology.has_patterns:
            # The topics given partitions exist from the start, as a cluster's when a client starts.
            topology.resolve_patterns(self._partition_counts)
        user_sources = [t for t in topology.source_topics if t not in topology.repartition_topics()]
        counts = {t: len(self._log(t).partitions) for t in user_sources}
        # Repartition and changelog topics, partitioned as the engine would create them.
        self._internal_topics = topology.internal_topics(counts)
        for topic, (count, _configs) in self._internal_topics.items():
            self._partition_counts.setdefault(topic, count)
            self._log(topic)
        for topic in topology.source_topics + topology.sink_topics + topology.global_topics:
            self._log(topic)
        # Only now that the topics are known to be usable: a refused topology leaves no loop open.
        self._runner = DriverLoop(self.config[cfg.TASK_TIMEOUT_MS] + self.config[cfg.MAX_POLL_INTERVAL_MS])
        # The driver's stores live in a directory of its own, removed by close().
        self._state_dir = tempfile.mkdtemp(prefix="streamloop-driver-")
        self._global = DriverGlobalTables(topology, self.config, self._state_dir)
        self._producer = DriverProducer(self._log, lambda: self.wall_clock_ms)
        self._consumer = DriverConsumer(self._log)
        self._collector = RecordCollector(
            self._producer,
            {t: len(self._log(t).partitions) for t in topology.sink_topics}, self._lookup)
        config_ = self.config
        self._committer = Committer(self._consumer, self._collector,  # type: ignore[arg-type]  # has the part of Consumer it uses
                                    config_[cfg.COMMIT_INTERVAL_MS], self._clock.wall_ms, self._log_context)
        # The engine's own wiring of a stream thread's task machinery (streamloop.tasks.wiring).
        self._errors = wiring.error_handling(config_, self._collector)
        self._manager = wiring.task_manager(
            config_, topology, self._consumer, self._collector, self._committer,  # type: ignore[arg-type]  # has the part of Consumer it uses
            spawn=lambda _task: None,  # the driver schedules tasks itself; nothing runs on its own
            logger=self._log_context, clock_ms=self._clock.wall_ms, monotonic_ms=self._runner.loop.time_ms,
            errors=self._errors,
            state=wiring.state_settings(config_, self._state_dir, ThreadCache(config_[cfg.CACHE_MAX_BYTES_BUFFERING]),
                                        lambda: DriverReader(self._log), global_stores=self._global.stores),
        )
        self._all_partitions = [TopicPartition(t, p) for t in topology.source_topics
                                for p in range(len(self._log(t).partitions))]
        self._assign(self._all_partitions)
        # The one instance owns every partition; as for a client, only an endpoint makes it known.
        self._metadata = StreamsMetadataState.for_topology(self.config[cfg.APPLICATION_SERVER], topology)
        if self.config[cfg.APPLICATION_SERVER]:
            self._metadata.on_change({self._metadata.this_host: set(self._all_partitions)}, {})

    # -- topics ---------------------------------------------------------------------------
    def create_input_topic(self, topic: str, key_serde: Serde | type | None = None,
                           value_serde: Serde | type | None = None) -> TestInputTopic:
        """A handle to pipe records into ``topic``, which the topology must read.

        Serdes default to the config's ``default.key.serde``/``default.value.serde`` (bytes).
        Raises ``TopologyError`` naming the topology's source topics for any other topic.
        """
        self._check_open()
        self._check_source(topic)
        self._fed.add(topic)
        return TestInputTopic(self.pipe_raw, topic, self._serde(key_serde, cfg.DEFAULT_KEY_SERDE),
                              self._serde(value_serde, cfg.DEFAULT_VALUE_SERDE))

    def create_output_topic(self, topic: str, key_serde: Serde | type | None = None,
                            value_serde: Serde | type | None = None) -> TestOutputTopic:
        """A handle to read what the topology writes to ``topic``.

        Raises ``TopologyError`` naming the topology's sink topics when no sink writes ``topic``
        (a sink that picks its topic per record, and the dead-letter topic, may write any).
        """
        self._check_open()
        dynamic = any(callable(self.topology.spec(n).sink_topic) for n in self.topology.node_names())
        if (topic not in self.topology.sink_topics and not dynamic
                and topic != self.config[cfg.ERRORS_DEAD_LETTER_QUEUE_TOPIC_NAME]):
            raise TopologyError(f"Topic '{topic}' is not written by this topology; "
                                f"its sink topics are {self.topology.sink_topics}")
        self._read.add(topic)
        return TestOutputTopic(self._log(topic), self._serde(key_serde, cfg.DEFAULT_KEY_SERDE),
                               self._serde(value_serde, cfg.DEFAULT_VALUE_SERDE))

    def pipe_raw(self, topic: str, key: bytes | None, value: bytes | None, timestamp: int | None = None,
                 headers: Headers = (), partition: int | None = None) -> None:
        """Write bytes as they are into a source topic (e.g. a record no serde can read) and process."""
        self._check_open()
        self._check_source(topic)
        self._fed.add(topic)
        log_ = self._log(topic)
        count = len(log_.partitions)
        if partition is None:
            if key is None:
                partition = self._round_robin % count
                self._round_robin += 1
            else:
                partition = self._collector.default_partition(topic, key, count)
        elif not 0 <= partition < count:
            raise ValueError(f"Topic '{topic}' has partitions 0..{count - 1}, not {partition}")
        record = log_.append(partition, key, value, self.wall_clock_ms if timestamp is None else timestamp, headers)
        if self._global.reads(topic):
            self._global.apply(record)  # no task reads a global table's topic
            return
        self._runner.run(self._pump())

    def unused_topics(self) -> UnusedTopics:
        """Sources that got no input, and outputs written but not read through ``create_output_topic``."""
        internal = set(self._internal_topics)
        read = self.topology.source_topics + self.topology.global_topics
        sources = tuple(t for t in sorted(read) if t not in self._fed and t not in internal
                        and not any(self._log(t).partitions))
        outputs = tuple(t for t in sorted(self._logs) if t not in self._read and t not in read
                        and t not in internal and self._logs[t].appended)
        return UnusedTopics(sources, outputs)

    # -- time -------------------------------------------------------------------------------
    @property
    def wall_clock_ms(self) -> int:
        return self._clock.wall_ms()

    def advance_wall_clock_time(self, ms: int) -> None:
        """Move the wall clock by ``ms``; due wall-clock punctuations fire, then their output is processed."""
        self._check_open()
        if isinstance(ms, bool) or not isinstance(ms, int) or ms < 0:
            raise ValueError(f"The wall clock moves forward by whole milliseconds, got {ms!r}")
        self._clock.advance(ms)
        self._runner.run(self._punctuate_wall_clock())

    # -- tasks ------------------------------------------------------------------------------
    @property
    def task_ids(self) -> list[TaskId]:
        return sorted(self._manager.tasks)

    def paused_tasks(self) -> set[TaskId]:
        """Tasks an error handler answered PAUSE for."""
        return {t.id for t in self._manager.tasks.values() if t.is_paused}

    def task_metrics(self, task_id: TaskId | str) -> dict[str, float]:
        """``task_id``'s ``stream-task-metrics`` counters, as ``KafkaStreams.metrics`` has them."""
        return task_counters(self._task(task_id))

    def resume(self, task_id: TaskId | str, skip: bool = False) -> bool:
        """Run a PAUSED task again from the failed record (past it with ``skip``), as
        ``KafkaStreams.resume`` does; False when the task is not paused."""
        self._check_open()
        if isinstance(task_id, str):
            task_id = TaskId.parse(task_id)
        return self._runner.run(self._resume(task_id, skip))

    def committed(self, topic: str, partition: int = 0) -> int | None:
        """The committed offset of a source partition (the next record to read after a restart)."""
        committed = self._consumer.committed_now(TopicPartition(topic, partition))
        return None if committed is None else committed.offset

    def get_key_value_store(self, name: str) -> ReadOnlyKeyValueStore:
        """The key-value store ``name`` over all tasks (read-only; reads see the cache too)."""
        return self._store(name, StoreType.KEY_VALUE)  # type: ignore[return-value]  # a KEY_VALUE store is this kind

    def get_window_store(self, name: str) -> ReadOnlyWindowStore:
        """The window store ``name`` over all tasks (read-only)."""
        return self._store(name, StoreType.WINDOW)  # type: ignore[return-value]  # a WINDOW store is this kind

    def get_session_store(self, name: str) -> ReadOnlySessionStore:
        """The session store ``name`` over all tasks (read-only)."""
        return self._store(name, StoreType.SESSION)  # type: ignore[return-value]  # a SESSION store is this kind

    def _store(self, name: str, kind: StoreType) -> ReadOnlyKeyValueStore | ReadOnlyWindowStore | ReadOnlySessionStore:
        self._check_open()
        global_store = self._global.stores.get(name)
        if global_store is not None and kind is StoreType.KEY_VALUE:
            return ReadOnlyKeyValueStore(name, lambda: [global_store])
        if name not in self.topology.store_names:
            raise InvalidStateStoreError(name, f"is not in the topology (stores: {self.topology.store_names})")
        if self.topology.store_builder(name).type is not kind:
            raise InvalidStateStoreError(name, f"is a {self.topology.store_builder(name).type.value} store")

        def instances() -> list[StateStore]:
            return [t.state_manager.stores[name] for t in self._manager.tasks.values()
                    if t.state_manager is not None and name in t.state_manager.stores
                    and t.state.state not in (TaskState.CREATED, TaskState.RESTORING)]
        if kind is StoreType.WINDOW:
            return ReadOnlyWindowStore(name, instances)
        if kind is StoreType.SESSION:
            return ReadOnlySessionStore(name, instances)
        return ReadOnlyKeyValueStore(name, instances)

    def query_metadata_for_key(self, store_name: str, key: Any, key_serde: Serde) -> KeyQueryMetadata | None:
        """As ``KafkaStreams.query_metadata_for_key``, this driver being the only instance (the key's
        partition follows ``partitions``); ``NOT_AVAILABLE`` unless ``application.server`` is set."""
        self._check_open()
        return self._metadata.key_query_metadata_for_key(store_name, key, key_serde)

    def metadata_for_all_clients(self) -> list[StreamsMetadata]:
        """As ``KafkaStreams.metadata_for_all_clients``: this driver, if ``application.server`` is set."""
        self._check_open()
        return self._metadata.all_metadata()

    # -- faults -----------------------------------------------------------------------------
    def inject_timeouts(self, task_id: TaskId | str, times: int = 1) -> None:
        """The next record of ``task_id`` times out ``times`` times at its source before it goes through:
        the task backs off and retries under ``task.timeout.ms`` as on a stream thread."""
        self._check_open()
        task = self._task(task_id)
        budget = [times]
        sources = task.graph.sources
        for topic, source in list(sources.items()):
            inner = source._inner if isinstance(source, _TimingOutSource) else source
            sources[topic] = _TimingOutSource(inner, budget)

    def crash(self) -> None:
        """Every task dies without a commit; output not yet handed over is lost; tasks restart from
        the last commit, so records after it are processed again (at-least-once)."""
        self._check_open()
        self._runner.run(self._crash())

    def rebalance(self, task_id: TaskId | str) -> None:
        """``task_id`` is revoked (finished, committed, closed) and assigned again with new processors."""
        self._check_open()
        task = self._task(task_id)
        self._runner.run(self._reassign(sorted(task.partitions)))

    def play(self, steps: Iterable[Step], input_serdes: Mapping[str, tuple[Serde, Serde]] | None = None) -> None:
        """Play a scenario (``streamloop.testing.strategies``): input records and faults, in order.

        ``input_serdes`` maps a topic to its ``(key_serde, value_serde)``; topics left out use the
        config's default serdes.
        """
        topics: dict[str, TestInputTopic] = {}
        for topic, serdes in (input_serdes or {}).items():
            # Named here, so the driver knows about it even when the drawn scenario is empty.
            topics[topic] = self.create_input_topic(topic, *serdes)
        for step in steps:
            if isinstance(step, Input):
                if step.topic not in topics:
                    topics[step.topic] = self.create_input_topic(step.topic)
                topics[step.topic].pipe_input(step.key, step.value, step.timestamp, step.headers, step.partition)
            elif isinstance(step, BadRecord):
                count = len(self._log(step.topic).partitions)
                self.pipe_raw(step.topic, step.key, step.value, step.timestamp, (), step.partition % count)
            elif isinstance(step, ProcessorTimeout):
                if step.task in self._manager.tasks:
                    self.inject_timeouts(step.task, step.times)
            elif isinstance(step, Crash):
                self.crash()
            elif isinstance(step, Rebalance):
                if step.task in self._manager.tasks:
                    self.rebalance(step.task)
            elif isinstance(step, AdvanceWallClock):
                self.advance_wall_clock_time(step.ms)
            else:
                raise TypeError(f"Not a scenario step: {step!r}")

    # -- closing ------------------------------------------------------------------------------
    def close(self) -> None:
        """Finish, commit and close every task; report unused topics (see ``strict_topics``)."""
        if self._closed:
            return
        self._runner.refuse_running_loop()
        try:
            self._runner.run(self._close_all(clean=True))
        finally:
            self._closed = True
            self._runner.close()
            self._global.close()
            shutil.rmtree(self._state_dir, ignore_errors=True)
        unused = self.unused_topics()
        if unused:
            if self._strict:
                raise UnusedTopicsError(f"The test left topics unused: {unused.describe()}")
            self._log_context.warning("The test left topics unused: %s", unused.describe())

    def __enter__(self) -> TopologyTestDriver:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------------------
    def _log(self, topic: str) -> TopicLog:
        found = self._logs.get(topic)
        if found is None:
            found = self._logs[topic] = TopicLog(topic, self._partition_counts.get(topic, 1))
        return found

    async def _lookup(self, topic: str) -> int:
        """A topic chosen per record (or the dead-letter topic) is created on first use."""
        return len(self._log(topic).partitions)

    def _serde(self, value: Serde | type | None, default_key: str) -> Serde:
        if value is None:
            return wiring.default_serde(self.config, default_key)
        return as_serde(value, "serde")

    def _task(self, task_id: TaskId | str) -> StreamTask:
        if isinstance(task_id, str):
            task_id = TaskId.parse(task_id)
        task = self._manager.tasks.get(task_id)
        if task is None:
            raise ValueError(f"No task {task_id}; the driver's tasks are {[str(t) for t in self.task_ids]}")
        return task

    def _check_source(self, topic: str) -> None:
        sources = self.topology.source_topics + self.topology.global_topics
        if topic not in sources and not adopt_pattern_topic(self, topic):
            raise TopologyError(f"Topic '{topic}' is not read by this topology; "
                                f"its source topics are {sorted(sources)}")

    def _check_open(self) -> None:
        """Every call checks first, so a refused call has changed nothing."""
        if self._closed:
            raise IllegalStateError("The TopologyTestDriver is closed")
        self._runner.refuse_running_loop()

    def _assign(self, partitions: Sequence[TopicPartition]) -> None:
        """Seek to the committed offsets (or auto.offset.reset) and create the tasks."""
        for tp in partitions:
            committed = self._consumer.committed_now(tp)
            if committed is not None:
                position = committed.offset
            elif self.config[cfg.AUTO_OFFSET_RESET] == "latest":
                position = len(self._log(tp.topic).partitions[tp.partition])
            else:
                position = 0
            self._consumer.seek(tp, position)
        self._consumer.resume(*partitions)
        for task in self._manager.handle_assignment(partitions):
            for node in task.graph.nodes:
                if isinstance(node, FunctionNode) and node.blocking:
                    # No OS threads in the driver: the plain function runs inline.
                    node.blocking = False
                    node.is_async = False

    async def _pump(self) -> None:
        """Fetch and process until no task has anything left, committing after each round."""
        while True:
            await self._start_created()
            fetched = self._consumer.fetch(self.config[cfg.MAX_POLL_RECORDS])
            if fetched:
                self._manager.add_records(fetched)
            busy = [t for _id, t in sorted(self._manager.tasks.items()) if t.buffered() and not t.is_paused]
            if not fetched and not busy:
                return
            for task in busy:
                self._runner.current = task
                await task.drain()
            self._runner.current = None
            await self._manager.maybe_commit()

    async def _start_created(self) -> None:
        for _id, task in sorted(self._manager.tasks.items()):
            if task.state.state is TaskState.CREATED:
                # A new task restores its stores first, with or without records to process.
                self._runner.current = task
                await task.drain()
        self._runner.current = None

    async def _punctuate_wall_clock(self) -> None:
        # As in a stream thread, a task punctuates only once its stores are restored.
        await self._start_created()
        for _id, task in sorted(self._manager.tasks.items()):
            if not task.is_paused:
                self._runner.current = task
                await task.punctuate_wall_clock()
        self._runner.current = None
        await self._collector.send_buffered()
        await self._pump()
        await self._manager.maybe_commit()

    async def _resume(self, task_id: TaskId, skip: bool) -> bool:
        resumed = await self._manager.resume(task_id, skip)
        if resumed:
            await self._pump()
        return resumed

    async def _close_all(self, clean: bool) -> None:
        tasks = list(self._manager.tasks.values())
        for task in tasks:
            # The driver runs no task coroutine: between calls every task has finished its record.
            task.finished.set()
        await self._manager.close_tasks(tasks, clean=clean, timeout=1.0)

    async def _crash(self) -> None:
        self._producer.drop()
        await self._close_all(clean=False)
        self._assign(self._all_partitions)
        await self._pump()

    async def _reassign(self, partitions: list[TopicPartition]) -> None:
        tasks = {self._manager.tasks[self._manager.task_id_of(tp)] for tp in partitions}
        for task in tasks:
            task.finished.set()
        await self._manager.handle_revocation(partitions, timeout=1.0)
        self._assign(partitions)
        await self._pump()

