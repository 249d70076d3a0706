"""Log prefixes that say where a line comes from, as Kafka Streams' ``LogContext`` does."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any


class LogContext(logging.LoggerAdapter[logging.Logger]):
    """Prefixes every message, e.g. ``stream-thread [app-StreamThread-1] task [0_1] ``."""

    def __init__(self, logger: logging.Logger, prefix: str) -> None:
        super().__init__(logger, {"prefix": prefix})
        self.prefix = prefix

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        return f"{self.prefix}{msg}", kwargs

    def child(self, extra_prefix: str) -> LogContext:
        return LogContext(self.logger, f"{self.prefix}{extra_prefix}")


def thread_log(name: str, thread_name: str) -> LogContext:
    return LogContext(logging.getLogger(name), f"stream-thread [{thread_name}] ")
