"""The ``TopologyTestDriver`` behaves as the engine does: the same topologies run through the driver
and through a real ``KafkaStreams`` client on ``memory://`` give the same output for hypothesis-drawn
input (bad records included, dropped by the CONTINUE handler on both).

What must match: every output record (key, value, timestamp, headers) lands in the same partition,
the same number of times, and each key's records come out in the same order. The interleaving of
different keys is the driver's own (the engine's depends on thread timing).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

from aiokafka.partitioner import murmur2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import KafkaStreams, StreamsBuilder, Topology
from engine.serdes import IntegerSerde, StringSerde
from engine.testing import BadRecord, Input, Step, TopologyTestDriver
from engine.testing.strategies import faults, records, scenarios
from engine.transport import open_transport
from engine.transport.base import ProducerSettings
from tests.support.apps import streams_config
from tests.support.cluster import Cluster

STR, INT = StringSerde(), IntegerSerde()
PARTITIONS = 3
CONTINUE = {"default.deserialization.exception.handler": "handlers.LogAndContinueExceptionHandler"}


async def double_later(value: int) -> int:
    await asyncio.sleep(0)
    return value * 2


def chain() -> Topology:
    """Filter, an async map and a flat_map in one sub-topology."""
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=INT)
            .filter(lambda key, value: value % 3 != 0)
            .map_values(double_later)
            .flat_map(lambda key, value: [(key, value), (key + "!", -value)])
            .to("out", key_serde=STR, value_serde=INT))
    return builder.build()


def through() -> Topology:
    """Two sub-topologies joined by a topic: the first re-keys, the second reads what it wrote."""
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=INT)
            .select_key(lambda key, value: f"{key}{value % 2}")
            .to("middle", key_serde=STR, value_serde=INT))
    (builder.stream("middle", key_serde=STR, value_serde=INT)
            .map_values(lambda value: value + 1)
            .to("out", key_serde=STR, value_serde=INT))
    return builder.build()


def branches() -> Topology:
    """split() into negative, small and default branches, each mapped differently."""
    builder = StreamsBuilder()
    split = (builder.stream("in", key_serde=STR, value_serde=INT).split(name="b-")
             .branch(lambda key, value: value < 0, name="neg")
             .branch(lambda key, value: value < 100, name="small")
             .default_branch(name="big"))
    split["b-neg"].map_values(lambda value: -value).to("out", key_serde=STR, value_serde=INT)
    split["b-small"].to("out", key_serde=STR, value_serde=INT)
    split["b-big"].map_values(lambda value: value // 100).to("out", key_serde=STR, value_serde=INT)
    return builder.build()


TOPICS = {chain: ["in", "out"], through: ["in", "middle", "out"], branches: ["in", "out"]}
SCENARIOS = scenarios(records("in", st.text(alphabet="abc", max_size=2), st.integers(-300, 300), max_size=40,
                              out_of_order_ms=200, with_headers=True),
                      faults=faults(bad_record_topics=["in"], timeouts=False, crashes=False, rebalances=False),
                      max_faults=3)

Output = list[tuple[int, str, int, int, tuple[tuple[str, bytes], ...]]]


def through_driver(make: Callable[[], Topology], scenario: list[Step]) -> Output:
    partitions = {topic: PARTITIONS for topic in TOPICS[make]}
    with TopologyTestDriver(make(), CONTINUE, partitions=partitions) as driver:
        out = driver.create_output_topic("out", STR, INT)
        driver.play(scenario, {"in": (STR, INT)})
        return [(r.partition, r.key, r.value, r.timestamp, tuple(r.headers)) for r in out.read_records()]


async def through_engine(make: Callable[[], Topology], scenario: list[Step], expected: int) -> Output:
    bootstrap = f"memory://same-{uuid.uuid4().hex[:8]}"
    cluster = Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)
    await cluster.create_topics({topic: PARTITIONS for topic in TOPICS[make]})
    producer = cluster.transport.producer(ProducerSettings(client_id="same-input"))
    await producer.start()
    for step in scenario:
        if isinstance(step, Input):
            key = STR.serialize(step.key)
            # Kafka's default partitioner, as the driver's input topics use it.
            partition = (murmur2(key) & 0x7FFFFFFF) % PARTITIONS  # type: ignore[arg-type]
            producer.append("in", partition, key, INT.serialize(step.value), step.timestamp, step.headers)
        elif isinstance(step, BadRecord):
            producer.append("in", step.partition % PARTITIONS, step.key, step.value, step.timestamp, ())
    await producer.flush()
    await producer.close()
    config = {**streams_config(bootstrap, f"same-{uuid.uuid4().hex[:6]}"), **CONTINUE}
    async with KafkaStreams(make(), config):
        await cluster.read("out", expected, timeout=20)
    written = sorted(await cluster.read_all("out"), key=lambda r: (r.partition, r.offset))
    return [(r.partition, STR.deserialize(r.key), INT.deserialize(r.value), r.timestamp, tuple(r.headers))
            for r in written]


def same_behaviour(driver: Output, engine: Output) -> None:
    assert sorted(driver) == sorted(engine), "different records, partitions or counts"
    for key in {record[1] for record in driver}:
        assert [r for r in driver if r[1] == key] == [r for r in engine if r[1] == key], f"order of key {key!r}"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(make=st.sampled_from([chain, through, branches]), scenario=SCENARIOS)
def test_the_driver_and_a_kafka_streams_client_give_the_same_output(make: Callable[[], Topology],
                                                                   scenario: list[Step]) -> None:
    driver = through_driver(make, scenario)
    engine: Any = asyncio.run(through_engine(make, scenario, len(driver)))
    same_behaviour(driver, engine)
