"""A standby task applies its changelogs' updates once their input records are committed, and
checkpoints where it is, so the active task's restore starts there (on the embedded broker)."""

from __future__ import annotations

import logging

import anyio
import anyio.lowlevel
import pytest

from streamloop.ids import TaskId
from streamloop.logcontext import LogContext
from streamloop.records import TopicPartition
from streamloop.serdes import BytesSerde
from streamloop.state import checkpoint
from streamloop.state.changelog import changelog_topic, encode_source
from streamloop.state.stores import Stores
from streamloop.state.task_state import TaskStateManager
from streamloop.tasks.standby import StandbyTask
from streamloop.testing import eventually_async
from streamloop.transport import open_transport
from streamloop.transport.base import OffsetAndMetadata, ProducerSettings
from streamloop.transport.memory import MemoryBroker

pytestmark = pytest.mark.anyio
INPUT = TopicPartition("in", 0)
CHANGELOG = TopicPartition(changelog_topic("app", "counts"), 0)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_updates_wait_for_their_input_records_commit_and_the_checkpoint_follows(tmp_path) -> None:
    MemoryBroker.reset("standby-unit")
    transport = open_transport({"bootstrap.servers": "memory://standby-unit"})
    admin = transport.admin("t")
    await admin.start()
    await admin.create_topics({"in": 1, CHANGELOG.topic: 1})
    producer = transport.producer(ProducerSettings(client_id="t"))
    await producer.start()
    # Changelog offset i holds key k<i>, made by input record 10 + i.
    for i in range(6):
        producer.append(CHANGELOG.topic, 0, f"k{i}".encode(), b"v", None, encode_source(("in", 10 + i)))
    await producer.flush()

    committed = {"offset": 13}

    async def committed_of(tp: TopicPartition) -> OffsetAndMetadata | None:
        assert tp == INPUT
        return OffsetAndMetadata(committed["offset"])

    def task() -> StandbyTask:
        log = LogContext(logging.getLogger(__name__), "")
        builder = Stores.key_value_store_builder(Stores.persistent_key_value_store("counts"))
        state = TaskStateManager("0_0", "app", str(tmp_path), 0, [builder], True, BytesSerde(), BytesSerde(),
                                 lambda *_: None, None, lambda: 0, lambda: None, log)
        return StandbyTask(TaskId(0, 0), [INPUT], state, lambda: transport.reader("r"), committed_of, 50, log,
                           poll_ms=20)

    directory = str(tmp_path / "app" / "0_0")
    standby = task()
    async with anyio.create_task_group() as group:
        group.start_soon(standby.run)
        # Inputs 10..12 are committed: their updates (changelog 0..2) apply; input 13's waits.
        await eventually_async(lambda: standby.positions.get(CHANGELOG) == 3, timeout=10)
        await eventually_async(lambda: checkpoint.read(directory) == {CHANGELOG: 3}, timeout=10)
        assert standby.applied == 3
        committed["offset"] = 15
        await eventually_async(lambda: standby.positions.get(CHANGELOG) == 5, timeout=10)
        await standby.close()
    assert checkpoint.read(directory) == {CHANGELOG: 5}
    assert standby.applied == 5

    # A new standby of the task goes on from the checkpoint: it applies only the last update.
    committed["offset"] = 16
    again = task()
    async with anyio.create_task_group() as group:
        group.start_soon(again.run)
        await eventually_async(lambda: again.positions.get(CHANGELOG) == 6, timeout=10)
        await again.close()
    assert again.applied == 1
    assert checkpoint.read(directory) == {CHANGELOG: 6}
    store = again.state.stores["counts"].inner
    store.open()
    try:
        assert [store.get(f"k{i}".encode()) for i in range(6)] == [b"v"] * 6
    finally:
        store.close()
    await producer.close()
    await admin.close()


async def test_a_standby_waiting_for_its_stores_lock_closes_at_once(tmp_path) -> None:
    """Its stores are still open elsewhere (the task's previous owner on this instance): closing it
    must not wait out the lock's patience (60 s), or the thread's rebalance would."""
    MemoryBroker.reset("standby-unit-lock")
    transport = open_transport({"bootstrap.servers": "memory://standby-unit-lock"})
    log = LogContext(logging.getLogger(__name__), "")
    builder = Stores.key_value_store_builder(Stores.persistent_key_value_store("counts"))

    def state() -> TaskStateManager:
        return TaskStateManager("0_0", "app", str(tmp_path), 0, [builder], True, BytesSerde(), BytesSerde(),
                                lambda *_: None, None, lambda: 0, lambda: None, log)

    holder = state()
    await holder.open_stores()

    async def nothing_committed(_tp: TopicPartition) -> OffsetAndMetadata | None:
        return None

    standby = StandbyTask(TaskId(0, 0), [INPUT], state(), lambda: transport.reader("r"), nothing_committed, 50, log)
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(standby.run)
            await anyio.lowlevel.checkpoint()  # it starts opening and waits for the lock
            with anyio.fail_after(5):
                await standby.close()
    finally:
        holder.close(clean=True)
    assert checkpoint.read(str(tmp_path / "app" / "0_0")) == {}
