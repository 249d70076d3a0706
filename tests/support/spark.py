"""One local SparkSession for the whole test session (starting one takes seconds).

Clients under test find it active and reuse it, so they never stop it on close.
"""

from __future__ import annotations

import os
import sys
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
    # Python workers (a stage reading on the executors runs its reader in them) run this
    # interpreter, which has streamloop's dependencies; Spark's default is the python3 on PATH.
    "spark.pyspark.python": sys.executable,
}


def spark_session() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    # The JVM plans a Python data source in a worker it starts with PYSPARK_PYTHON from its own
    # environment (not the session's settings): set before the gateway starts.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName("streamloop-tests")
    for key, value in SETTINGS.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
