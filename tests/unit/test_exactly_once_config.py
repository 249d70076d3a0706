"""``processing.guarantee``: the keys exactly_once_v2 changes or refuses."""

from __future__ import annotations

import pytest

from streamloop.config import COMMIT_INTERVAL_MS, StreamsConfig
from streamloop.errors import ConfigError

BASE = {"application.id": "app", "bootstrap.servers": "localhost:9092"}
EOS = {**BASE, "processing.guarantee": "exactly_once_v2"}


def test_commit_interval_defaults_to_100_ms_under_exactly_once() -> None:
    assert StreamsConfig(EOS)[COMMIT_INTERVAL_MS] == 100
    assert StreamsConfig(BASE)[COMMIT_INTERVAL_MS] == 30_000


def test_a_commit_interval_the_user_set_is_kept() -> None:
    assert StreamsConfig({**EOS, "commit.interval.ms": 2_000})[COMMIT_INTERVAL_MS] == 2_000


def test_an_unknown_guarantee_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"processing.guarantee"):
        StreamsConfig({**BASE, "processing.guarantee": "exactly_once"})


def test_the_memory_broker_refuses_exactly_once_saying_why() -> None:
    with pytest.raises(ConfigError, match=r"processing.guarantee.*memory:// broker does not model"):
        StreamsConfig({**EOS, "bootstrap.servers": "memory://x"})


@pytest.mark.parametrize("key, value", [("acks", "1")])
def test_settings_that_break_atomic_commits_are_refused(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=key):
        StreamsConfig({**EOS, key: value})


def test_records_in_flight_are_accepted_under_exactly_once() -> None:
    """Each record in flight holds its output until the commit's watermark covers it
    (streamloop.tasks.in_flight), so a transaction holds exactly the output of the offsets it commits."""
    config = StreamsConfig({**EOS, "num.threads.per.task": 4, "processing.ordering": "key"})
    assert config["num.threads.per.task"] == 4
