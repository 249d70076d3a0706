"""A dedicated Kafka broker behind the fault proxy (tests/support/fault_proxy.py), with aiokafka.

The broker advertises the proxy's address, so every client connection after the
bootstrap one (and the bootstrap one too, here) goes through the proxy, and
stalling or dropping the proxy cuts the client off the broker.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, KafkaTimeoutError, RequestTimedOutError
from aiokafka.structs import TopicPartition

from streamloop.testing import eventually_async
from tests.integration.conftest import LEAKED_CONNECTION
from tests.support.fault_proxy import Mode, ProxiedKafka, proxied_kafka

pytestmark = [pytest.mark.kafka, pytest.mark.usefixtures("collect_leaked_connections"),
              pytest.mark.filterwarnings(LEAKED_CONNECTION)]

DEADLINE = 20.0
# Short, so that a stalled request times out quickly.
REQUEST_TIMEOUT_MS = 1000


@pytest.fixture(scope="module")
def kafka() -> Iterator[ProxiedKafka]:
    with proxied_kafka() as cluster:
        yield cluster


@pytest.fixture(autouse=True)
def _passing_through(kafka: ProxiedKafka) -> Iterator[None]:
    kafka.proxy.pass_through()
    yield
    kafka.proxy.pass_through()


async def wait_until(condition: Callable[[], bool], what: str) -> None:
    await eventually_async(condition, DEADLINE, what, interval=0.02)


@pytest_asyncio.fixture
async def topic(kafka: ProxiedKafka) -> str:
    name = f"proxied-{uuid.uuid4().hex[:10]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)])
    finally:
        await admin.close()
    return name


@pytest_asyncio.fixture
async def producer(kafka: ProxiedKafka, topic: str) -> AsyncIterator[AIOKafkaProducer]:
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka.bootstrap,
        request_timeout_ms=REQUEST_TIMEOUT_MS,
        retry_backoff_ms=50,
        linger_ms=0,
    )
    await producer.start()
    try:
        # Also loads the topic's metadata, so a later send needs only the produce request.
        await producer.send_and_wait(topic, b"warm-up")
        yield producer
    finally:
        await producer.stop()


async def read_values(
    bootstrap: str, topic: str, until: Callable[[list[bytes]], bool]
) -> list[bytes]:
    """The values of ``topic``'s partition 0 from the start, read until ``until(values)``."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        values: list[bytes] = []
        deadline = time.monotonic() + DEADLINE
        while not until(values):
            assert time.monotonic() < deadline, f"gave up waiting for more than {values}"
            batch = await consumer.getmany(tp, timeout_ms=200)
            values += [record.value for record in batch.get(tp, [])]
        return values
    finally:
        await consumer.stop()


def ending_with(last: bytes) -> Callable[[list[bytes]], bool]:
    return lambda values: bool(values) and values[-1] == last


async def send_after_recovery(producer: AIOKafkaProducer, topic: str, value: bytes) -> float:
    """Send until it succeeds (the client may still be reconnecting); return the seconds taken."""
    started = time.monotonic()
    while True:
        try:
            await producer.send_and_wait(topic, value)
            return time.monotonic() - started
        except KafkaError:
            if time.monotonic() - started > DEADLINE:
                raise


def test_the_broker_advertises_the_proxy_and_keeps_its_controller_listener(
    kafka: ProxiedKafka,
) -> None:
    broker, proxy = kafka.broker, kafka.proxy
    assert broker.dir is not None and broker.port is not None
    props = dict(
        line.split("=", 1)
        for line in (broker.dir / "server.properties").read_text().splitlines()
        if "=" in line
    )
    assert props["advertised.listeners"] == f"PLAINTEXT://127.0.0.1:{proxy.port}"
    assert props["listeners"] == (
        f"PLAINTEXT://127.0.0.1:{broker.port},CONTROLLER://127.0.0.1:{broker.controller_port}"
    )
    assert props["controller.quorum.voters"] == f"1@127.0.0.1:{broker.controller_port}"
    assert kafka.bootstrap == proxy.address != broker.bootstrap
    assert proxy.target_port == broker.port


@pytest.mark.asyncio
async def test_metadata_names_the_proxy(kafka: ProxiedKafka) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        cluster = await admin.describe_cluster()
    finally:
        await admin.close()
    assert [(b["host"], b["port"]) for b in cluster["brokers"]] == [
        ("127.0.0.1", kafka.proxy.port)
    ]


