"""``StreamsConfig``: defaults, required keys, checked types and values, pass-through keys."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from streamloop.config import StreamsConfig
from streamloop.errors import ConfigError, UnknownConfigError

REQUIRED = {"application.id": "orders", "bootstrap.servers": "memory://"}


def make(settings: dict[str, Any] | None = None) -> StreamsConfig:
    """A config of the required keys plus ``settings``."""
    return StreamsConfig({**REQUIRED, **(settings or {})})


def config_with(key: str, value: Any) -> StreamsConfig:
    return make({key: value})


# -- defaults ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "default"),
    [
        ("num.stream.threads", 1),
        ("commit.interval.ms", 30_000),
        ("cache.max.bytes.buffering", 10 * 1024 * 1024),
        ("task.timeout.ms", 300_000),
        ("max.poll.records", 1000),
        ("max.poll.interval.ms", 300_000),
        ("session.timeout.ms", 45_000),
        ("heartbeat.interval.ms", 3_000),
        ("auto.offset.reset", "earliest"),
        ("processing.guarantee", "at_least_once"),
        ("group.instance.id", None),
        ("replication.factor", -1),
        ("acks", "all"),
    ],
)
def test_unset_key_reads_as_its_default(key: str, default: Any) -> None:
    assert make()[key] == default


def test_given_value_replaces_the_default() -> None:
    assert make({"num.stream.threads": 4})["num.stream.threads"] == 4


def test_config_is_a_mapping_of_every_known_key() -> None:
    config = make()

    assert "task.timeout.ms" in config
    assert len(config) == len(list(config))
    assert dict(config)["application.id"] == "orders"


def test_seconds_converts_a_ms_key() -> None:
    assert make({"commit.interval.ms": 1500}).seconds("commit.interval.ms") == 1.5


# -- required keys ---------------------------------------------------------------


@pytest.mark.parametrize("key", ["application.id", "bootstrap.servers"])
def test_missing_required_key_raises_config_error_naming_it(key: str) -> None:
    settings = {k: v for k, v in REQUIRED.items() if k != key}

    with pytest.raises(ConfigError, match=f"'{key}'.*required") as caught:
        StreamsConfig(settings)

    assert caught.value.key == key


@pytest.mark.parametrize("key", ["application.id", "bootstrap.servers"])
def test_blank_required_key_raises_config_error_naming_it(key: str) -> None:
    with pytest.raises(ConfigError, match="must not be empty") as caught:
        config_with(key, "   ")

    assert caught.value.key == key


def test_settings_that_are_not_a_mapping_raise_config_error() -> None:
    with pytest.raises(ConfigError, match="expected a mapping"):
        StreamsConfig([("application.id", "orders")])  # type: ignore[arg-type]


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        config_with("num.stream.threads", -1)


# -- types and values --------------------------------------------------------------


@pytest.mark.parametrize("key", ["num.stream.threads", "commit.interval.ms", "task.timeout.ms"])
def test_bool_for_an_int_key_raises_config_error_naming_it(key: str) -> None:
    with pytest.raises(ConfigError, match="expected int, got bool") as caught:
        config_with(key, True)

    assert caught.value.key == key


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("commit.interval.ms", 1.5),
        ("num.stream.threads", [1]),
        ("application.id", 42),
        ("group.instance.id", 7),
        ("auto.offset.reset", None),
    ],
)
def test_wrong_type_raises_config_error_naming_the_key(key: str, value: Any) -> None:
    with pytest.raises(ConfigError, match="expected") as caught:
        config_with(key, value)

    assert caught.value.key == key
    assert key in str(caught.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("num.stream.threads", -1),
        ("commit.interval.ms", -1),
        ("task.timeout.ms", -5),
        ("max.poll.records", 0),
        ("session.timeout.ms", 0),
        ("replication.factor", -2),
    ],
)
def test_count_below_its_minimum_raises_config_error_naming_the_key(key: str, value: int) -> None:
    with pytest.raises(ConfigError, match="must be >=") as caught:
        config_with(key, value)

    assert caught.value.key == key


def test_zero_stream_threads_is_allowed() -> None:
    assert make({"num.stream.threads": 0})["num.stream.threads"] == 0


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("auto.offset.reset", "smallest"),
        ("processing.guarantee", "exactly_once"),
        ("acks", "2"),
    ],
)
def test_value_outside_an_enum_raises_config_error_naming_the_key(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match="must be one of") as caught:
        config_with(key, value)

    assert caught.value.key == key


@pytest.mark.parametrize(("text", "number"), [("4", 4), (" 250 ", 250), ("0", 0)])
def test_numeric_string_for_an_int_key_is_converted(text: str, number: int) -> None:
    value = config_with("commit.interval.ms", text)["commit.interval.ms"]

    assert value == number
    assert type(value) is int


def test_negative_numeric_string_is_converted_and_checked() -> None:
    assert config_with("replication.factor", "-1")["replication.factor"] == -1
    with pytest.raises(ConfigError) as caught:
        config_with("num.stream.threads", "-1")
    assert caught.value.key == "num.stream.threads"


@pytest.mark.parametrize("text", ["four", "1e3", "1.5", ""])
def test_non_numeric_string_for_an_int_key_raises_config_error_naming_it(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_with("num.stream.threads", text)

    assert caught.value.key == "num.stream.threads"


@pytest.mark.parametrize("text", ["--1", "²"])
def test_malformed_numeric_string_raises_config_error_naming_the_key(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_with("num.stream.threads", text)

    assert caught.value.key == "num.stream.threads"


def test_any_object_is_accepted_as_a_default_serde() -> None:
    serde = object()

    assert config_with("default.value.serde", serde)["default.value.serde"] is serde


# -- unknown, deprecated and pass-through keys -----------------------------------------


def test_unknown_key_is_an_error_that_suggests_the_closest_key() -> None:
    with pytest.raises(ConfigError, match=r"Unknown config 'task.timeout': did you mean `task.timeout.ms`\?") as caught:
        config_with("task.timeout", 1000)

    assert caught.value.key == "task.timeout"
    assert "config.unknown.keys" in str(caught.value)


def test_unknown_key_far_from_every_key_is_an_error_without_a_suggestion() -> None:
    with pytest.raises(ConfigError, match="Unknown config 'zzz'") as caught:
        config_with("zzz", 1)

    assert "did you mean" not in str(caught.value)


def test_every_unknown_key_is_named_in_the_one_error() -> None:
    with pytest.raises(ConfigError) as caught:
        make({"num.stream.thread": 2, "commit.intervall.ms": 5})

    assert "`num.stream.threads`" in str(caught.value)
    assert "`commit.interval.ms`" in str(caught.value)


def test_unknown_key_only_warns_when_asked_for_lenience(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="streamloop.config"):
        config = make({"num.stream.thread": 3, "config.unknown.keys": "warn"})

    assert "num.stream.thread" not in config
    assert [r.getMessage() for r in caplog.records] == [
        "Unknown config 'num.stream.thread' is ignored: did you mean `num.stream.threads`?"]


def test_lenience_is_a_checked_choice() -> None:
    with pytest.raises(ConfigError, match="must be one of") as caught:
        config_with("config.unknown.keys", "ignore")

    assert caught.value.key == "config.unknown.keys"


@pytest.mark.parametrize(("key", "value"), [("security.protocol", "PLAINTEXT"), ("sasl.mechanism", "PLAIN"),
                                            ("ssl.endpoint.identification.algorithm", "https")])
def test_kafka_security_keys_are_known(key: str, value: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="streamloop.config"):
        config_with(key, value)

    assert caplog.records == []


def test_a_misspelled_security_key_is_unknown_and_the_closest_is_suggested() -> None:
    with pytest.raises(UnknownConfigError) as caught:
        config_with("security.protocl", "SSL")

    assert "security.protocol" in str(caught.value)


@pytest.mark.parametrize("servers", ["memry://x", "kafka://broker:9092", "broker:port", "a:9092,,b:9092",
                                     "host:9092/path"])
def test_malformed_bootstrap_servers_is_an_error_naming_the_accepted_forms(servers: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_with("bootstrap.servers", servers)

    assert caught.value.key == "bootstrap.servers"
    assert "host:port[,host:port]" in str(caught.value)
    assert "memory://name" in str(caught.value)
    assert repr(servers) in str(caught.value)


@pytest.mark.parametrize("servers", ["memory://", "memory://orders", "localhost:9092", "b1:9092, b2:9093",
                                     "broker", "[::1]:9092", "10.0.0.1:9092"])
def test_well_formed_bootstrap_servers_are_accepted(servers: str) -> None:
    assert config_with("bootstrap.servers", servers)["bootstrap.servers"] == servers


def test_known_keys_do_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="streamloop.config"):
        make({"num.stream.threads": 2, "client.id": "c"})

    assert caplog.records == []


def test_deprecated_retries_warns_and_names_the_replacement(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="streamloop.config"):
        config_with("retries", 5)

    assert len(caplog.records) == 1
    assert caplog.records[0].levelno == logging.WARNING
    assert "'retries' is deprecated" in caplog.records[0].getMessage()
    assert "task.timeout.ms" in caplog.records[0].getMessage()


@pytest.mark.parametrize("key", ["consumer.fetch.min.bytes", "producer.compression.type",
                                 "admin.retries", "spark.master"])
def test_pass_through_key_is_kept_without_warning(key: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="streamloop.config"):
        config = config_with(key, "x")

    assert config[key] == "x"
    assert caplog.records == []


def test_pass_through_value_is_kept_unchecked() -> None:
    value = object()

    assert config_with("producer.interceptor", value)["producer.interceptor"] is value


def test_with_prefix_strips_the_prefix_and_keeps_only_its_keys() -> None:
    config = StreamsConfig({
        **REQUIRED,
        "consumer.fetch.min.bytes": 1,
        "consumer.isolation.level": "read_committed",
        "producer.compression.type": "lz4",
    })

    assert config.with_prefix("consumer.") == {"fetch.min.bytes": 1, "isolation.level": "read_committed"}
    assert config.with_prefix("producer.") == {"compression.type": "lz4"}
    assert config.with_prefix("admin.") == {}


# -- client.id --------------------------------------------------------------------


def test_client_id_defaults_to_application_id_and_a_short_random_suffix() -> None:
    client_id = make()["client.id"]

    prefix, _, suffix = client_id.partition("-")
    assert prefix == "orders"
    assert len(suffix) == 6
    int(suffix, 16)


def test_generated_client_ids_differ_between_configs() -> None:
    assert make()["client.id"] != make()["client.id"]


def test_given_client_id_is_kept() -> None:
    assert make({"client.id": "orders-eu"})["client.id"] == "orders-eu"


def test_config_built_from_a_config_keeps_its_given_values() -> None:
    original = make({"num.stream.threads": 3, "consumer.fetch.min.bytes": 1})

    copy = StreamsConfig(original)

    assert copy["num.stream.threads"] == 3
    assert copy["consumer.fetch.min.bytes"] == 1
