"""``GlobalStreamThread``: the client's one reader of its global tables' topics.

Why a dedicated OS thread with its own event loop, as Kafka Streams' global thread:
a global table is one copy per client whatever the number of stream threads, read
from every partition of its topic with no consumer group, and it must be complete
up to the topic's end before any stream thread processes a record. A coroutine on
each stream thread would keep one copy per thread (or make the threads share one
writer and its lifecycle across rebalances and thread replacement); one thread owns
the reader and the writes, and the stream threads only read (see
``streamloop.state.global_store``), so no stream thread's loop ever waits on it.

``start`` returns once every store holds its topic up to the end offsets read at
start (the bootstrap); then the thread keeps applying new records until
``shut_down``. A failure after the bootstrap is reported to ``on_failure`` (the
client goes to ERROR, as Kafka Streams' does when its global thread dies).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping, Sequence

import anyio
import anyio.from_thread
import anyio.lowlevel
from anyio import CancelScope

from streamloop import config as cfg
from streamloop.config import StreamsConfig, load_handler
from streamloop.errors import StreamsTimeoutError
from streamloop.records import ConsumerRecord, TopicPartition
from streamloop.state.global_store import (
    GlobalKeyValueStore,
    checkpoint_global_stores,
    close_global_stores,
    open_global_stores,
)
from streamloop.state.global_updates import GlobalUpdates
from streamloop.state.store import StateStore
from streamloop.tasks import wiring
from streamloop.topology.topology import Topology
from streamloop.transport.base import Consumer, Transport

log = logging.getLogger(__name__)

# The global stores' directory under ``<state.dir>/<application.id>``, beside the tasks'.
GLOBAL_DIR = "global"


class GlobalStreamThread:
    """Caller: ``KafkaStreams`` (``start`` before the stream threads, ``shut_down`` after them)."""

    def __init__(self, *, client_id: str, stores_by_topic: Mapping[str, GlobalKeyValueStore],
                 transport: Transport, poll_ms: int, read_committed: bool,
                 on_failure: Callable[[BaseException], None],
                 start_offsets: Mapping[TopicPartition, int] | None = None,
                 updates: GlobalUpdates | None = None) -> None:
        self.name = f"{client_id}-GlobalStreamThread"
        self._stores = dict(stores_by_topic)
        self._transport = transport
        self._poll_ms = max(poll_ms, 10)
        self._read_committed = read_committed
        self._on_failure = on_failure
        self._bootstrapped = threading.Event()
        self._done = threading.Event()
        # Set once the bootstrap is done or the thread ended without it: what ``start`` waits for.
        self._settled = threading.Event()
        self._failure: BaseException | None = None
        self._scope: CancelScope | None = None
        self._token: anyio.lowlevel.EventLoopToken | None = None
        self._stopping = False
        self._lock = threading.Lock()  # between shut_down and the loop publishing its scope
        self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        self.applied = 0
        # The next offset to read of each partition: where it starts (a checkpoint, else 0), then
        # past each record applied. Read by the caller once the thread ended (the checkpoint).
        self.positions: dict[TopicPartition, int] = {}
        self._start_offsets = dict(start_offsets or {})
        self.updates = updates or GlobalUpdates(None)

    # -- caller's side ----------------------------------------------------------------
    def start(self, timeout: float) -> None:
        """Start and wait for the bootstrap; raises its failure, or ``StreamsTimeoutError`` after ``timeout`` s."""
        self._thread.start()
        if not self._settled.wait(None if timeout == float("inf") else timeout):
            self.shut_down(5.0)
            raise StreamsTimeoutError(f"Global tables were not bootstrapped within {timeout} s "
                                      f"(topics {sorted(self._stores)})")
        if not self._bootstrapped.is_set():
            raise self._failure or RuntimeError("the global stream thread ended before its bootstrap")

    @property
    def ended_cleanly(self) -> bool:
        """Stopped by ``shut_down`` after its bootstrap, without a failure: its positions are applied."""
        return self._done.is_set() and self._bootstrapped.is_set() and self._failure is None

    def shut_down(self, timeout: float | None = None) -> None:
        with self._lock:
            self._stopping = True
            scope, token = self._scope, self._token
        if scope is not None and token is not None and not self._done.is_set():
            with contextlib.suppress(RuntimeError):  # the loop ended meanwhile
                anyio.from_thread.run_sync(scope.cancel, token=token)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    # -- the thread -------------------------------------------------------------------
    def _main(self) -> None:
        try:
            anyio.run(self._run)
        except BaseException as exc:  # reported, never raised past the thread
            self._failure = exc
            if self._bootstrapped.is_set():
                log.exception("%s failed", self.name)
                self._on_failure(exc)
        finally:
            self._done.set()
            self._settled.set()

    async def _run(self) -> None:
        with CancelScope() as scope:
            with self._lock:
                if self._stopping:
                    return
                self._scope, self._token = scope, anyio.lowlevel.current_token()
            admin = self._transport.admin(f"{self.name}-admin")
            await admin.start()
            try:
                counts = await admin.partition_counts(list(self._stores))
            finally:
                await admin.close()
            partitions = [TopicPartition(t, p) for t in sorted(self._stores) for p in range(counts.get(t, 0))]
            reader = self._transport.reader(f"{self.name}-consumer", read_committed=self._read_committed)
            await reader.start()
            try:
                await self._bootstrap(reader, partitions)
                self._bootstrapped.set()
                self._settled.set()
                log.info("%s bootstrapped %d records of %s", self.name, self.applied, sorted(self._stores))
                while True:
                    self._apply(await reader.poll(self._poll_ms))
            finally:
                with CancelScope(shield=True):
                    await reader.close(leave_group=False)

    async def _bootstrap(self, reader: Consumer, partitions: Sequence[TopicPartition]) -> None:
        """Read every partition from its start offset up to its end offset (as of now)."""
        reader.assign(partitions)
        positions = self.positions
        for tp in partitions:
            positions[tp] = self._start_offsets.get(tp, 0)
            reader.seek(tp, positions[tp])
        ends = await reader.end_offsets(partitions)
        extended: set[TopicPartition] = set()
        while True:
            behind = [tp for tp in partitions if positions[tp] < ends.get(tp, 0)]
            if not behind:
                # Some Kafka-protocol brokers answer ListOffsets "latest" short of the end; the
                # fetch responses' end is right (as a changelog restore checks, streamloop.state.restore).
                # Once per partition: a busy topic's end moves on, and the bootstrap must end.
                further = {tp: end for tp in partitions if tp not in extended
                           and (end := reader.fetched_end(tp)) is not None and end > ends.get(tp, 0)}
                if not further:
                    return
                ends.update(further)
                extended.update(further)
                continue
            batch = await reader.poll(self._poll_ms)
            self._apply(batch)
            for tp in behind:
                if not batch.get(tp):
                    # A compacted topic may have no record at end - 1: the reader's position tells.
                    positions[tp] = max(positions[tp], await reader.position(tp))

    def _apply(self, batch: Mapping[TopicPartition, Sequence[ConsumerRecord]]) -> None:
        # Bootstrapping copies bytes; afterwards records are read first (streamloop.state.global_updates).
        read = self._bootstrapped.is_set()
        apply = self.updates.apply
        for tp, records in batch.items():
            store = self._stores[tp.topic]
            for record in records:
                if apply(store, record, read):
                    self.applied += 1
            if records:
                self.positions[tp] = records[-1].offset + 1


class GlobalTables:
    """A client's global tables: their stores (under ``<state.dir>/<application.id>/global``) and
    the thread that fills them. Caller: ``KafkaStreams`` (``start`` before its stream threads,
    ``shut_down`` after them); ``instances`` from any thread (queries)."""

    def __init__(self, config: StreamsConfig, topology: Topology, transport: Transport, client_id: str) -> None:
        self._config = config
        self._topology = topology
        self._transport = transport
        self._client_id = client_id
        self.stores: dict[str, GlobalKeyValueStore] = {}
        self.thread: GlobalStreamThread | None = None
        self._directory = ""

    def start(self, app_state_dir: str, on_failure: Callable[[], None],
              timeout: float | None = None) -> dict[str, StateStore]:
        """Open the stores and return once they hold their topics up to the end (``timeout`` s, None: no limit)."""
        config = self._config
        specs = list(self._topology.global_stores.values())
        self._directory = f"{app_state_dir}/{GLOBAL_DIR}"
        self.stores, start_offsets = open_global_stores(
            specs, self._directory, config[cfg.DEFAULT_DSL_STORE] == "rocksDB",
            wiring.default_serde(config, cfg.DEFAULT_KEY_SERDE), wiring.default_serde(config, cfg.DEFAULT_VALUE_SERDE))
        self.thread = thread = GlobalStreamThread(
            client_id=self._client_id, stores_by_topic={s.topic: self.stores[s.name] for s in specs},
            transport=self._transport, poll_ms=config[cfg.POLL_MS],
            read_committed=config[cfg.PROCESSING_GUARANTEE] == cfg.EXACTLY_ONCE_V2,
            on_failure=lambda _exc: on_failure(), start_offsets=start_offsets,
            updates=GlobalUpdates(load_handler(config, cfg.DEFAULT_DESERIALIZATION_EXCEPTION_HANDLER)))
        try:
            # ``thread``: shut_down (a close meanwhile) may take ``self.thread`` away.
            thread.start(float("inf") if timeout is None else timeout)
        except BaseException:
            self.shut_down()
            raise
        return dict(self.stores)

    def instances(self, name: str) -> list[StateStore]:
        store = self.stores.get(name)
        return [] if store is None or not store.open else [store]

    def shut_down(self) -> None:
        thread, self.thread = self.thread, None
        if thread is not None:
            thread.shut_down(30.0)
            if thread.ended_cleanly:
                by_topic = {spec.topic: self.stores[spec.name] for spec in self._topology.global_stores.values()}
                checkpoint_global_stores(by_topic, self._directory, thread.positions)
        close_global_stores(self.stores.values())