@pytest.mark.asyncio
async def test_produce_and_consume_through_the_proxy(
    kafka: ProxiedKafka, topic: str, producer: AIOKafkaProducer
) -> None:
    before = kafka.proxy.stats()
    values = [f"record-{i}".encode() for i in range(50)]
    for value in values:
        await producer.send(topic, value)
    await producer.flush()
    assert await read_values(kafka.bootstrap, topic, ending_with(values[-1])) == [
        b"warm-up",
        *values,
    ]
    after = kafka.proxy.stats()
    assert after.bytes_to_target - before.bytes_to_target > sum(map(len, values))
    assert after.bytes_to_client - before.bytes_to_client > sum(map(len, values))
    assert after.connections_accepted > before.connections_accepted  # the consumer's


@pytest.mark.asyncio
async def test_a_stall_times_a_producer_out_and_it_recovers(
    kafka: ProxiedKafka, topic: str, producer: AIOKafkaProducer
) -> None:
    proxy = kafka.proxy
    proxy.stall()
    started = time.monotonic()
    with pytest.raises((KafkaTimeoutError, RequestTimedOutError)) as failure:
        await asyncio.wait_for(producer.send_and_wait(topic, b"during-stall"), DEADLINE)
    took = time.monotonic() - started
    print(f"\nstall: {type(failure.value).__name__} after {took:.2f} s")
    assert took >= REQUEST_TIMEOUT_MS / 1000 * 0.9
    assert proxy.mode is Mode.STALLED
    assert proxy.connections_active >= 1  # held open, not closed

    proxy.pass_through()
    recovery = await send_after_recovery(producer, topic, b"after-stall")
    print(f"stall: recovered in {recovery:.2f} s")
    values = await read_values(kafka.bootstrap, topic, ending_with(b"after-stall"))
    print(f"stall: log holds {values}")
    # The produce request held by the stall still reaches the broker afterwards (as it would
    # on a slow network): the timed-out record may well be in the log, before "after-stall".
    assert values[0] == b"warm-up"
    assert values[-1] == b"after-stall"
    assert set(values[1:-1]) <= {b"during-stall"}


@pytest.mark.asyncio
async def test_a_drop_fails_a_producer_and_it_recovers(
    kafka: ProxiedKafka, topic: str, producer: AIOKafkaProducer
) -> None:
    proxy = kafka.proxy
    before = proxy.stats()
    proxy.drop()
    started = time.monotonic()
    with pytest.raises(KafkaError) as failure:
        await asyncio.wait_for(producer.send_and_wait(topic, b"during-drop"), DEADLINE)
    took = time.monotonic() - started
    print(f"\ndrop: {type(failure.value).__name__} after {took:.2f} s")
    assert proxy.connections_dropped > before.connections_dropped
    await wait_until(
        lambda: proxy.connections_refused > before.connections_refused,
        "the producer to try to reconnect",
    )

    proxy.pass_through()
    recovery = await send_after_recovery(producer, topic, b"after-drop")
    print(f"drop: recovered in {recovery:.2f} s")
    # Dropped connections lose what they held: the failed record is not in the log.
    values = await read_values(kafka.bootstrap, topic, ending_with(b"after-drop"))
    assert values == [b"warm-up", b"after-drop"]


@pytest.mark.asyncio
async def test_a_stalled_consumer_sees_no_records_and_its_commit_hangs(
    kafka: ProxiedKafka, topic: str, producer: AIOKafkaProducer
) -> None:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka.bootstrap,
        group_id=f"group-{topic}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        request_timeout_ms=REQUEST_TIMEOUT_MS,
        session_timeout_ms=10_000,
        heartbeat_interval_ms=1_000,
    )
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        fetched: list[bytes] = []
        deadline = time.monotonic() + DEADLINE
        while fetched != [b"warm-up"]:
            assert time.monotonic() < deadline, f"fetched only {fetched}"
            batch = await consumer.getmany(tp, timeout_ms=200)
            fetched += [record.value for record in batch.get(tp, [])]

        kafka.proxy.stall()
        # Fetching just finds nothing; no error surfaces.
        assert await consumer.getmany(tp, timeout_ms=300) == {}
        # aiokafka retries a commit's retriable errors (its request timeouts included)
        # without a deadline of its own: only the caller's timeout ends it.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(consumer.commit(), REQUEST_TIMEOUT_MS / 1000 * 1.5)

        kafka.proxy.pass_through()
        await send_after_recovery(producer, topic, b"after-stall")
        while fetched[-1] != b"after-stall":
            assert time.monotonic() < deadline, f"fetched only {fetched}"
            batch = await consumer.getmany(tp, timeout_ms=200)
            fetched += [record.value for record in batch.get(tp, [])]
        # The stall was shorter than the session timeout: no rebalance, the commit succeeds.
        await asyncio.wait_for(consumer.commit(), DEADLINE)
        assert fetched == [b"warm-up", b"after-stall"]
    finally:
        await consumer.stop()
