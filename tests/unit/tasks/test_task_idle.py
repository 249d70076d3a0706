"""max.task.idle.ms (KIP-353/KIP-695): when a task with several input partitions may go on while
one of them has nothing buffered (``PartitionGroup.ready``), and the setting's validation."""

from __future__ import annotations

import pytest

from streamloop.config import MAX_TASK_IDLE_MS, StreamsConfig
from streamloop.errors import ConfigError
from streamloop.records import FetchedRecord, TopicPartition
from streamloop.tasks.partition_group import IdleRule, PartitionGroup

LEFT, RIGHT = TopicPartition("left", 0), TopicPartition("right", 0)


def record(tp: TopicPartition, offset: int) -> FetchedRecord:
    return FetchedRecord(tp.topic, tp.partition, offset, offset, b"k", b"v")


def group(idle_ms: int, lags: dict[TopicPartition, int | None]) -> PartitionGroup:
    partitions = PartitionGroup([LEFT, RIGHT], idle=IdleRule(idle_ms, lambda tp: lags[tp]))
    partitions.add(LEFT, [record(LEFT, 0)])
    return partitions


def test_an_empty_partition_that_is_behind_holds_the_task_back_by_default() -> None:
    lags: dict[TopicPartition, int | None] = {LEFT: 0, RIGHT: None}
    partitions = group(0, lags)
    assert partitions.ready(0) > 0  # never fetched: behind until a fetch answers
    lags[RIGHT] = 5
    assert partitions.ready(10_000) > 0  # records still to fetch: waits however long it takes
    lags[RIGHT] = 0
    assert partitions.ready(10_000) == 0  # caught up: nothing will come, go on
    assert partitions.enforced == 0


def test_every_partition_buffered_is_ready_whatever_the_lag() -> None:
    partitions = group(0, {LEFT: 3, RIGHT: None})
    partitions.add(RIGHT, [record(RIGHT, 0)])
    assert partitions.ready(0) == 0


def test_minus_one_never_waits() -> None:
    partitions = group(-1, {LEFT: 0, RIGHT: 7})
    assert partitions.ready(0) == 0
    assert partitions.enforced == 0


def test_a_positive_idle_time_enforces_processing_once_it_is_over() -> None:
    partitions = group(1000, {LEFT: 0, RIGHT: None})
    assert 0 < partitions.ready(5_000) <= 1000  # the wait starts when it is first found not ready
    assert 0 < partitions.ready(5_999) <= 1
    assert partitions.enforced == 0
    assert partitions.ready(6_000) == 0
    assert partitions.enforced == 1
    # Records of the lagging partition arrive: the next wait starts afresh.
    partitions.add(RIGHT, [record(RIGHT, 0)])
    assert partitions.ready(6_500) == 0
    partitions.take(RIGHT)
    assert partitions.ready(7_000) > 0
    assert partitions.ready(7_999) > 0
    assert partitions.ready(8_000) == 0
    assert partitions.enforced == 2


def test_a_single_partition_never_waits() -> None:
    partitions = PartitionGroup([LEFT], idle=IdleRule(0, lambda tp: None))
    partitions.add(LEFT, [record(LEFT, 0)])
    assert partitions.ready(0) == 0


@pytest.mark.parametrize("value", [-2, "soon", 1.5, True])
def test_max_task_idle_ms_is_validated(value: object) -> None:
    with pytest.raises(ConfigError, match=MAX_TASK_IDLE_MS):
        StreamsConfig({"application.id": "a", "bootstrap.servers": "memory://x", MAX_TASK_IDLE_MS: value})


def test_max_task_idle_ms_defaults_to_zero() -> None:
    assert StreamsConfig({"application.id": "a", "bootstrap.servers": "memory://x"})[MAX_TASK_IDLE_MS] == 0
