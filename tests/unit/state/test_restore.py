"""restore_store against a reader that behaves like a Kafka-protocol broker whose ListOffsets
"latest" stops short of the log end (the first offset of the last batch + 1, as Tansu answers):
the fetch responses' end carries the restore to the real end; and against a changelog whose
first records were deleted by its retention."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

import pytest

from streamloop.records import ConsumerRecord, FetchedRecord, TopicPartition
from streamloop.serdes import LongSerde, StringSerde
from streamloop.state.bytes_stores import InMemoryBytesStore
from streamloop.state.changelog import encode_source
from streamloop.state.restore import ProcessedInput, restore_store
from streamloop.state.store import KeyValueStore

STR, LONG = StringSerde(), LongSerde()
CHANGELOG = TopicPartition("app-counts-changelog", 0)


class OneBatchReader:
    """Serves the whole log in one fetch of one batch, as a broker does for a batch written at once."""

    def __init__(self, log: list[FetchedRecord], fetched_end: int | None) -> None:
        self._log = log
        self._end = fetched_end
        self._position = 0
        self.polls = 0

    async def start(self) -> None:
        pass

    def assign(self, partitions: Sequence[TopicPartition]) -> None:
        assert list(partitions) == [CHANGELOG]

    def seek(self, partition: TopicPartition, offset: int) -> None:
        self._position = offset

    async def poll(self, timeout_ms: int, max_records: int | None = None) -> Mapping[TopicPartition,
                                                                                      Sequence[ConsumerRecord]]:
        self.polls += 1
        batch = [r for r in self._log if r.offset >= self._position]
        self._position = len(self._log)
        return {CHANGELOG: batch} if batch else {}

    async def position(self, partition: TopicPartition) -> int:
        return self._position

    def fetched_end(self, partition: TopicPartition) -> int | None:
        return self._end if self.polls else None

    async def close(self, leave_group: bool = True) -> None:
        pass


def changelog(updates: list[tuple[str, int, int]]) -> list[FetchedRecord]:
    """``(key, count, source offset)`` updates as changelog records."""
    return [FetchedRecord(CHANGELOG.topic, 0, offset, 0, STR.serialize(key), LONG.serialize(count),
                          encode_source(("in", source)))
            for offset, (key, count, source) in enumerate(updates)]


def restore(log: list[FetchedRecord], end: int, fetched_end: int | None, committed: int) -> dict[str, int]:
    store = KeyValueStore("counts", InMemoryBytesStore("counts"), STR, LONG, None, None, "0_0/counts",
                          lambda: 0, lambda: None)
    store.inner.open()
    reader = OneBatchReader(log, fetched_end)
    asyncio.run(restore_store(store, CHANGELOG, 0, end, lambda: reader,  # type: ignore[arg-type,return-value]
                              {"in": ProcessedInput(committed, frozenset())}, None, poll_ms=1))
    return dict(store.all())


UPDATES = [("a", 1, 0), ("b", 1, 1), ("a", 2, 2), ("c", 1, 3), ("a", 3, 4), ("b", 2, 5)]


def test_a_short_list_offsets_answer_is_read_past_to_the_fetched_end() -> None:
    # Six updates in one batch: a broker answering "first offset of the last batch + 1" says 1.
    assert restore(changelog(UPDATES), end=1, fetched_end=6, committed=6) == {"a": 3, "b": 2, "c": 1}


def test_updates_of_records_not_committed_stay_out_past_the_listed_end_too() -> None:
    assert restore(changelog(UPDATES), end=1, fetched_end=6, committed=4) == {"a": 2, "b": 1, "c": 1}


def test_an_exact_end_needs_no_fetched_end() -> None:
    assert restore(changelog(UPDATES), end=6, fetched_end=None, committed=6) == {"a": 3, "b": 2, "c": 1}


class TruncatedReader(OneBatchReader):
    """A changelog whose records below ``log_start`` are gone (deleted by the topic's time-based
    retention): a fetch below it is out of range and the reader resets to it, as aiokafka does."""

    def __init__(self, log: list[FetchedRecord], log_start: int) -> None:
        super().__init__([r for r in log if r.offset >= log_start], None)
        self._log_start = log_start

    async def poll(self, timeout_ms: int, max_records: int | None = None) -> Mapping[TopicPartition,
                                                                                      Sequence[ConsumerRecord]]:
        if self._position < self._log_start:
            self._position = self._log_start  # out of range: reset to the earliest offset, nothing returned
            return {}
        return await super().poll(timeout_ms, max_records)


def test_a_changelog_truncated_by_its_retention_restores_from_its_log_start_and_says_so(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="streamloop.state.restore")
    store = KeyValueStore("counts", InMemoryBytesStore("counts"), STR, LONG, None, None, "0_0/counts",
                          lambda: 0, lambda: None)
    store.inner.open()
    reader = TruncatedReader(changelog(UPDATES), log_start=4)
    applied, _end = asyncio.run(restore_store(store, CHANGELOG, 0, 6, lambda: reader,  # type: ignore[arg-type,return-value]
                                        {"in": ProcessedInput(6, frozenset())}, None, poll_ms=1))
    assert (applied, dict(store.all())) == (2, {"a": 3, "b": 2})
    assert [r.getMessage() for r in caplog.records if "has nothing" in r.getMessage()] == [
        "Changelog app-counts-changelog-0 has nothing from offset 0 to 4 (deleted by its retention, or "
        "compacted away): restored 2 update(s) from offset 4 to 6"]
