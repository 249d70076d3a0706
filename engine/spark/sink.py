"""The job of ``to_spark``: write each batch with Spark (Parquet files by default)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from .parts import BatchJob

WRITE_MODES = ("append", "overwrite", "ignore", "error", "errorifexists")


def write_job(path: str | None, table: str | None, format: str, mode: str,
              options: Mapping[str, str] | None) -> BatchJob:
    """Append the batch to files at ``path`` or to the table ``table``; the batch counts as done
    (its offsets may be committed) only once Spark reports the write finished.

    The writes of one sink go one at a time, whichever task and stream thread they come from:
    two file writes into one path at once share Hadoop's ``_temporary`` directory, and the first
    to commit removes it under the other.
    """
    one_at_a_time = threading.Lock()

    def run(frame: Any) -> None:
        writer = frame.write.format(format).mode(mode)
        for key, value in (options or {}).items():
            writer = writer.option(key, value)
        with one_at_a_time:
            if table is not None:
                writer.saveAsTable(table)
            else:
                writer.save(path)
        return None

    return run
