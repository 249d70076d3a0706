"""The processor behind ``KStream.print`` (Kafka Streams' KStreamPrint/PrintForeachAction): one
line per record, ``[label]: key, value``, flushed at once.

The tasks of one ``print()`` share one output: one file, opened (and emptied) when the first of
them starts and closed when the last closes, written under a lock because tasks on several
stream threads print at once. Standard output is never closed. Writing is synchronous, as in
Kafka Streams: ``print`` is for looking at a stream while developing.
"""

from __future__ import annotations

import sys
import threading
from typing import IO, TYPE_CHECKING

from streamloop.processors.api import BaseProcessor, ProcessorContext
from streamloop.records import Record

if TYPE_CHECKING:
    from streamloop.topology.printed import Printed


class PrintSink:
    """The output of one ``print()`` node, shared by its tasks' processors."""

    def __init__(self, printed: Printed) -> None:
        self._printed = printed
        self._lock = threading.Lock()
        self._file: IO[str] | None = None
        self._users = 0
        self._opened_before = False

    def acquire(self) -> None:
        with self._lock:
            if self._users == 0 and self._printed.path is not None:
                # Emptied once per run (as Kafka Streams opens it once); a later reopen, after every
                # task closed (a rebalance), appends to what was printed before.
                mode = "a" if self._opened_before else "w"
                self._file = open(self._printed.path, mode, encoding="utf-8")  # noqa: SIM115  # closed in release
                self._opened_before = True
            self._users += 1

    def write(self, line: str) -> None:
        with self._lock:
            out = self._file if self._printed.path is not None else sys.stdout
            if out is None:
                raise ValueError(f"print() to {self._printed.path}: the file is closed")
            out.write(line + "\n")
            out.flush()

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0 and self._file is not None:
                self._file.close()
                self._file = None


class PrintProcessor(BaseProcessor):
    """Writes ``[label]: <mapper(key, value)>`` for each record; forwards nothing."""

    def __init__(self, sink: PrintSink, printed: Printed, label: str) -> None:
        self.sink = sink
        self.mapper = printed.mapper
        self.label = label
        self._acquired = False

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.sink.acquire()
        self._acquired = True

    def process(self, record: Record) -> None:
        self.sink.write(f"[{self.label}]: {self.mapper(record.key, record.value)}")

    def close(self) -> None:
        if self._acquired:
            self._acquired = False
            self.sink.release()

