"""Hypothesis strategies for properties over a topology: input records and fault schedules.

Compose them into your own properties and play what they draw with
``TopologyTestDriver.play``::

    @given(scenarios(records("orders", keys=st.text(max_size=2), values=st.integers()),
                     faults(tasks=[TaskId(0, 0)])))
    def test_matches_model(scenario): ...

Every draw is a list of ``engine.testing.scenario`` steps (frozen dataclasses), so a
failing example shrinks to, and prints as, the smallest schedule that fails. Needs
``hypothesis`` (in the ``test`` extra).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

from engine.tasks.task_id import TaskId
from engine.testing.scenario import BadRecord, Crash, Fault, Input, ProcessorTimeout, Rebalance, Step

__all__ = ["faults", "inputs", "partitioned", "records", "scenarios", "task_ids"]

_HEADER_NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-.", min_size=1, max_size=8)


def headers(max_size: int = 2) -> st.SearchStrategy[tuple[tuple[str, bytes], ...]]:
    """Record headers: short lowercase names with arbitrary byte values."""
    return st.lists(st.tuples(_HEADER_NAMES, st.binary(max_size=8)), max_size=max_size).map(tuple)


@st.composite
def _timestamps(draw: st.DrawFn, size: int, start: int, max_step_ms: int, out_of_order_ms: int) -> list[int]:
    """Non-decreasing timestamps, each then moved back by at most ``out_of_order_ms``."""
    stamps, now = [], start
    for _ in range(size):
        now += draw(st.integers(0, max_step_ms))
        late = draw(st.integers(0, out_of_order_ms)) if out_of_order_ms else 0
        stamps.append(max(0, now - late))
    return stamps


@st.composite
def records(
    draw: st.DrawFn,
    topic: str,
    keys: st.SearchStrategy[Any],
    values: st.SearchStrategy[Any],
    *,
    min_size: int = 0,
    max_size: int = 50,
    start_ms: int = 0,
    max_step_ms: int = 1_000,
    out_of_order_ms: int = 0,
    with_headers: bool = False,
    partitions: int | None = None,
) -> list[Input]:
    """Input records for ``topic``: keys and values from your strategies.

    Timestamps start at ``start_ms`` and grow by up to ``max_step_ms``; with
    ``out_of_order_ms`` each may be that much older than the one before it (late
    records). ``with_headers`` adds headers. With ``partitions`` each record names a
    partition drawn in ``0..partitions-1``; otherwise the key picks it, as Kafka's
    default partitioner does.
    """
    pairs = draw(st.lists(st.tuples(keys, values), min_size=min_size, max_size=max_size))
    stamps = draw(_timestamps(len(pairs), start_ms, max_step_ms, out_of_order_ms))
    result = []
    for (key, value), stamp in zip(pairs, stamps, strict=True):
        drawn_headers = draw(headers()) if with_headers else ()
        partition = draw(st.integers(0, partitions - 1)) if partitions else None
        result.append(Input(topic, key, value, stamp, drawn_headers, partition))
    return result


def partitioned(topic: str, partitions: int, keys: st.SearchStrategy[Any], values: st.SearchStrategy[Any],
                **options: Any) -> st.SearchStrategy[list[Input]]:
    """``records`` spread over ``partitions`` partitions (each record names its partition)."""
    if partitions < 1:
        raise ValueError(f"partitioned() needs at least 1 partition, got {partitions}")
    return records(topic, keys, values, partitions=partitions, **options)


def task_ids(subtopologies: int = 1, partitions: int = 1) -> list[TaskId]:
    """Every task of a topology with ``subtopologies`` sub-topologies over ``partitions`` partitions."""
    return [TaskId(s, p) for s in range(subtopologies) for p in range(partitions)]


def faults(
    tasks: Sequence[TaskId] = (TaskId(0, 0),),
    bad_record_topics: Sequence[str] = (),
    *,
    timeouts: bool = True,
    crashes: bool = True,
    rebalances: bool = True,
    max_timeouts: int = 3,
) -> st.SearchStrategy[Fault]:
    """One fault: a processor timeout, a crash and restart from the last commit, a rebalance that
    moves a task, or (for ``bad_record_topics``) a record no serde can read.

    A timeout repeats at most ``max_timeouts`` times, well inside ``task.timeout.ms``
    unless your config makes that small; set a kind to False to leave it out.
    """
    kinds: list[st.SearchStrategy[Fault]] = []
    if timeouts and tasks:
        kinds.append(st.builds(ProcessorTimeout, st.sampled_from(list(tasks)), st.integers(1, max_timeouts)))
    if crashes:
        kinds.append(st.just(Crash()))
    if rebalances and tasks:
        kinds.append(st.builds(Rebalance, st.sampled_from(list(tasks))))
    if bad_record_topics:
        kinds.append(st.builds(BadRecord, st.sampled_from(list(bad_record_topics)),
                               st.sampled_from([b"\xff", b"\x00\xff\xfe", b"{not json"]),
                               partition=st.integers(0, 63)))
    if not kinds:
        raise ValueError("faults() has no kind of fault left to draw")
    return st.one_of(kinds)


@st.composite
def scenarios(
    draw: st.DrawFn,
    *inputs_: st.SearchStrategy[list[Input]],
    faults: st.SearchStrategy[Fault] | None = None,
    max_faults: int = 5,
) -> list[Step]:
    """The records of every input strategy interleaved (each keeps its own order), with faults at
    drawn places."""
    lists = [draw(strategy) for strategy in inputs_]
    steps: list[Step] = []
    while any(lists):
        pick = draw(st.sampled_from([i for i, records_ in enumerate(lists) if records_]))
        steps.append(lists[pick].pop(0))
    if faults is not None:
        for fault in draw(st.lists(faults, max_size=max_faults)):
            steps.insert(draw(st.integers(0, len(steps))), fault)
    return steps


def inputs(scenario: Sequence[Step], topic: str | None = None) -> list[Input]:
    """The input records of a scenario (of one ``topic``), in the order they are piped: what a model
    of your topology reads."""
    return [s for s in scenario if isinstance(s, Input) and (topic is None or s.topic == topic)]
