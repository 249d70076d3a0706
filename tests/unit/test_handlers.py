"""The ready-made error handlers and dead letters (no broker needed)."""

from __future__ import annotations

import logging

import pytest

from streamloop.config import StreamsConfig, load_handler
from streamloop.errors import ConfigError
from streamloop.handlers import (
    DeserializationHandlerResponse,
    ErrorContext,
    LogAndContinueExceptionHandler,
    LogAndContinueProcessingExceptionHandler,
    LogAndFailExceptionHandler,
    LogAndFailProcessingExceptionHandler,
    LogAndPauseExceptionHandler,
    LogAndPauseProcessingExceptionHandler,
    LogAndRetryProcessingExceptionHandler,
    ProcessingHandlerResponse,
    dead_letter,
)
from streamloop.ids import TaskId

CONTEXT = ErrorContext(TaskId(0, 2), "orders", 2, 41, 1_700_000_000_000, (("trace", b"abc"),), b"k", b"\xff",
                       "KSTREAM-MAPVALUES-0000000001")


@pytest.mark.parametrize(("handler", "answer"), [
    (LogAndFailExceptionHandler(), DeserializationHandlerResponse.FAIL),
    (LogAndContinueExceptionHandler(), DeserializationHandlerResponse.CONTINUE),
    (LogAndPauseExceptionHandler(), DeserializationHandlerResponse.PAUSE),
], ids=lambda x: type(x).__name__)
def test_deserialization_handlers_answer_and_log_task_topic_partition_offset(
        handler, answer, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert handler.handle(CONTEXT, None, ValueError("bad bytes")) is answer
    message = caplog.records[-1].getMessage()
    assert "0_2" in message and "orders" in message and "41" in message


@pytest.mark.parametrize(("handler", "answer"), [
    (LogAndFailProcessingExceptionHandler(), ProcessingHandlerResponse.FAIL),
    (LogAndContinueProcessingExceptionHandler(), ProcessingHandlerResponse.CONTINUE),
    (LogAndPauseProcessingExceptionHandler(), ProcessingHandlerResponse.PAUSE),
    (LogAndRetryProcessingExceptionHandler(), ProcessingHandlerResponse.RETRY),
], ids=lambda x: type(x).__name__)
def test_processing_handlers_answer_and_name_the_processor(handler, answer, caplog) -> None:
    with caplog.at_level(logging.WARNING):
        assert handler.handle(CONTEXT, object(), RuntimeError("boom")) is answer
    assert "KSTREAM-MAPVALUES-0000000001" in caplog.records[-1].getMessage()


def test_dead_letter_carries_the_raw_bytes_original_headers_and_error_headers() -> None:
    try:
        raise ValueError("cannot parse")
    except ValueError as exc:
        letter = dead_letter("orders-dlq", CONTEXT, exc)
    assert (letter.topic, letter.key, letter.value) == ("orders-dlq", b"k", b"\xff")
    headers = dict(letter.headers)
    assert headers["trace"] == b"abc"
    assert headers["__streams.errors.exception"] == b"ValueError"
    assert headers["__streams.errors.message"] == b"cannot parse"
    assert headers["__streams.errors.topic"] == b"orders"
    assert headers["__streams.errors.partition"] == b"2"
    assert headers["__streams.errors.offset"] == b"41"
    assert b"Traceback" in headers["__streams.errors.stacktrace"]


def config(**handler: object) -> StreamsConfig:
    return StreamsConfig({"application.id": "a", "bootstrap.servers": "memory://", **handler})


KEY = "default.deserialization.exception.handler"


def test_the_default_deserialization_handler_is_log_and_fail() -> None:
    assert isinstance(load_handler(config(), KEY), LogAndFailExceptionHandler)


@pytest.mark.parametrize("value", [LogAndPauseExceptionHandler, LogAndPauseExceptionHandler(),
                                   "streamloop.handlers.LogAndPauseExceptionHandler"],
                         ids=["class", "instance", "path"])
def test_a_handler_is_given_as_class_instance_or_dotted_path(value: object) -> None:
    assert isinstance(load_handler(config(**{KEY: value}), KEY), LogAndPauseExceptionHandler)


def test_configure_is_called_with_the_config() -> None:
    seen = []

    class Recording:
        def configure(self, cfg) -> None:
            seen.append(cfg["application.id"])

        def handle(self, context, record, exception):
            return DeserializationHandlerResponse.FAIL

    load_handler(config(**{KEY: Recording}), KEY)
    assert seen == ["a"]


@pytest.mark.parametrize("value", ["nope", "streamloop.handlers.NoSuchHandler", "no_such_module.Handler", 42],
                         ids=repr)
def test_an_unusable_handler_is_a_config_error_naming_the_key(value: object) -> None:
    with pytest.raises(ConfigError, match=KEY):
        load_handler(config(**{KEY: value}), KEY)


def test_an_unloadable_handler_is_a_config_error_when_the_client_is_made() -> None:
    from streamloop import KafkaStreams, StreamsBuilder

    builder = StreamsBuilder()
    builder.stream("a").to("b")
    with pytest.raises(ConfigError, match=r"processing.exception.handler"):
        KafkaStreams(builder.build(), {"application.id": "app", "bootstrap.servers": "memory://x",
                                       "processing.exception.handler": "no.such.Handler"})


@pytest.mark.parametrize(("handler", "traceback_logged"), [
    (LogAndFailExceptionHandler(), False),
    (LogAndContinueExceptionHandler(), True),
    (LogAndPauseExceptionHandler(), True),
    (LogAndFailProcessingExceptionHandler(), False),
    (LogAndContinueProcessingExceptionHandler(), True),
    (LogAndPauseProcessingExceptionHandler(), True),
], ids=lambda x: type(x).__name__ if not isinstance(x, bool) else str(x))
def test_only_a_handler_that_keeps_the_thread_going_logs_the_traceback(
        handler, traceback_logged: bool, caplog: pytest.LogCaptureFixture) -> None:
    """A FAIL ends in the thread's failure report, which logs the traceback; logging it here too doubles it."""
    with caplog.at_level(logging.WARNING):
        handler.handle(CONTEXT, None, ValueError("bad"))

    assert (caplog.records[-1].exc_info is not None) is traceback_logged
    assert "ValueError: bad" in caplog.records[-1].getMessage() or traceback_logged
