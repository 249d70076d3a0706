"""PAUSE/CONTINUE at random bad records: every good record before a pause is processed exactly once
in order, nothing after it until resume, and after resume(skip) the output is the good input."""

from __future__ import annotations

import asyncio
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamloop import ClientState, StreamsBuilder
from streamloop.handlers import DeserializationHandlerResponse
from streamloop.serdes import IntegerSerde, JsonSerde
from streamloop.testing import eventually_async
from streamloop.transport import open_transport
from streamloop.transport.base import ProducerSettings
from tests.support.apps import make_streams
from tests.support.cluster import Cluster

INT, JSON = IntegerSerde(), JsonSerde()
PAUSE, CONTINUE = DeserializationHandlerResponse.PAUSE, DeserializationHandlerResponse.CONTINUE


class ScriptedHandler:
    """Answers per (partition, offset), as the test drew it."""

    def __init__(self, answers: dict[tuple[int, int], DeserializationHandlerResponse]) -> None:
        self.answers = answers

    def configure(self, config: object) -> None:
        pass

    def handle(self, context, record, exception) -> DeserializationHandlerResponse:
        return self.answers[(context.partition, context.offset)]


# Per partition: a list of records, each None (bad bytes) or an int (good value).
partitions_strategy = st.lists(st.lists(st.one_of(st.none(), st.integers(0, 10**6)), max_size=12),
                               min_size=1, max_size=3)


async def scenario(layout: list[list[int | None]], answers: dict) -> None:
    bootstrap = f"memory://pause-prop-{uuid.uuid4().hex[:8]}"
    cluster = Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)
    n = len(layout)
    await cluster.create_topics({"in": n, "out": n})
    producer = cluster.transport.producer(ProducerSettings("p"))
    await producer.start()
    for partition, records in enumerate(layout):
        for value in records:
            raw = b"\xff not json" if value is None else JSON.serialize({"p": partition, "v": value})
            producer.append("in", partition, INT.serialize(partition), raw, None, ())
    await producer.flush()
    await producer.close()

    builder = StreamsBuilder()
    builder.stream("in", key_serde=INT, value_serde=JSON).to("out", key_serde=INT, value_serde=JSON)
    streams = make_streams(builder.build(), bootstrap, "pause-prop", num_stream_threads=2,
                           default_deserialization_exception_handler=ScriptedHandler(answers))

    async def output_of(partition: int) -> list[int]:
        out = await cluster.read_all("out")
        return [JSON.deserialize(r.value)["v"] for r in sorted(out, key=lambda r: r.offset)
                if JSON.deserialize(r.value)["p"] == partition]

    async with streams:
        # A rebalance moves a paused task and makes it pause again at the same record: wait for
        # the group to settle first.
        await eventually_async(lambda: streams.state is ClientState.RUNNING and (n < 2 or all(
            m.active_tasks for m in streams.metadata_for_local_threads())), 20, "a settled group")
        # Walk each partition through its pauses; the other partitions run meanwhile.
        for partition, records in enumerate(layout):
            pauses = [o for o, v in enumerate(records) if v is None and answers[(partition, o)] is PAUSE]
            for offset in pauses:
                want = [v for v in records[:offset] if v is not None]
                await eventually_async(
                    lambda partition=partition: any(
                        t.task_id.partition == partition for t in streams.paused_local_tasks()),
                    20, f"partition {partition} paused at offset {offset}")
                await eventually_async(lambda partition=partition, want=want: _equals(output_of(partition), want), 20,
                                       f"good records before offset {offset}")
                await asyncio.sleep(0)  # give a wrongly running task a chance to show itself
                assert await output_of(partition) == want  # nothing after the pause
                assert await streams.resume_async(f"0_{partition}", skip=True)
        for partition, records in enumerate(layout):
            want = [v for v in records if v is not None]
            await eventually_async(lambda partition=partition, want=want: _equals(output_of(partition), want), 20,
                                   "all good records")
    for partition, records in enumerate(layout):
        assert await output_of(partition) == [v for v in records if v is not None]  # exactly once, in order


async def _equals(actual, want: list[int]) -> bool:
    return await actual == want


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=partitions_strategy, data=st.data())
def test_pause_and_continue_at_random_bad_records(layout: list[list[int | None]], data) -> None:
    answers = {(p, o): data.draw(st.sampled_from([PAUSE, CONTINUE]))
               for p, records in enumerate(layout) for o, v in enumerate(records) if v is None}
    asyncio.run(scenario(layout, answers))
