"""``processing.guarantee = exactly_once_v2`` on real Kafka.

The memory broker models no transactions, so exactly-once there is a ConfigError
(tested in tests/unit/test_exactly_once_config.py). Every check here reads the
output with a ``read_committed`` reader: a record of an aborted transaction must
never be seen, and each input's effect must be there exactly once.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from streamloop import StreamsBuilder
from streamloop.errors import ConfigError
from streamloop.handlers import StreamThreadExceptionResponse
from streamloop.records import ConsumerRecord, TopicPartition
from streamloop.serdes import IntegerSerde, JsonSerde, LongSerde, StringSerde
from streamloop.state import Materialized
from streamloop.testing import eventually_async
from tests.support.apps import count_topology, make_streams
from tests.support.cluster import Cluster, committed_offset

pytestmark = [pytest.mark.kafka, pytest.mark.asyncio]

STR, LONG, INT, JSON = StringSerde(), LongSerde(), IntegerSerde(), JsonSerde()
EOS = {"processing_guarantee": "exactly_once_v2"}
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def kafka(kafka_bootstrap: str) -> Cluster:
    from streamloop.transport import open_transport

    return Cluster(open_transport({"bootstrap.servers": kafka_bootstrap}), kafka_bootstrap)


async def read_committed(cluster: Cluster, topic: str) -> list[ConsumerRecord]:
    """Every committed record of ``topic`` up to its last stable offset, in offset order per partition."""
    return await cluster.read_all(topic, read_committed=True)


def assert_counts_exactly_once(output: list[ConsumerRecord], expected: Counter[str]) -> None:
    """Without a cache every input is one update: per key the counts are 1, 2, … n, each once."""
    per_key: dict[str, list[int]] = {}
    for record in sorted(output, key=lambda r: (r.partition, r.offset)):
        per_key.setdefault(STR.deserialize(record.key), []).append(LONG.deserialize(record.value))
    assert {k: v[-1] for k, v in per_key.items()} == dict(expected)
    for key, counts in per_key.items():
        assert counts == list(range(1, expected[key] + 1)), f"key {key}: {counts[:50]}"


async def wait_for_counts(cluster: Cluster, sink: str, expected: Counter[str], timeout: float = 90) -> None:
    latest: dict[str, int] = {}

    async def done() -> bool:
        latest.clear()
        for record in await read_committed(cluster, sink):
            latest[STR.deserialize(record.key)] = LONG.deserialize(record.value)
        return latest == dict(expected)

    try:
        await eventually_async(done, timeout, f"counts {dict(expected)}")
    except TimeoutError as exc:
        raise AssertionError(f"last counts {latest} != {dict(expected)}") from exc


def keyed(start: int, n: int, keys: int = 5) -> list[tuple[str, str]]:
    return [(f"k{i % keys}", f"v{i}") for i in range(start, start + n)]


async def test_count_with_thread_deaths_at_random_points_is_exactly_once(kafka: Cluster, names, tmp_path) -> None:
    source, sink = names("input"), names("counts")
    await kafka.create_topics({source: 2, sink: 2})
    rng = random.Random(12)
    records = keyed(0, 600)
    fail_on = {f"v{i}" for i in rng.sample(range(600), 4)}
    streams = make_streams(count_topology(source, sink, fail_on=fail_on), kafka.bootstrap, names.app,
                           state_dir=str(tmp_path), cache_max_bytes_buffering=0, num_stream_threads=2,
                           **EOS)
    streams.set_uncaught_exception_handler(lambda exc: StreamThreadExceptionResponse.REPLACE_THREAD)
    async with streams:
        for start in range(0, 600, 100):  # records keep flowing while threads die and are replaced
            await kafka.produce(source, records[start:start + 100], STR, STR, partitions=2)
        await wait_for_counts(kafka, sink, Counter(k for k, _ in records))
        assert streams.metric("failed-stream-threads") == 4
    output = await read_committed(kafka, sink)
    assert_counts_exactly_once(output, Counter(k for k, _ in records))


async def test_adding_and_removing_threads_while_records_flow(kafka: Cluster, names, tmp_path) -> None:
    source, sink = names("input"), names("out")
    await kafka.create_topics({source: 4, sink: 4})
    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .map_values(lambda value: {"n": value["n"]})
            .to(sink, key_serde=INT, value_serde=JSON))
    streams = make_streams(builder.build(), kafka.bootstrap, names.app, state_dir=str(tmp_path), **EOS)
    total = 0
    async with streams:
        for step in ("add", "add", "remove", "add", "remove", "remove"):
            batch = [(i, {"n": i}) for i in range(total, total + 150)]
            await kafka.produce(source, batch, INT, JSON, partitions=4)
            total += len(batch)
            if step == "add":
                assert await streams.add_stream_thread_async() is not None
            else:
                assert await streams.remove_stream_thread_async(timeout=30) is not None

        async def all_out() -> bool:
            return len(await read_committed(kafka, sink)) >= total
        await eventually_async(all_out, 90, f"{total} records out")
    seen = Counter(JSON.deserialize(r.value)["n"] for r in await read_committed(kafka, sink))
    assert set(seen) == set(range(total))
    assert [n for n, c in seen.items() if c > 1] == []


async def test_threads_joining_a_backlog_with_a_small_buffer_drain_it_exactly_once(kafka: Cluster, names,
                                                                                  tmp_path) -> None:
    # No crash (issue #19): each rebalance re-creates the tasks with committed offsets and a backlog
    # ahead; back-pressure pauses a partition (10 buffered) before its task's transactional.id is
    # initialised, and the seek back to the committed offset drops that buffer.
    source, sink, partitions = names("input"), names("out"), 12
    await kafka.create_topics({source: partitions, sink: partitions})
    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .map_values(lambda value: {"n": value["n"]})
            .to(sink, key_serde=INT, value_serde=JSON))
    streams = make_streams(builder.build(), kafka.bootstrap, names.app, state_dir=str(tmp_path),
                           buffered_records_per_partition=10, **EOS)
    total = 0

    async def produce(count: int) -> None:
        nonlocal total
        await kafka.produce(source, [(i, {"n": i}) for i in range(total, total + count)], INT, JSON,
                            partitions=partitions)
        total += count

    async def all_out() -> bool:
        return len(await read_committed(kafka, sink)) >= total

    async with streams:
        await produce(400)
        await eventually_async(all_out, 60, f"{total} records out before the backlog")
        for joined in (1, 2):
            await produce(3000)
            assert await streams.add_stream_thread_async() is not None
            await eventually_async(all_out, 60, f"{total} records out after thread {joined} joined")
    seen = Counter(JSON.deserialize(r.value)["n"] for r in await read_committed(kafka, sink))
    assert set(seen) == set(range(total))
    assert [n for n, c in seen.items() if c > 1] == []


async def test_a_zombie_is_fenced_and_its_tasks_migrate(kafka: Cluster, names, tmp_path, caplog) -> None:
    """A second instance takes a task over while the first still runs it: the first one's producer is
    fenced (its commit fails), it closes its tasks dirty and rejoins; no output is duplicated."""
    source, sink = names("input"), names("counts")
    await kafka.create_topics({source: 1, sink: 1})
    first = keyed(0, 200)
    await kafka.produce(source, first, STR, STR, partitions=1)
    one = make_streams(count_topology(source, sink), kafka.bootstrap, names.app, state_dir=str(tmp_path / "one"),
                       cache_max_bytes_buffering=0, **EOS)
    async with one:
        await wait_for_counts(kafka, sink, Counter(k for k, _ in first))
        # A stranger initialises the task's transactional.id, as a new owner would.
        zombie_killer = kafka.transport.producer(_settings(f"{names.app}-0_0"))
        await zombie_killer.start()
        await zombie_killer.close()
        second = keyed(200, 100)
        await kafka.produce(source, second, STR, STR, partitions=1)
        await wait_for_counts(kafka, sink, Counter(k for k, _ in first + second))
    assert_counts_exactly_once(await read_committed(kafka, sink), Counter(k for k, _ in first + second))
    assert await committed_offset(kafka, names.app, TopicPartition(source, 0)) == 300
    assert any("fenced: closing every task dirty and rejoining" in r.getMessage() for r in caplog.records)


async def test_a_timeout_corrupts_the_task_instead_of_retrying_the_record(kafka: Cluster, names, tmp_path,
                                                                           caplog) -> None:
    """Under at-least-once a timeout retries the record in place; under exactly-once part of the
    record's output may already be in the transaction, so the task is revived from its last commit."""
    source, sink = names("input"), names("counts")
    await kafka.create_topics({source: 1, sink: 1})
    timed_out: set[str] = set()

    def flaky(value: str) -> str:
        if value == "v150" and value not in timed_out:
            timed_out.add(value)
            raise TimeoutError("the lookup service did not answer")
        return value

    # The count forwards its update before the flaky branch runs: retrying the record in place would
    # count it twice; under exactly-once the transaction holding the first attempt is aborted.
    builder = StreamsBuilder()
    stream = builder.stream(source, key_serde=STR, value_serde=STR)
    (stream.group_by_key(key_serde=STR)
           .count(materialized=Materialized("counts"))
           .to_stream()
           .to(sink, key_serde=STR, value_serde=LONG))
    stream.map_values(flaky).to(names("side"), key_serde=STR, value_serde=STR)
    await kafka.create_topics({names("side"): 1})
    records = keyed(0, 300)
    await kafka.produce(source, records, STR, STR, partitions=1)
    streams = make_streams(builder.build(), kafka.bootstrap, names.app, state_dir=str(tmp_path),
                           cache_max_bytes_buffering=0, **EOS)
    async with streams:
        await wait_for_counts(kafka, sink, Counter(k for k, _ in records))
        assert streams.metric("failed-stream-threads") == 0
    assert_counts_exactly_once(await read_committed(kafka, sink), Counter(k for k, _ in records))
    side = Counter(STR.deserialize(r.value) for r in await read_committed(kafka, names("side")))
    assert set(side) == {v for _, v in records} and max(side.values()) == 1
    assert any("Revived tasks ['0_0'] from their last commit" in r.getMessage() for r in caplog.records)


