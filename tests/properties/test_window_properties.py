"""For drawn records with out-of-order timestamps, session counts, sliding-window counts and
suppressed final results equal small pure-Python models of Kafka Streams' semantics.

The models say what the windows *are* (sessions: the records' timestamps linked by gaps of at most
the inactivity gap; sliding windows: each record's left window and, when a later record is near,
its right window) rather than how the processors find them; lateness is the only part simulated
record by record, since what is late depends on the order.
"""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from streamloop import (
    BufferConfig,
    EmitStrategy,
    SessionWindows,
    SlidingWindows,
    StreamsBuilder,
    Suppressed,
    TimeWindows,
)
from streamloop.serdes import LongSerde, StringSerde
from streamloop.testing import TopologyTestDriver

STR, LONG = StringSerde(), LongSerde()
NO_CACHE = {"cache.max.bytes.buffering": 0}
KEYS = st.sampled_from(["a", "b", "c"])


def clusters(timestamps: list[int], gap: int) -> list[list[int]]:
    """Timestamps split where two neighbours are more than ``gap`` apart: the sessions they make."""
    result: list[list[int]] = []
    for t in sorted(timestamps):
        if result and t - result[-1][-1] <= gap:
            result[-1].append(t)
        else:
            result.append([t])
    return result


def session_model(records: list[tuple[str, int]], gap: int, grace: int) -> dict[tuple[str, int, int], int]:
    """``(key, start, end) -> count``. A record is late when the session it would join ends before
    stream time - gap - grace (``KStreamSessionWindowAggregateProcessorTest``)."""
    accepted: dict[str, list[int]] = defaultdict(list)
    stream_time = -1
    for key, t in records:
        stream_time = max(stream_time, t)
        joined = next(c for c in clusters([*accepted[key], t], gap) if t in c)
        if max(joined) >= stream_time - gap - grace:
            accepted[key].append(t)
    return {(key, c[0], c[-1]): len(c) for key, ts in accepted.items() for c in clusters(ts, gap)}


def sliding_model(records: list[tuple[str, int]], diff: int) -> dict[tuple[str, int], tuple[int, int]]:
    """``(key, start) -> (count, largest timestamp)`` with no record late (``KStreamSlidingWindowAggregateTest``):
    each record's left window (``[0, diff]`` for the early ones), and its right window when a later
    record falls within ``diff`` of it; each holds the records within its inclusive bounds."""
    by_key: dict[str, list[int]] = defaultdict(list)
    for key, t in records:
        by_key[key].append(t)
    result = {}
    for key, ts in by_key.items():
        starts = {max(t - diff, 0) for t in ts} | {t + 1 for t in ts if any(t < u <= t + diff for u in ts)}
        for start in starts:
            inside = [u for u in ts if start <= u <= start + diff]
            result[(key, start)] = (len(inside), max(inside))
    return result


def suppressed_model(records: list[tuple[str, int]], size: int, grace: int) -> list[tuple[str, int, int]]:
    """``(key, window start, count)`` in the order a final-results suppression emits them: a window
    once, when stream time reaches its end + grace, oldest end first (``SuppressScenarioTest``)."""
    counts: dict[tuple[int, str], int] = defaultdict(int)
    emitted: list[tuple[str, int, int]] = []
    done: set[tuple[int, str]] = set()
    stream_time = -1
    for key, t in records:
        stream_time = max(stream_time, t)
        start = t - t % size
        if start + size <= stream_time - grace:
            continue  # late: its window closed
        counts[(start, key)] += 1
        for start_, key_ in sorted(w for w in counts if w not in done and w[0] + size <= stream_time - grace):
            done.add((start_, key_))
            emitted.append((key_, start_, counts[(start_, key_)]))
    return emitted


def records_within(span: int) -> st.SearchStrategy[list[tuple[str, int]]]:
    return st.lists(st.tuples(KEYS, st.integers(0, span)), min_size=1, max_size=25)


@st.composite
def session_case(draw: st.DrawFn) -> tuple[int, int, list[tuple[str, int]]]:
    gap, grace = draw(st.integers(1, 15)), draw(st.integers(0, 15))
    # Within the store's retention (2 gaps + grace): no session expires while records may merge.
    return gap, grace, draw(records_within(2 * gap + grace))


