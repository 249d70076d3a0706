"""``play_on_memory_broker``: a scenario played through real clients on the memory broker."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from streamloop import StreamsBuilder, Topology
from streamloop.serdes import IntegerSerde, StringSerde
from streamloop.testing import Crash, Input, play_on_memory_broker
from tests.support.apps import streams_config

STR, INT = StringSerde(), IntegerSerde()


def doubling() -> Topology:
    builder = StreamsBuilder()
    builder.stream("in", key_serde=STR, value_serde=INT).map_values(lambda v: v * 2).to(
        "out", key_serde=STR, value_serde=INT)
    return builder.build()


def test_a_scenario_with_a_crash_comes_out_complete_and_in_key_order() -> None:
    config = streams_config(f"memory://play-{uuid.uuid4().hex[:8]}", "play-app")
    scenario = [Input("in", "a", n, n) for n in range(5)] + [Crash()] + [Input("in", "a", n, n) for n in range(5, 9)]
    output = asyncio.run(play_on_memory_broker(doubling, config, scenario, {"out": (STR, INT)},
                                               input_serdes={"in": (STR, INT)}))
    values = [r.value for r in output["out"]]
    assert list(dict.fromkeys(values)) == [2 * n for n in range(9)]


def test_it_needs_the_memory_broker() -> None:
    config = streams_config("localhost:9092", "play-app")
    with pytest.raises(ValueError, match="needs a memory:// bootstrap"):
        asyncio.run(play_on_memory_broker(doubling, config, [], {"out": (STR, INT)}))
