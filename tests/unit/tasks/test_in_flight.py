"""The pieces of num.threads.per.task that need no broker: config checks and commit metadata."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamloop.completed_offsets import METADATA_MAX_BYTES, decode_completed, encode_completed
from streamloop.config import StreamsConfig
from streamloop.errors import ConfigError

BASE = {"application.id": "a", "bootstrap.servers": "memory://"}


@pytest.mark.parametrize(("key", "value"), [("num.threads.per.task", 0), ("num.threads.per.task", "many"),
                                            ("processing.ordering", "random")])
def test_invalid_concurrency_settings_are_config_errors_naming_the_key(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=key):
        StreamsConfig({**BASE, key: value})


def test_concurrency_is_off_by_default() -> None:
    config = StreamsConfig(BASE)
    assert config["num.threads.per.task"] == 1 and config["processing.ordering"] == "partition"


@given(watermark=st.integers(0, 10**12), above=st.sets(st.integers(1, 10**6), max_size=200))
def test_completed_offsets_round_trip_through_the_commit_metadata(watermark: int, above: set[int]) -> None:
    completed = {watermark + d for d in above}
    text = encode_completed(watermark, completed)
    assert len(text) <= METADATA_MAX_BYTES
    decoded = decode_completed(watermark, text)
    assert decoded <= completed  # what does not fit is left out (processed again), never invented
    if len(text) < METADATA_MAX_BYTES - 20:
        assert decoded == completed


def test_metadata_of_another_kind_is_ignored() -> None:
    assert decode_completed(5, "something else") == set()
    assert encode_completed(5, set()) == ""