@settings(max_examples=40)
@given(session_case())
def test_session_counts_equal_the_model(case: tuple[int, int, list[tuple[str, int]]]) -> None:
    gap, grace, records = case
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=STR).group_by_key()
            .windowed_by(SessionWindows.of_inactivity_gap_and_grace(gap, grace)).count(materialized="s")
            .to_stream().map(lambda w, n: (f"{w.key}/{w.start}/{w.end}", n)).to("out", key_serde=STR, value_serde=LONG))
    with TopologyTestDriver(builder.build(), NO_CACHE) as driver:
        source = driver.create_input_topic("in", STR, STR)
        for key, t in records:
            source.pipe_input(key, "v", t)
        expected = session_model(records, gap, grace)
        assert {(w.key, w.start, w.end): n for w, n in driver.get_session_store("s").all()} == expected
        # The table's updates, tombstones applied, leave the same sessions.
        table: dict[tuple[str, int, int], int] = {}
        for key, n in driver.create_output_topic("out", STR, LONG).read_key_values():
            k, start, end = key.split("/")
            if n is None:
                del table[(k, int(start), int(end))]
            else:
                table[(k, int(start), int(end))] = n
        assert table == expected


@settings(max_examples=40)
@given(st.integers(1, 20), records_within(60))
def test_sliding_counts_equal_the_model(diff: int, records: list[tuple[str, int]]) -> None:
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=STR).group_by_key()
            .windowed_by(SlidingWindows.of_time_difference_and_grace(diff, 1000)).count(materialized="w")
            .to_stream().map(lambda w, n: (f"{w.key}/{w.start}", n)).to("out", key_serde=STR, value_serde=LONG))
    with TopologyTestDriver(builder.build(), NO_CACHE) as driver:
        source = driver.create_input_topic("in", STR, STR)
        for key, t in records:
            source.pipe_input(key, "v", t)
        expected = sliding_model(records, diff)
        assert {(w.key, w.start): n for w, n in driver.get_window_store("w").all()} == {
            k: n for k, (n, _) in expected.items()}
        last: dict[tuple[str, int], tuple[int, int]] = {}
        for record in driver.create_output_topic("out", STR, LONG).read_records():
            key, start = record.key.split("/")
            last[(key, int(start))] = (record.value, record.timestamp)
        assert last == expected


@settings(max_examples=40)
@given(st.integers(1, 10), st.integers(0, 5), records_within(40), st.integers(0, 24), KEYS)
def test_suppressed_final_counts_equal_the_model(size: int, grace: int, records: list[tuple[str, int]],
                                                 closing: int, key: str) -> None:
    # The last record brings stream time exactly to a window's end + grace: the boundary case.
    t = records[closing % len(records)][1]
    records = [*records, (key, t - t % size + size + grace)]
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=STR).group_by_key()
            .windowed_by(TimeWindows.of_size_and_grace(size, grace)).count(materialized="c")
            .suppress(Suppressed.until_window_closes(BufferConfig.unbounded()))
            .to_stream().map(lambda w, n: (f"{w.key}/{w.start}", n)).to("out", key_serde=STR, value_serde=LONG))
    with TopologyTestDriver(builder.build(), NO_CACHE) as driver:
        source = driver.create_input_topic("in", STR, STR)
        for key, t in records:
            source.pipe_input(key, "v", t)
        got = [(k.split("/")[0], int(k.split("/")[1]), n)
               for k, n in driver.create_output_topic("out", STR, LONG).read_key_values()]
        assert got == suppressed_model(records, size, grace)


# -- windows that close on window close, by stream time or on a quiet wall clock -------------------
# ("record", key, ms from the wall clock), ("wall", "", ms to move it on) or ("restart", "", 0): records
# come with timestamps near the wall clock, a little late or early, as in a live application.
Event = tuple[str, str, int]


