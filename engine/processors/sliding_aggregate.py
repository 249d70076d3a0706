"""The processor behind ``windowed_by(SlidingWindows...)`` aggregations.

The windows of a key are those its records define (see ``streamloop.state.sliding_windows``):
for a record at ``t``, its left window ``[t - diff, t]`` and, when later records
fall within ``diff`` of it, its right window ``[t + 1, t + 1 + diff]``. A record
updates every existing window that contains it and creates the windows it
defines, seeding each new window's aggregate from an existing one that holds the
same records, so that no record is aggregated twice (Kafka Streams'
``KStreamSlidingWindowAggregate``, which walks the key's windows in the same
order). Records at ``t < diff`` share the window ``[0, diff]``, as there.

Windows ending before the close time (stream time - grace) are not updated; a
record whose right window would end at or before the close time is dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streamloop.processors.stateful import _WindowedAggregate
from streamloop.records import Record
from streamloop.state.sliding_windows import SlidingWindows, TimestampedWindowStore

# (aggregate, largest record timestamp in the window)
Stamped = tuple[Any, int]


class SlidingWindowAggregateProcessor(_WindowedAggregate):
    def __init__(self, store_name: str, windows: SlidingWindows, initializer: Callable[[], Any],
                 aggregator: Callable[[Any, Any, Any], Any]) -> None:
        super().__init__(store_name, initializer, aggregator)
        self.windows = windows

    def process(self, record: Record) -> None:
        if not self._admit(record):
            return
        timestamp = record.timestamp
        close_time = self.observed_time - self.windows.grace_ms
        diff = self.windows.time_difference_ms
        if timestamp + 1 + diff <= close_time:
            self._drop(record, f"late: its windows closed (stream time {self.observed_time}, "
                               f"grace {self.windows.grace_ms} ms)")
            return
        if timestamp < diff:
            self._process_early(record, close_time)
        else:
            self._process(record, close_time)

    def _process(self, record: Record, close_time: int) -> None:
        store: TimestampedWindowStore = self.store
        key, ts, diff = record.key, record.timestamp, self.windows.time_difference_ms
        starts: set[int] = set()
        left_agg: Stamped | None = None
        right_agg: Stamped | None = None
        left_exists = right_exists = False
        previous: int | None = None  # the latest record timestamp before this record's, if near
        # The right window of the record, if any, starts at ts + 1: fetch up to there in one go.
        for start, agg, max_ts in store.fetch_with_timestamp(key, max(0, ts - 2 * diff), ts + 1):
            starts.add(start)
            end = start + diff
            if end < ts:
                left_agg, previous = (agg, max_ts), max_ts
            elif end == ts:
                left_exists = True
                if max_ts < ts:
                    previous = max_ts
                self._update(record, start, (agg, max_ts), close_time)
            elif start <= ts:
                right_agg = (agg, max_ts)
                self._update(record, start, (agg, max_ts), close_time)
            elif start == ts + 1:
                right_exists = True
            else:
                raise RuntimeError(f"Store '{self.store_name}': unexpected sliding window at {start} "
                                   f"for a record at {ts}")
        if previous is not None and previous + 1 not in starts and previous + 1 + diff >= ts:
            # The previous record's right window did not exist: this record is its first.
            self._update(record, previous + 1, (self.initializer(), ts), close_time)
        if not left_exists:
            # The left window holds the previous record's window's records if it is within reach.
            seed = left_agg[0] if left_agg is not None and previous is not None and ts - diff <= previous \
                else self.initializer()
            self._update(record, ts - diff, (seed, ts), close_time)
        if not right_exists and right_agg is not None and right_agg[1] > ts:
            self._create_right(record, right_agg)

    def _process_early(self, record: Record, close_time: int) -> None:
        store: TimestampedWindowStore = self.store
        key, ts = record.key, record.timestamp
        starts: set[int] = set()
        combined: Stamped | None = None
        right_agg: Stamped | None = None
        right_exists = False
        previous: int | None = None
        for start, agg, max_ts in store.fetch_with_timestamp(key, 0, ts + 1):
            starts.add(start)
            if start == 0:
                combined = (agg, max_ts)
                if max_ts < ts:
                    previous = max_ts
            elif start <= ts:
                right_agg = (agg, max_ts)
                self._update(record, start, (agg, max_ts), close_time)
            elif start == ts + 1:
                right_exists = True
            else:
                raise RuntimeError(f"Store '{self.store_name}': unexpected sliding window at {start} "
                                   f"for a record at {ts}")
        # With no window between, the records in [0, diff] after this one are its right window's.
        if right_agg is None and combined is not None and combined[1] > ts:
            right_agg = combined
        if not right_exists and right_agg is not None and right_agg[1] > ts:
            self._create_right(record, right_agg)
        if previous is not None and previous + 1 not in starts:
            self._update(record, previous + 1, (self.initializer(), ts), close_time)
        self._update(record, 0, combined if combined is not None else (self.initializer(), ts), close_time)

    def _create_right(self, record: Record, stamped: Stamped) -> None:
        """The record's right window holds exactly the records of ``stamped`` after it: copy it."""
        store: TimestampedWindowStore = self.store
        store.put_with_timestamp(record.key, stamped[0], record.timestamp + 1, stamped[1])

    def _update(self, record: Record, start: int, stamped: Stamped, close_time: int) -> None:
        if start + self.windows.time_difference_ms < close_time:
            self._drop(record, f"late for window [{start}, {start + self.windows.time_difference_ms}] "
                               f"(stream time {self.observed_time}, grace {self.windows.grace_ms} ms)")
            return
        old, max_ts = stamped
        new = self.aggregator(record.key, record.value, old)
        stamp = record.timestamp if old is None else max(record.timestamp, max_ts)
        store: TimestampedWindowStore = self.store
        store.put_with_timestamp(record.key, new, start, stamp)
