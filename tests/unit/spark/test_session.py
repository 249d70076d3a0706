"""The client's SparkSession: settings passed through, an active session reused and left running,
and a clear error when pyspark is missing."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from streamloop import StreamsBuilder, StreamsConfig
from streamloop.errors import SparkUnavailableError
from streamloop.spark.session import ARROW_KEY, SparkSessions, require_pyspark, session_settings


def config(**extra: Any) -> StreamsConfig:
    return StreamsConfig({"application.id": "app", "bootstrap.servers": "memory://x", **extra})


def test_spark_settings_pass_through_and_arrow_is_on_by_default() -> None:
    settings = session_settings(config(**{"spark.executor.memory": "2g", "spark.batch.max.records": 5}))

    assert settings["spark.master"] == "local[*]"
    assert settings["spark.executor.memory"] == "2g"
    assert settings[ARROW_KEY] == "true"
    assert not any(key.startswith("spark.batch.") for key in settings)  # the engine's own keys


def test_arrow_can_be_turned_off() -> None:
    assert session_settings(config(**{ARROW_KEY: "false"}))[ARROW_KEY] == "false"


def test_an_active_session_is_reused_and_not_stopped(spark: Any) -> None:
    sessions = SparkSessions(config(), "app")

    assert sessions.get() is spark
    assert not sessions.owned
    sessions.stop()
    assert spark.range(3).count() == 3  # still running


@pytest.mark.parametrize("module", ["pyspark", "pyarrow"])
def test_a_spark_stage_without_pyspark_says_what_to_install(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # import now raises ImportError

    with pytest.raises(SparkUnavailableError, match=r"streamloop\[spark\]") as caught:
        require_pyspark("spark_batch()")
    assert caught.value.module == module
    stream = StreamsBuilder().stream("in")
    with pytest.raises(SparkUnavailableError, match="spark_batch"):
        stream.spark_batch(lambda frame: frame)
    with pytest.raises(SparkUnavailableError, match="to_spark"):
        stream.to_spark("/data/lake")


def test_import_engine_does_not_import_pyspark() -> None:
    import subprocess

    code = "import sys, engine; sys.exit(1 if 'pyspark' in sys.modules or 'pyarrow' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