def final_model(events: list[Event], size: int, advance: int, grace: int,
                idle: int) -> list[tuple[str, int, int, int]]:
    """``(key, window start, count, largest timestamp)`` in the order ``EmitStrategy.on_window_close()``
    with a wall-clock close (checked every ms) emits them: a window once, when the close time reaches
    its end + grace, oldest end first, then by key (``KStreamWindowAggregateTest.shouldEmitWithInterval0``).
    The close time is the largest record timestamp, or the wall clock at a check once no record came
    for ``idle`` ms; records for closed windows are late. A restart (a new task over the restored
    stores) starts the quiet again and keeps the close time of the last emission."""
    windows: dict[tuple[int, str], tuple[int, int]] = {}
    emitted: list[tuple[str, int, int, int]] = []
    done: set[tuple[int, str]] = set()
    close = largest = saved = -1
    wall = quiet_since = 0

    def emit() -> None:
        nonlocal saved
        closing = sorted(w for w in windows if w not in done and w[0] + size + grace <= close)
        for start, key in closing:
            done.add((start, key))
            emitted.append((key, start, *windows[(start, key)]))
        if closing:
            saved = close

    for kind, key, offset in events:
        if kind == "record":
            value = max(0, wall + offset)
            quiet_since, largest, close = wall, max(largest, value), max(close, value)
            first = max(0, value - size + 1)
            for start in range(-(-first // advance) * advance, value - value % advance + 1, advance):
                if start + size + grace > close:
                    count, stamp = windows.get((start, key), (0, value))
                    windows[(start, key)] = (count + 1, max(stamp, value))
            emit()
        elif kind == "wall":
            wall += offset
            if wall - quiet_since >= idle:
                close = max(close, wall)
                emit()
        else:
            quiet_since, close = wall, max(largest, saved)
    return emitted


@st.composite
def final_case(draw: st.DrawFn) -> tuple[int, int, int, int, list[Event]]:
    size = draw(st.integers(1, 12))
    advance, grace, idle = draw(st.integers(1, size)), draw(st.integers(0, 6)), draw(st.integers(1, 20))
    events = draw(st.lists(st.one_of(
        st.tuples(st.just("record"), KEYS, st.integers(-30, 10)),
        st.tuples(st.just("wall"), st.just(""), st.integers(1, 25)),
        st.tuples(st.just("restart"), st.just(""), st.just(0))), min_size=1, max_size=30))
    return size, advance, grace, idle, events


@settings(max_examples=80, deadline=None)
@given(final_case())
def test_final_window_results_equal_the_model(case: tuple[int, int, int, int, list[Event]]) -> None:
    size, advance, grace, idle, events = case
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=STR).group_by_key()
            .windowed_by(TimeWindows.of_size_and_grace(size, grace).advance_by(advance))
            .emit_strategy(EmitStrategy.on_window_close().with_wall_clock_close(idle, check_interval_ms=1))
            .count(materialized="c")
            .to_stream().map(lambda w, n: (f"{w.key}/{w.start}", n)).to("out", key_serde=STR, value_serde=LONG))
    with TopologyTestDriver(builder.build()) as driver:
        source = driver.create_input_topic("in", STR, STR)
        output = driver.create_output_topic("out", STR, LONG)
        for kind, key, value in events:
            if kind == "record":
                source.pipe_input(key, "v", max(0, driver.wall_clock_ms + value))
            elif kind == "wall":
                driver.advance_wall_clock_time(value)
            else:
                driver.rebalance(driver.task_ids[0])
        got = [(r.key.split("/")[0], int(r.key.split("/")[1]), r.value, r.timestamp) for r in output.read_records()]
        assert got == final_model(events, size, advance, grace, idle)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 20), records_within(60), st.booleans())
def test_sliding_windows_emitted_on_close_equal_the_model(diff: int, records: list[tuple[str, int]],
                                                          restart: bool) -> None:
    """Each sliding window once, with its final count and largest timestamp, when a record far ahead
    closes them all: in the order of their ends, then by key (``KStreamSlidingWindowAggregateTest``)."""
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=STR).group_by_key()
            .windowed_by(SlidingWindows.of_time_difference_and_grace(diff, 1000))
            .emit_strategy(EmitStrategy.on_window_close()).count(materialized="w")
            .to_stream().map(lambda w, n: (f"{w.key}/{w.start}", n)).to("out", key_serde=STR, value_serde=LONG))
    with TopologyTestDriver(builder.build()) as driver:
        source = driver.create_input_topic("in", STR, STR)
        for key, t in records:
            source.pipe_input(key, "v", t)
        if restart:
            driver.rebalance(driver.task_ids[0])
        source.pipe_input("z", "v", 60 + 2 * diff + 1002)
        got = [(r.key.split("/")[0], int(r.key.split("/")[1]), r.value, r.timestamp)
               for r in driver.create_output_topic("out", STR, LONG).read_records()]
        expected = sliding_model(records, diff)
        assert got == [(key, start, *expected[(key, start)]) for key, start in
                       sorted(expected, key=lambda w: (w[1], w[0]))]


def suppressed_wall_model(events: list[Event], size: int, grace: int, idle: int) -> list[tuple[str, int, int, int]]:
    """``(key, window start, count, timestamp)`` as tumbling counts suppressed until their windows close,
    with a wall-clock close checked every ms, emit them. The count takes records by its own stream
    time; the suppression's close time is the largest timestamp it was sent, or the wall clock at a
    check once it was quiet for ``idle`` ms, and it drops an update of a window it closed. A record
    the count drops does not reach it, so the quiet starts at the next check. A restart starts the
    quiet again; the close time comes back as the task's stream time or the close of the last
    wall-clock emission, whichever is later."""
    counts: dict[tuple[int, str], int] = defaultdict(int)
    held: dict[tuple[int, str], tuple[int, int]] = {}
    emitted: list[tuple[str, int, int, int]] = []
    stream_time = close = saved = -1
    wall = quiet_since = task_records = own = last_task = seen = 0

    def enforce() -> int:
        closing = sorted((w for w in held if w[0] + size <= close - grace), key=lambda w: (w[0] + size, w[1]))
        for start, key in closing:
            emitted.append((key, start, *held.pop((start, key))))
        return len(closing)

    for kind, key, offset in events:
        if kind == "record":
            t = max(0, wall + offset)
            task_records += 1
            stream_time = max(stream_time, t)
            start = t - t % size
            if start + size <= stream_time - grace:
                continue  # late for the count
            counts[(start, key)] += 1
            quiet_since, own = wall, own + 1
            if (start, key) not in held and start + size <= close - grace:
                continue  # the suppression closed the window already
            held[(start, key)] = (counts[(start, key)], t)
            close = max(close, t)
            enforce()
        elif kind == "wall":
            wall += offset
            if task_records - last_task > own - seen:
                quiet_since = max(quiet_since, wall)
            last_task, seen = task_records, own
            if wall - quiet_since >= idle and wall > close:
                close = wall
                if enforce():
                    saved = close
        else:
            quiet_since, task_records, own, last_task, seen = wall, 0, 0, 0, 0
            close = max(stream_time, saved)
    return emitted


