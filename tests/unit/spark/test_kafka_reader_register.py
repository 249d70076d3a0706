"""The executors' data source is registered once per session, also when the tasks of several stream
threads start their first range at the same time (on worker threads): a second registration of the
same name fails in Spark (DATA_SOURCE_ALREADY_EXISTS) and failed the stage's first batch."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

pytest.importorskip("pyspark")

from streamloop.spark import kafka_reader


class Registry:
    """A session's ``dataSource``: like Spark's, a name registered twice is an error."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def register(self, source: type) -> None:
        name = source.name()
        taken = name in self.names
        time.sleep(0.01)  # Spark's registration crosses py4j: long enough for another thread to ask
        if taken:
            raise RuntimeError(f"[DATA_SOURCE_ALREADY_EXISTS] Data source '{name}' already exists.")
        self.names.append(name)


class Session:
    def __init__(self, registry: Registry) -> None:
        self.dataSource = registry


def test_tasks_starting_together_register_the_data_source_once() -> None:
    session = Session(Registry())
    errors: list[BaseException] = []

    def start() -> None:
        try:
            kafka_reader.register(session)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert session.dataSource.names == [kafka_reader.KafkaRangeSource.name()]


def test_another_wrapper_of_a_session_that_has_it_registered_is_fine() -> None:
    registry = Registry()
    kafka_reader.register(Session(registry))
    kafka_reader.register(Session(registry))  # a new Python wrapper of the same JVM session
    assert registry.names == [kafka_reader.KafkaRangeSource.name()]


def test_other_registration_errors_are_raised() -> None:
    class Broken:
        def register(self, source: Any) -> None:
            raise RuntimeError("the JVM is gone")

    session = Session(Registry())
    session.dataSource = Broken()  # type: ignore[assignment]
    with pytest.raises(RuntimeError, match="the JVM is gone"):
        kafka_reader.register(session)
