"""Play a scenario against real ``KafkaStreams`` clients on the ``memory://`` broker.

The same steps ``TopologyTestDriver.play`` takes, played through the whole engine (stream
threads, the group protocol, the producer), so a property can compare the two:

- ``Input`` / ``BadRecord``: produced to the broker, partitioned as the driver does.
- ``Crash``: the broker fails the client's next produce to the first sink topic with a
  non-timeout error, so a stream thread dies with its output since the last commit lost;
  the client's uncaught-exception handler replaces it and the new thread reads again from
  the last commit (at-least-once: records after it may come out twice).
- ``ProcessorTimeout``: the broker times out the next ``times`` produces to the first sink
  topic; the thread takes a new producer and replays its tasks from their last commit (KIP-572).
- ``Rebalance``: a second client of the application joins (tasks move to it) and leaves.
- ``AdvanceWallClock``: not played (the clients run on the system clock).

The clients process records while they are produced, so a fault lands near its place in
the scenario rather than exactly there.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from streamloop import config as cfg
from streamloop.client import ClientState, KafkaStreams
from streamloop.config import StreamsConfig
from streamloop.errors import StreamsError
from streamloop.handlers.responses import StreamThreadExceptionResponse
from streamloop.records import TopicPartition
from streamloop.serdes import BytesSerde, Serde, as_serde
from streamloop.testing.scenario import BadRecord, Crash, Input, ProcessorTimeout, Rebalance, Step
from streamloop.testing.topics import TestRecord
from streamloop.testing.waiting import eventually_async
from streamloop.topology.topology import Topology
from streamloop.transport.memory import MemoryBroker
from streamloop.transport.memory.log import ProducedRecord
from streamloop.transport.partitioner import key_hash


class ScenarioCrash(StreamsError):
    """The error a ``Crash`` step makes the broker answer a produce with."""


async def play_on_memory_broker(
    topology: Callable[[], Topology],
    config: Mapping[str, Any],
    scenario: Sequence[Step],
    output_serdes: Mapping[str, tuple[Serde, Serde]],
    *,
    input_serdes: Mapping[str, tuple[Serde, Serde]] | None = None,
    partitions: Mapping[str, int] | None = None,
    timeout: float = 30.0,  # noqa: ASYNC109 - a budget per wait, as eventually_async's
) -> dict[str, list[TestRecord]]:
    """Play ``scenario`` on the ``memory://`` broker of ``config`` and return what the output
    topics hold once every source partition is committed to its end (per topic, in partition
    then offset order).

    ``topology`` makes a fresh topology per client. Topics are created with ``partitions``
    (1 by default). Raises ``ValueError`` unless ``bootstrap.servers`` is ``memory://…`` and
    ``TimeoutError`` when the clients do not finish within ``timeout`` seconds per wait.
    """
    settings = StreamsConfig(config)
    url = settings[cfg.BOOTSTRAP_SERVERS]
    if not url.startswith("memory://"):
        raise ValueError(f"play_on_memory_broker needs a memory:// bootstrap, got {url!r}")
    broker = MemoryBroker.for_url(url)
    shape = topology()
    counts = {t: (partitions or {}).get(t, 1) for t in shape.source_topics + shape.sink_topics}
    broker.create_topics({**counts, **{t: (partitions or {}).get(t, 1) for t in output_serdes}})
    sink = sorted(shape.sink_topics)[0] if shape.sink_topics else None
    round_robin = itertools.count()

    def serdes(topic: str) -> tuple[Serde, Serde]:
        given = (input_serdes or {}).get(topic)
        if given is not None:
            return given
        return (_serde(settings[cfg.DEFAULT_KEY_SERDE]), _serde(settings[cfg.DEFAULT_VALUE_SERDE]))

    def produce(topic: str, key: bytes | None, value: bytes | None, timestamp: int, headers: Any,
                partition: int | None) -> None:
        count = counts.get(topic) or broker.partition_counts([topic])[topic]
        if partition is None:
            partition = (next(round_robin) if key is None else key_hash(key)) % count
        broker.produce({TopicPartition(topic, partition % count): [ProducedRecord(key, value, timestamp,
                                                                                  tuple(headers))]})

    async def started() -> KafkaStreams:
        client = KafkaStreams(topology(), config)
        client.set_uncaught_exception_handler(lambda _exc: StreamThreadExceptionResponse.REPLACE_THREAD)
        await client.start_async()
        if not await client.wait_for_state_async(ClientState.RUNNING, timeout=timeout):
            raise TimeoutError(f"The client was not RUNNING within {timeout} s")
        return client

    streams = await started()
    try:
        for step in scenario:
            if isinstance(step, Input):
                key_serde, value_serde = serdes(step.topic)
                produce(step.topic, key_serde.serialize(step.key), value_serde.serialize(step.value),
                        step.timestamp, step.headers, step.partition)
            elif isinstance(step, BadRecord):
                produce(step.topic, step.key, step.value, step.timestamp, (), step.partition)
            elif isinstance(step, Crash) and sink is not None:
                broker.fail_produce(sink, ScenarioCrash("crash injected by the scenario"), times=1)
            elif isinstance(step, ProcessorTimeout) and sink is not None:
                broker.fail_produce(sink, TimeoutError("timeout injected by the scenario"), step.times)
            elif isinstance(step, Rebalance):
                other = await started()
                await other.close_async()
                if not await streams.wait_for_state_async(ClientState.RUNNING, timeout=timeout):
                    raise TimeoutError(f"The client was not RUNNING again within {timeout} s")
        group = settings[cfg.APPLICATION_ID]
        sources = [TopicPartition(t, p) for t in shape.source_topics for p in range(counts[t])]

        def all_committed() -> bool:
            ends = broker.end_offsets(sources)
            return all(_committed(broker, group, tp) >= ends[tp] for tp in sources)

        await eventually_async(all_committed, timeout=timeout, what="every source partition committed to its end")
    finally:
        await streams.close_async()
    return {topic: _read(broker, topic, key_serde, value_serde)
            for topic, (key_serde, value_serde) in output_serdes.items()}


def _committed(broker: MemoryBroker, group: str, tp: TopicPartition) -> int:
    committed = broker.committed(group, tp)
    return 0 if committed is None else committed.offset


def _read(broker: MemoryBroker, topic: str, key_serde: Serde, value_serde: Serde) -> list[TestRecord]:
    count = broker.partition_counts([topic])[topic]
    return [TestRecord(key_serde.deserialize(r.key), value_serde.deserialize(r.value), r.timestamp,
                       tuple(r.headers), topic, r.partition, r.offset)
            for p in range(count) for r in broker.records(TopicPartition(topic, p))]


def _serde(value: object) -> Serde:
    return BytesSerde() if value is None else as_serde(value, "serde")
