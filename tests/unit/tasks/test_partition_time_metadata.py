"""Partition time in the commit metadata: the format, what a commit carries, what a task restores.

Kafka Streams commits each partition's time in its offset's metadata (``StreamTask.encodeTimestamp``)
and a task initialised from the commit starts from it (``StreamTaskTest.shouldReadCommittedStreamTimeOnInitialize``).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamloop.completed_offsets import (
    METADATA_MAX_BYTES,
    CommitMetadata,
    decode_completed,
    decode_metadata,
    encode_metadata,
)
from streamloop.processors.api import BaseProcessor, ProcessorContext, PunctuationType
from streamloop.records import Record, TopicPartition
from streamloop.tasks.positions import Positions
from streamloop.transport.base import OffsetAndMetadata

from .test_task import IN, TaskRig, plain, positions_of

# -- the format --------------------------------------------------------------------------------


@given(watermark=st.integers(0, 10**12), time=st.integers(-(2**63), 2**63 - 1),
       above=st.sets(st.integers(1, 10**6), max_size=200))
def test_partition_time_and_completed_offsets_round_trip(watermark: int, time: int, above: set[int]) -> None:
    completed = {watermark + d for d in above}
    text = encode_metadata(watermark, time, completed)
    assert len(text) <= METADATA_MAX_BYTES
    decoded = decode_metadata(watermark, text)
    assert decoded.partition_time == max(time, -1)
    # Cut to fit: what is kept is the lowest offsets, the ones a restart reaches first.
    assert decoded.completed == frozenset(sorted(completed)[:len(decoded.completed)])
    if len(text) < METADATA_MAX_BYTES - 20:
        assert decoded.completed == completed
    # The state manager and standbys read completed offsets through the v1 reader: it reads v2.
    assert decode_completed(watermark, text) == set(decoded.completed)


def test_nothing_known_is_no_metadata_at_all() -> None:
    assert encode_metadata(7, -1, set()) == ""
    assert decode_metadata(7, "") == CommitMetadata()
    assert decode_metadata(7, None) == CommitMetadata()


def test_a_v1_commit_still_decodes_to_its_completed_offsets_without_a_time() -> None:
    assert decode_metadata(10, "sl1:2,5") == CommitMetadata(-1, frozenset({12, 15}))


def test_a_later_version_or_foreign_metadata_is_nothing_known(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert decode_metadata(10, "sl9:61000;1") == CommitMetadata()
    assert "unsupported version sl9" in caplog.text
    assert decode_metadata(10, "AQAAAAAAAA7w") == CommitMetadata()  # e.g. Kafka Streams' base64
    assert decode_metadata(10, "sl2:oops") == CommitMetadata()


# -- what a commit carries ------------------------------------------------------------------------


def test_each_moved_position_carries_its_partition_time_and_a_flushed_one_the_time_of_the_flush() -> None:
    times = {IN: 5_000}
    positions = Positions([IN], lambda tp: times.get(tp, -1))
    positions.next[IN] = 3
    positions.flushed()
    positions.next[IN] = 9
    times[IN] = 90_000  # records after the flush raised the time

    assert positions.moved(flushed_only=False) == {IN: OffsetAndMetadata(9, "sl2:90000")}
    # The flushed position goes with the time then: a record after it, processed again after a
    # crash, must not meet the time it raised itself.
    assert positions.moved(flushed_only=True) == {IN: OffsetAndMetadata(3, "sl2:5000")}


def test_with_records_in_flight_the_time_joins_the_completed_offsets() -> None:
    positions = Positions([IN], lambda tp: 61_000)
    positions.next[IN] = 4
    moved = positions.moved_with_metadata(lambda tp, watermark: "sl1:2" if watermark == 4 else "")
    assert moved == {IN: OffsetAndMetadata(4, "sl2:61000;2")}
    assert decode_metadata(4, moved[IN].metadata) == CommitMetadata(61_000, frozenset({6}))


@pytest.mark.asyncio
async def test_a_task_commits_the_time_of_the_records_it_took() -> None:
    rig = TaskRig(passing_topology_in())
    rig.add(IN, plain(0, b"a", 1_000), plain(1, b"b", 61_000), plain(2, b"c", 2_000))
    async with rig.running():
        await rig.processed(3)
    offsets = rig.task.committable_offsets()
    assert positions_of(offsets) == {IN: 3}
    assert decode_metadata(3, offsets[IN].metadata).partition_time == 61_000


# -- what a task restores -----------------------------------------------------------------------


class Punctuated(BaseProcessor):
    """Schedules a stream-time punctuation every 10 s and keeps the times it fired at."""

    fired: list[int]

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.fired = []
        context.schedule(10_000, PunctuationType.STREAM_TIME, self.fired.append)

    def process(self, record: Record) -> None:
        pass


def passing_topology_in() -> Any:
    from streamloop.topology.builder import StreamsBuilder

    builder = StreamsBuilder()
    builder.stream("in").to("out")
    return builder.build()


def punctuated_topology(processor: Punctuated) -> Any:
    from streamloop.topology.builder import StreamsBuilder

    builder = StreamsBuilder()
    builder.stream("in").process(lambda: processor, name="punctuated")
    return builder.build()


@pytest.mark.asyncio
async def test_a_task_started_from_a_commit_restores_partition_and_stream_time() -> None:
    """StreamTaskTest.shouldReadCommittedStreamTimeOnInitialize: the committed partition time is
    the task's stream time before its first record. A record older than it does not move stream
    time back, so no stream-time punctuation fires for a time already passed."""
    processor = Punctuated()
    rig = TaskRig(punctuated_topology(processor))
    asked: list[TopicPartition] = []

    async def committed(tp: TopicPartition) -> OffsetAndMetadata | None:
        asked.append(tp)
        return OffsetAndMetadata(2, "sl2:61000")

    rig.rebuild(committed=committed)
    rig.add(IN, plain(2, b"late", 2_000))
    async with rig.running():
        await rig.processed(1)
        assert rig.task.stream_time == 61_000
        assert processor.fired == []  # without the restore: fired at 2000, stream time went back
        rig.add(IN, plain(3, b"on", 72_000))
        await rig.processed(2)
    assert asked == [IN]
    assert processor.fired == [72_000]
    # The next commit carries the time the task moved on to, not the restored one.
    assert decode_metadata(4, rig.task.committable_offsets()[IN].metadata).partition_time == 72_000


@pytest.mark.asyncio
async def test_a_commit_without_a_time_leaves_the_task_at_unknown_time() -> None:
    rig = TaskRig(passing_topology_in())

    async def committed(tp: TopicPartition) -> OffsetAndMetadata | None:
        return OffsetAndMetadata(2, "sl1:3")  # an in-flight commit of the old format

    rig.rebuild(committed=committed)
    rig.add(IN, plain(2, b"x", 2_000))
    async with rig.running():
        await rig.processed(1)
    assert rig.task.stream_time == 2_000


class ValueTime:
    """The value (bytes of a decimal number) is the event time."""

    def extract(self, record: Any, partition_time: int) -> int:
        return int(record.value)


@pytest.mark.asyncio
async def test_with_an_extractor_each_partition_restores_and_commits_its_own_time() -> None:
    from streamloop.topology.builder import StreamsBuilder

    from .test_task import A, B

    builder = StreamsBuilder()
    builder.stream(["a", "b"], timestamp_extractor=ValueTime()).to("out")
    rig = TaskRig(builder.build(), partitions=[A, B])
    commits = {A: OffsetAndMetadata(1, "sl2:5000"), B: OffsetAndMetadata(1, "sl2:70000")}

    async def committed(tp: TopicPartition) -> OffsetAndMetadata | None:
        return commits[tp]

    rig.rebuild(committed=committed)
    rig.add(A, plain(1, b"6000", 6_000))
    async with rig.running():
        await rig.processed(1)
    assert rig.task.partition_times == {("a", 2): 6_000, ("b", 2): 70_000}
    assert rig.task.stream_time == 70_000
    assert rig.task.committable_offsets() == {A: OffsetAndMetadata(2, "sl2:6000")}