def _settings(transactional_id: str) -> Any:
    from streamloop.transport.base import ProducerSettings

    return ProducerSettings(client_id="fencer", transactional_id=transactional_id)


async def test_exactly_once_on_the_memory_broker_is_a_config_error(names) -> None:
    with pytest.raises(ConfigError, match=r"processing.guarantee.*memory"):
        make_streams(count_topology("a", "b"), "memory://eos", names.app, **EOS)


@pytest.mark.timeout(240)
async def test_sigkill_mid_stream_then_restart_counts_each_input_once(kafka: Cluster, names, tmp_path,
                                                                     caplog) -> None:
    """The whole process dies with SIGKILL mid-transaction (no abort, no leave-group, no clean close)
    while counting into a RocksDB store. The store on disk holds only committed counts (its writes
    wait for the commit: streamloop.state.uncommitted); the restart restores the committed changelog
    past its checkpoint, and its producers fence the dead one's transactions: per key the committed
    output is 1, 2, … n, each once."""
    import json
    import logging
    import os
    import signal
    import sys
    import tempfile

    caplog.set_level(logging.INFO, logger="streamloop")
    source, sink = names("in"), names("out")
    await kafka.create_topics({source: 2, sink: 2})
    keys = 10
    records = [(i % keys, {"n": i}) for i in range(3000)]
    await kafka.produce(source, records, INT, JSON, partitions=2)
    root = ROOT
    state_dir = str(tmp_path / "state")
    kill_after = random.Random(7).randrange(300, 1500)
    with tempfile.TemporaryFile() as stderr:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.support.app_process", "--bootstrap", kafka.bootstrap,
            "--application-id", names.app, "--source", source, "--sink", sink, "--exactly-once", "--count",
            # Paced (up to 4 ms of I/O a record): unpaced, a fast machine finished and committed
            # every record before this test had read the lines it kills after, and nothing was left to restore.
            "--state-dir", state_dir, "--io-ms", "4", cwd=root, stdout=asyncio.subprocess.PIPE, stderr=stderr)
        try:
            seen = 0
            assert process.stdout is not None
            changelog = [TopicPartition(f"{names.app}-counts-changelog", p) for p in range(2)]

            async def changelog_written() -> bool:
                return sum((await kafka.end_offsets(changelog)).values()) > 0

            # Killed once past ``kill_after`` records and once the changelog holds some of their
            # updates (a busy machine may print many records before the first send): the restart
            # must then restore. The app prints a line per record; reading on keeps it from blocking.
            while True:
                line = await asyncio.wait_for(process.stdout.readline(), 90)
                if not line:
                    stderr.seek(0)
                    pytest.fail(f"the app processed {seen} records, then stopped:\n"
                                f"{stderr.read().decode(errors='replace')[-3000:]}")
                if json.loads(line)["event"] == "processed":
                    seen += 1
                    if seen >= kill_after and seen % 25 == 0 and await changelog_written():
                        break
            os.kill(process.pid, signal.SIGKILL)
        finally:
            if process.returncode is None:
                process.kill()
            await process.wait()

    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .group_by_key()
            .count(materialized=Materialized("counts"))
            .to_stream()
            .to(sink, key_serde=INT, value_serde=LONG))
    expected = Counter(k for k, _ in records)
    async with make_streams(builder.build(), kafka.bootstrap, names.app, state_dir=state_dir,
                            cache_max_bytes_buffering=0, **EOS):
        async def complete() -> bool:
            latest = {INT.deserialize(r.key): LONG.deserialize(r.value) for r in await read_committed(kafka, sink)}
            return latest == dict(expected)

        await eventually_async(complete, 120, "every key's full count in the committed output after the restart")
    per_key: dict[int, list[int]] = {}
    for record in sorted(await read_committed(kafka, sink), key=lambda r: (r.partition, r.offset)):
        per_key.setdefault(INT.deserialize(record.key), []).append(LONG.deserialize(record.value))
    assert per_key == {k: list(range(1, n + 1)) for k, n in expected.items()}
    # The killed process left RocksDB stores at a commit and their checkpoint: the restart restored the tail.
    assert any("Restored store 'counts'" in r.getMessage() for r in caplog.records)


