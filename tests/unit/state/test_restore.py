"""restore_store against a reader that behaves like a Kafka-protocol broker whose ListOffsets
"latest" stops short of the log end (the first offset of the last batch + 1, as Tansu answers):
the fetch responses' end carries the restore to the real end."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from engine.records import ConsumerRecord, FetchedRecord, TopicPartition
from engine.serdes import LongSerde, StringSerde
from engine.state.bytes_stores import InMemoryBytesStore
from engine.state.changelog import encode_source
from engine.state.restore import ProcessedInput, restore_store
from engine.state.store import KeyValueStore

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
