"""``GlobalStreamThread``: a global table is whole before ``start`` returns, then kept current."""

from __future__ import annotations

import uuid
from typing import Any

import anyio.to_thread
import pytest

from streamloop import StreamsBuilder
from streamloop.config import StreamsConfig
from streamloop.errors import DeserializationError
from streamloop.handlers import LogAndFailExceptionHandler
from streamloop.serdes import BytesSerde, IntegerSerde, StringSerde
from streamloop.state import Materialized, checkpoint
from streamloop.state.global_store import GlobalStoreSpec, open_global_stores
from streamloop.state.global_updates import GlobalUpdates
from streamloop.state.stores import StoreBuilder, StoreSupplier
from streamloop.testing import eventually_async
from streamloop.threads.global_thread import GlobalStreamThread, GlobalTables
from streamloop.transport import open_transport
from tests.support.cluster import Cluster

pytestmark = pytest.mark.asyncio
STR, INT = StringSerde(), IntegerSerde()


async def test_start_returns_once_the_store_holds_every_partition_to_its_end(tmp_path) -> None:
    bootstrap = f"memory://global-{uuid.uuid4().hex[:8]}"
    cluster = Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)
    await cluster.create_topics({"rows": 3})
    await cluster.produce("rows", [(f"k{i}", f"v{i}") for i in range(3000)] + [("k0", None), (None, "no key")],
                          STR, STR, partitions=3)
    spec = GlobalStoreSpec(StoreBuilder(StoreSupplier("g", False), STR, STR, logging=False), "rows", "src", "proc")
    store = open_global_stores([spec], str(tmp_path), False, STR, STR)[0]["g"]
    failures: list[BaseException] = []
    thread = GlobalStreamThread(client_id="c", stores_by_topic={"rows": store}, transport=cluster.transport,
                                poll_ms=10, read_committed=False, on_failure=failures.append)
    await anyio.to_thread.run_sync(thread.start, 30.0)
    try:
        # Checked at once: the bootstrap is what start waited for.
        assert store.approximate_num_entries() == 2999
        assert store.get("k0") is None and store.get("k2999") == "v2999"
        await cluster.produce("rows", [("k1", "new"), ("k2", None)], STR, STR, partitions=3)
        await eventually_async(lambda: store.get("k1") == "new" and store.get("k2") is None, timeout=10,
                               what="a record after the bootstrap applied")
    finally:
        await anyio.to_thread.run_sync(thread.shut_down, 10.0)
    assert not thread._thread.is_alive()
    assert failures == []
    store.close()


async def test_a_persistent_global_store_reads_only_the_tail_after_a_clean_stop_and_all_after_a_crash(
        tmp_path) -> None:
    bootstrap = f"memory://global-{uuid.uuid4().hex[:8]}"
    cluster = Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)
    await cluster.create_topics({"rows": 2})
    await cluster.produce("rows", [(f"k{i}", f"v{i}") for i in range(100)], STR, STR, partitions=2)
    builder = StreamsBuilder()
    builder.global_table("rows", key_serde=STR, value_serde=STR, materialized=Materialized("g", persistent=True))
    topology = builder.build()
    config = StreamsConfig({"application.id": "app", "bootstrap.servers": bootstrap, "poll.ms": 10})
    directory = str(tmp_path / "app")
    checkpoint_file = tmp_path / "app" / "global" / checkpoint.FILE_NAME

    async def started() -> GlobalTables:
        tables = GlobalTables(config, topology, cluster.transport, "c")
        await anyio.to_thread.run_sync(tables.start, directory, lambda: None)
        # While running there is no checkpoint: a crash now must read everything again.
        assert not checkpoint_file.exists()
        return tables

    tables = await started()
    assert tables.thread is not None and tables.thread.applied == 100
    await anyio.to_thread.run_sync(tables.shut_down)
    assert checkpoint_file.exists()
    await cluster.produce("rows", [("k1", "new"), ("k200", "v200")], STR, STR, partitions=2)

    tables = await started()
    assert tables.thread is not None and tables.thread.applied == 2  # the tail only
    store = tables.stores["g"]
    assert len(dict(store.all())) == 101 and store.get("k1") == "new" and store.get("k5") == "v5"
    thread, tables.thread = tables.thread, None  # a crash: the thread stops, no checkpoint is written
    await anyio.to_thread.run_sync(thread.shut_down, 10.0)
    tables.shut_down()

    tables = await started()
    assert tables.thread is not None and tables.thread.applied == 102  # all of it again
    assert len(dict(tables.stores["g"].all())) == 101
    await anyio.to_thread.run_sync(tables.shut_down)