async def test_records_in_flight_go_on_while_the_transaction_commits(kafka: Cluster, names, tmp_path,
                                                                    monkeypatch) -> None:
    """A commit holds the task's lock for its round trips to the broker. Records in flight that
    complete meanwhile are passed and free their slots, their output held for the next transaction,
    so the workers go on: before, each worker stopped at its first completed record until the
    commit ended (at most ``num.threads.per.task`` records per commit). Output stays exactly once."""
    from streamloop.transport.kafka.producer import KafkaProducer

    commit = KafkaProducer.commit_transaction
    current: list[int] = []  # the number of the commit under way, if any
    commits = itertools.count(1)
    done_during: Counter[int] = Counter()

    async def slow_commit(self: KafkaProducer, offsets: Any, group_id: str) -> None:
        current.append(next(commits))
        try:
            await asyncio.sleep(0.5)  # a broker far away
            await commit(self, offsets, group_id)
        finally:
            current.clear()

    monkeypatch.setattr(KafkaProducer, "commit_transaction", slow_commit)

    async def io(value: dict[str, int]) -> dict[str, int]:
        await asyncio.sleep(0.005)
        if current:
            done_during[current[0]] += 1
        return value

    source, sink, total, limit = names("input"), names("out"), 600, 8
    await kafka.create_topics({source: 1, sink: 1})
    await kafka.produce(source, [(i, {"n": i}) for i in range(total)], INT, JSON, partitions=1)
    builder = StreamsBuilder()
    builder.stream(source, key_serde=INT, value_serde=JSON).map_values(io).to(sink, key_serde=INT, value_serde=JSON)
    streams = make_streams(builder.build(), kafka.bootstrap, names.app, state_dir=str(tmp_path),
                           num_threads_per_task=limit, **EOS)
    async with streams:
        async def all_out() -> bool:
            return len(await read_committed(kafka, sink)) >= total
        await eventually_async(all_out, 90, f"{total} records out")
    assert max(done_during.values(), default=0) > 3 * limit, done_during
    seen = Counter(JSON.deserialize(r.value)["n"] for r in await read_committed(kafka, sink))
    assert set(seen) == set(range(total))
    assert [n for n, c in seen.items() if c > 1] == []
