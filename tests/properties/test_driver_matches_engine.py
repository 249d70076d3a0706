"""The ``TopologyTestDriver`` behaves as the engine does: the same topologies run through the driver
and through a real ``KafkaStreams`` client on ``memory://`` give the same output for hypothesis-drawn
input (bad records included, dropped by the CONTINUE handler on both).

What must match: every output record (key, value, timestamp, headers) lands in the same partition,
the same number of times, and each key's records come out in the same order. The interleaving of
different keys is the driver's own (the engine's depends on thread timing).
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Callable
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamloop import StreamsBuilder, Topology
from streamloop.serdes import IntegerSerde, StringSerde
from streamloop.testing import Input, Step, TopologyTestDriver
from streamloop.testing.memory_play import play_on_memory_broker
from streamloop.testing.strategies import faults, records, scenarios
from tests.support.apps import streams_config

STR, INT = StringSerde(), IntegerSerde()
PARTITIONS = 3
CONTINUE = {"default.deserialization.exception.handler": "streamloop.handlers.LogAndContinueExceptionHandler"}


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
OUT_SERDES = {"out": (STR, INT)}
IN_SERDES = {"in": (STR, INT)}


def through_driver(make: Callable[[], Topology], scenario: list[Step]) -> Output:
    partitions = {topic: PARTITIONS for topic in TOPICS[make]}
    with TopologyTestDriver(make(), CONTINUE, partitions=partitions) as driver:
        out = driver.create_output_topic("out", STR, INT)
        driver.play(scenario, IN_SERDES)
        return [(r.partition, r.key, r.value, r.timestamp, tuple(r.headers)) for r in out.read_records()]


def through_engine(make: Callable[[], Topology], scenario: list[Step]) -> Output:
    bootstrap = f"memory://same-{uuid.uuid4().hex[:8]}"
    config = {**streams_config(bootstrap, f"same-{uuid.uuid4().hex[:6]}"), **CONTINUE}
    written = asyncio.run(play_on_memory_broker(
        make, config, scenario, OUT_SERDES, input_serdes=IN_SERDES,
        partitions={topic: PARTITIONS for topic in TOPICS[make]}))
    return [(r.partition, r.key, r.value, r.timestamp, tuple(r.headers)) for r in written["out"]]


def per_key(output: Output) -> dict[str, Output]:
    grouped: dict[str, Output] = {}
    for record in output:
        grouped.setdefault(record[1], []).append(record)
    return grouped


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(make=st.sampled_from([chain, through, branches]), scenario=SCENARIOS)
def test_the_driver_and_a_kafka_streams_client_give_the_same_output(make: Callable[[], Topology],
                                                                   scenario: list[Step]) -> None:
    driver, engine = through_driver(make, scenario), through_engine(make, scenario)
    assert sorted(driver) == sorted(engine), "different records, partitions or counts"
    assert per_key(driver) == per_key(engine), "a key's records in a different order"


def numbered(scenario: list[Step]) -> list[Step]:
    """Input timestamps become 0, 1, 2, ...: each output record then says which input made it."""
    count = itertools.count()
    return [replace(step, timestamp=next(count)) if isinstance(step, Input) else step for step in scenario]


FAULTY = scenarios(records("in", st.text(alphabet="abc", max_size=2), st.integers(-300, 300), max_size=30),
                   faults=faults(bad_record_topics=["in"], max_timeouts=2), max_faults=3).map(numbered)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(make=st.sampled_from([chain, through, branches]), scenario=FAULTY)
def test_under_faults_the_engine_gives_the_drivers_output_with_at_most_replays(
        make: Callable[[], Topology], scenario: list[Step]) -> None:
    """Crashes, timeouts and rebalances on the engine replay records since the last commit (the
    driver commits after every record): the engine's output may repeat records, but its distinct
    records are the driver's and, its repeats dropped, each key's records come in the same order."""
    driver, engine = through_driver(make, scenario), through_engine(make, scenario)
    assert len(set(driver)) == len(driver), "the driver commits after every record: nothing replayed"
    assert set(driver) == set(engine)
    for key, records_ in per_key(engine).items():
        assert list(dict.fromkeys(records_)) == per_key(driver)[key], f"order of key {key!r}"
