"""Hypothesis strategies for properties over a topology: input records and fault schedules.

Compose them into your own properties and play what they draw with
``TopologyTestDriver.play``::

    @given(scenarios(records("orders", keys=st.text(max_size=2), values=st.integers()),
                     faults(tasks=[TaskId(0, 0)])))
    def test_matches_model(scenario): ...

Every draw is a list of ``streamloop.testing.scenario`` steps (frozen dataclasses), so a
failing example shrinks to, and prints as, the smallest schedule that fails. Needs
``hypothesis`` (in the ``test`` extra).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

from streamloop.ids import TaskId
from streamloop.testing.scenario import (
    BadRecord,
    Crash,
    Fault,
    Input,
    ProcessorTimeout,
    Rebalance,
    Step,
    by_key,
    inputs,
)

__all__ = ["by_key", "faults", "headers", "inputs", "partitioned", "records", "scenarios", "task_ids"]

_HEADER_NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-.", min_size=1, max_size=8)


def headers(max_size: int = 2) -> st.SearchStrategy[tuple[tuple[str, bytes], ...]]:
    """Record headers: short lowercase names with arbitrary byte values."""
    return st.lists(st.tuples(_HEADER_NAMES, st.binary(max_size=8)), max_size=max_size).map(tuple)


def records(
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
) -> st.SearchStrategy[list[Input]]:
    """Input records for ``topic``: keys and values from your strategies.

    Timestamps start at ``start_ms`` and grow by up to ``max_step_ms``; with
    ``out_of_order_ms`` each may be that much older than the one before it (late
    records). ``with_headers`` adds headers. With ``partitions`` each record names a
    partition drawn in ``0..partitions-1``; otherwise the key picks it, as Kafka's
    default partitioner does.
    """
    # One list of tuples holding only the fields asked for: much cheaper to generate and shrink
    # than a draw per field.
    fields: list[st.SearchStrategy[Any]] = [keys, values, st.integers(0, max_step_ms)]
    if out_of_order_ms:
        fields.append(st.integers(0, out_of_order_ms))
    if with_headers:
        fields.append(headers())
    if partitions:
        fields.append(st.integers(0, partitions - 1))

    def to_inputs(rows: list[tuple[Any, ...]]) -> list[Input]:
        result, now = [], start_ms
        for row in rows:
            key, value, step, *rest = row
            now += step
            late = rest.pop(0) if out_of_order_ms else 0
            drawn_headers = rest.pop(0) if with_headers else ()
            partition = rest.pop(0) if partitions else None
            result.append(Input(topic, key, value, max(0, now - late), drawn_headers, partition))
        return result

    return st.lists(st.tuples(*fields), min_size=min_size, max_size=max_size).map(to_inputs)


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
    # tuples(...).map(...) rather than builds(...): the same draws, generated much faster.
    if timeouts and tasks:
        kinds.append(st.tuples(st.sampled_from(list(tasks)), st.integers(1, max_timeouts))
                     .map(lambda drawn: ProcessorTimeout(*drawn)))
    if crashes:
        kinds.append(st.just(Crash()))
    if rebalances and tasks:
        kinds.append(st.sampled_from([Rebalance(task) for task in tasks]))
    if bad_record_topics:
        kinds.append(st.tuples(st.sampled_from(list(bad_record_topics)),
                               st.sampled_from([b"\xff", b"\x00\xff\xfe", b"{not json"]), st.integers(0, 63))
                     .map(lambda drawn: BadRecord(drawn[0], drawn[1], partition=drawn[2])))
    if not kinds:
        raise ValueError("faults() has no kind of fault left to draw")
    return st.one_of(kinds)


def scenarios(
    *inputs_: st.SearchStrategy[list[Input]],
    faults: st.SearchStrategy[Fault] | None = None,
    max_faults: int = 5,
) -> st.SearchStrategy[list[Step]]:
    """The records of every input strategy interleaved (each keeps its own order), with faults at
    drawn places."""
    if not inputs_:
        raise ValueError("scenarios() needs at least one input strategy (records(...))")
    merged: st.SearchStrategy[list[Step]] = (
        inputs_[0] if len(inputs_) == 1 else st.tuples(*inputs_).flatmap(_interleavings))  # type: ignore[assignment]  # list is invariant: Inputs are Steps
    if faults is None:
        return merged
    # Each fault comes with a place, a fraction of the way through the input (shrinks towards 0).
    placed = st.lists(st.tuples(st.integers(0, 1_000), faults), max_size=max_faults)
    return st.tuples(merged, placed).map(_with_faults)


def _with_faults(drawn: tuple[list[Step], list[tuple[int, Fault]]]) -> list[Step]:
    steps, placed = list(drawn[0]), drawn[1]
    size = len(steps)
    # Insert at places counted in the input as drawn: the latest first, so earlier places hold.
    for place, fault in sorted(placed, key=lambda item: -item[0]):
        steps.insert(place * size // 1_000, fault)
    return steps


def _interleavings(lists: tuple[list[Input], ...]) -> st.SearchStrategy[list[Step]]:
    """Every way to merge ``lists`` keeping each one's order: a drawn choice of list per step."""
    total = sum(len(records_) for records_ in lists)
    choices = st.lists(st.integers(0, len(lists) - 1), min_size=total, max_size=total)

    def merge(picks: list[int]) -> list[Step]:
        queues = [list(records_) for records_ in lists]
        merged: list[Step] = []
        for pick in picks:
            # A pick of a list already used up takes the next one that still has records.
            while not queues[pick]:
                pick = (pick + 1) % len(queues)
            merged.append(queues[pick].pop(0))
        return merged

    return choices.map(merge)