@settings(max_examples=150, deadline=None)
@given(final_case())
def test_suppressed_final_counts_with_a_wall_clock_close_equal_the_model(
        case: tuple[int, int, int, int, list[Event]]) -> None:
    size, _advance, grace, idle, events = case
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=STR).group_by_key()
            .windowed_by(TimeWindows.of_size_and_grace(size, grace)).count(materialized="c")
            .suppress(Suppressed.until_window_closes(BufferConfig.unbounded())
                      .with_wall_clock_close(idle, check_interval_ms=1))
            .to_stream().map(lambda w, n: (f"{w.key}/{w.start}", n)).to("out", key_serde=STR, value_serde=LONG))
    with TopologyTestDriver(builder.build(), NO_CACHE) as driver:
        source = driver.create_input_topic("in", STR, STR)
        output = driver.create_output_topic("out", STR, LONG)
        for kind, key, value in events:
            if kind == "record":
                source.pipe_input(key, "v", max(0, driver.wall_clock_ms + value))
            elif kind == "wall":
                driver.advance_wall_clock_time(value)
            else:
                driver.rebalance(driver.task_ids[0])
        got = [(r.key.split("/")[0], int(r.key.split("/")[1]), r.value, r.timestamp) for r in output.read_records()]
        assert got == suppressed_wall_model(events, size, grace, idle)


def session_final_model(records: list[tuple[str, int]], gap: int, grace: int) -> list[tuple[str, str, str, int, int]]:
    """``(key, start, end, count, end)`` as ``on_window_close()`` emits sessions: after each record, every
    session ending before stream time - gap - grace that did not go out yet, by end and then by key.
    As in Kafka Streams, a record the grace still admits may merge with a session that went out
    already: the longer session it makes goes out when it closes in turn."""
    accepted: dict[str, list[int]] = defaultdict(list)
    emitted: list[tuple[str, str, str, int, int]] = []
    done: set[tuple[str, int, int]] = set()
    stream_time = -1
    for key, t in records:
        stream_time = max(stream_time, t)
        joined = next(c for c in clusters([*accepted[key], t], gap) if t in c)
        if max(joined) >= stream_time - gap - grace:
            accepted[key].append(t)
        sessions = sorted(((c[-1], k, c[0], len(c)) for k, ts in accepted.items() for c in clusters(ts, gap)))
        for end, k, start, n in sessions:
            if end < stream_time - gap - grace and (k, start, end) not in done:
                done.add((k, start, end))
                emitted.append((k, str(start), str(end), n, end))
    return emitted


@settings(max_examples=40, deadline=None)
@given(session_case(), st.booleans())
def test_sessions_emitted_on_close_equal_the_model(case: tuple[int, int, list[tuple[str, int]]],
                                                   restart: bool) -> None:
    """Sessions go out as the model says (``KStreamSessionWindowAggregateProcessorTest``, ON_WINDOW_CLOSE),
    the last ones when a record far ahead closes them all; none merged away before it closed goes out."""
    gap, grace, records = case
    builder = StreamsBuilder()
    (builder.stream("in", key_serde=STR, value_serde=STR).group_by_key()
            .windowed_by(SessionWindows.of_inactivity_gap_and_grace(gap, grace))
            .emit_strategy(EmitStrategy.on_window_close()).count(materialized="s")
            .to_stream().map(lambda w, n: (f"{w.key}/{w.start}/{w.end}", n)).to("out", key_serde=STR, value_serde=LONG))
    records = [*records, ("z", 10 * (2 * gap + grace) + 100)]
    with TopologyTestDriver(builder.build()) as driver:
        source = driver.create_input_topic("in", STR, STR)
        for i, (key, t) in enumerate(records):
            if restart and i == len(records) // 2:
                driver.rebalance(driver.task_ids[0])
            source.pipe_input(key, "v", t)
        output = driver.create_output_topic("out", STR, LONG)
        got = [(*r.key.split("/"), r.value, r.timestamp) for r in output.read_records()]
        assert got == session_final_model(records, gap, grace)
