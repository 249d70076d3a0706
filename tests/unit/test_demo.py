"""The demo behind ``make demo`` runs end to end on the embedded broker and reports what it did."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamloop import demo
from streamloop.transport.memory import MemoryBroker


@pytest.fixture
def fresh_demo_broker() -> Iterator[None]:
    """The demo always uses ``memory://demo``: start from an empty broker and forget it afterwards."""
    MemoryBroker.reset("demo")
    yield
    MemoryBroker.reset("demo")


@pytest.mark.usefixtures("fresh_demo_broker")
def test_demo_passes_its_check_and_prints_the_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["--orders", "400", "--rate", "100000", "--no-spark"]) == 0

    out = capsys.readouterr().out
    assert "streamloop demo: 400 orders" in out
    assert "In:  400 orders on 'orders'" in out
    assert "Out: " in out and "on 'big-orders'" in out
    assert "Thread " in out and "StreamThread-" in out
    assert "the client closed cleanly (NOT_RUNNING)" in out
    assert "Check: every kept order is in the output" in out


@pytest.mark.usefixtures("fresh_demo_broker")
def test_demo_with_pyspark_adds_a_spark_stage_that_counts_every_kept_order(
        spark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["--orders", "400", "--rate", "100000", "--spark"]) == 0

    out = capsys.readouterr().out
    assert "spark_batch(totals per customer)" in out
    assert "Spark: " in out and "per-batch customer totals on 'customer-totals'" in out
    assert "Check: every kept order is in the output" in out


@pytest.mark.usefixtures("fresh_demo_broker")
def test_the_demo_leaves_a_spark_session_it_did_not_start_running(spark: Any) -> None:
    # The demo's getOrCreate() returns a session already running in the process (here the test
    # session's): stopping it at the end would break its owner (it broke every later Spark test).
    assert demo.main(["--orders", "50", "--rate", "100000", "--spark"]) == 0

    assert spark.range(3).count() == 3  # type: ignore[attr-defined]


def test_the_demo_keeps_sparks_start_up_warnings_quiet_unless_asked(tmp_path: Path) -> None:
    """Spark's JVM logs its start-up warnings before ``setLogLevel`` can run: only a log4j
    configuration given at launch keeps them out (``--spark-logs`` shows them)."""
    quiet = demo.spark_settings(show_logs=False, workdir=str(tmp_path))
    option = quiet["spark.driver.extraJavaOptions"]
    assert option.startswith("-Dlog4j2.configurationFile=file:")
    properties = Path(option.split("file:", 1)[1]).read_text()
    assert "rootLogger.level = error" in properties
    assert "spark.driver.extraJavaOptions" not in demo.spark_settings(show_logs=True, workdir=str(tmp_path))