class FailingReads:
    """The memory transport, but its readers' ``poll`` raises once ``fail`` is set."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self.fail: BaseException | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def reader(self, client_id: str, read_committed: bool = False) -> Any:
        inner = self._transport.reader(client_id, read_committed)
        outer = self

        class Reader:
            def __getattr__(self, name: str) -> Any:
                return getattr(inner, name)

            async def poll(self, timeout_ms: int, max_records: int | None = None) -> Any:
                if outer.fail is not None:
                    raise outer.fail
                return await inner.poll(timeout_ms, max_records)
        return Reader()


async def test_a_failure_fails_start_during_the_bootstrap_and_is_reported_after_it(tmp_path) -> None:
    bootstrap = f"memory://global-{uuid.uuid4().hex[:8]}"
    cluster = Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)
    await cluster.create_topics({"rows": 1})
    await cluster.produce("rows", [("k", "v")], STR, STR, partitions=1)
    spec = GlobalStoreSpec(StoreBuilder(StoreSupplier("g", False), STR, STR, logging=False), "rows", "src", "proc")
    transport = FailingReads(cluster.transport)
    failures: list[BaseException] = []

    def thread() -> GlobalStreamThread:
        store = open_global_stores([spec], str(tmp_path), False, STR, STR)[0]["g"]
        return GlobalStreamThread(client_id="c", stores_by_topic={"rows": store}, transport=transport,
                                  poll_ms=10, read_committed=False, on_failure=failures.append)

    transport.fail = RuntimeError("broker gone")
    with pytest.raises(RuntimeError, match="broker gone"):
        await anyio.to_thread.run_sync(thread().start, 30.0)
    assert failures == []  # start raised it: nothing more to report

    transport.fail = None
    running = thread()
    await anyio.to_thread.run_sync(running.start, 30.0)
    transport.fail = RuntimeError("broker gone later")
    await eventually_async(lambda: failures, timeout=10, what="the failure reported")
    assert str(failures[0]) == "broker gone later" and not running.ended_cleanly
    await anyio.to_thread.run_sync(running.shut_down, 10.0)


async def test_records_are_copied_while_bootstrapping_and_read_with_the_handler_after(tmp_path) -> None:
    """Kafka Streams restores a DSL global table's bytes as they are and reads each later record
    through its global task, whose deserialization handler (LogAndFail) ends the thread."""
    bootstrap = f"memory://global-{uuid.uuid4().hex[:8]}"
    cluster = Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)
    await cluster.create_topics({"rows": 1})
    await cluster.produce("rows", [("bad", b"\x01")], STR, BytesSerde(), partitions=1)
    spec = GlobalStoreSpec(StoreBuilder(StoreSupplier("g", False), STR, INT, logging=False), "rows", "src", "proc")
    store = open_global_stores([spec], str(tmp_path), False, STR, INT)[0]["g"]
    failures: list[BaseException] = []
    thread = GlobalStreamThread(client_id="c", stores_by_topic={"rows": store}, transport=cluster.transport,
                                poll_ms=10, read_committed=False, on_failure=failures.append,
                                updates=GlobalUpdates(LogAndFailExceptionHandler()))
    await anyio.to_thread.run_sync(thread.start, 30.0)
    try:
        assert store.inner.get(b"bad") == b"\x01"  # copied: the bootstrap reads no record
        await cluster.produce("rows", [("worse", b"\x02")], STR, BytesSerde(), partitions=1)
        await eventually_async(lambda: failures, timeout=10, what="the thread failed")
        assert isinstance(failures[0], DeserializationError) and store.inner.get(b"worse") is None
    finally:
        await anyio.to_thread.run_sync(thread.shut_down, 10.0)
