"""One local SparkSession for the whole test session (starting one takes seconds).

Clients under test find it active and reuse it, so they never stop it on close.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

SETTINGS = {
    "spark.master": "local[2]",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
}


def spark_session() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("streamloop-tests")
    for key, value in SETTINGS.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
