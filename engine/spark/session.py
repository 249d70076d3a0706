"""``SparkSessions``: the one ``SparkSession`` a client's stream threads share.

The session is made lazily, by the first Spark batch (on a worker thread, never on
a stream thread's loop), from ``spark.master`` and every other ``spark.*`` setting.
If a ``SparkSession`` is already active in the process (a notebook, a test session,
another client) it is reused and left running on close; only a session this client
created is stopped by ``KafkaStreams.close``.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Mapping
from typing import Any

from streamloop import config as cfg
from streamloop.errors import SparkUnavailableError

log = logging.getLogger(__name__)

# Engine settings that live under ``spark.`` but mean nothing to Spark itself.
ENGINE_KEYS = frozenset({
    cfg.SPARK_BATCH_MAX_RECORDS, cfg.SPARK_BATCH_MAX_WAIT_MS, cfg.SPARK_BATCH_MAX_IN_FLIGHT,
    cfg.SPARK_BATCH_TIMEOUT_MS, cfg.SPARK_BATCH_BULK, cfg.SPARK_BATCH_MAX_BYTES, cfg.SPARK_BATCH_SHARED,
    cfg.SPARK_BATCH_SHARED_MAX_MS, cfg.SPARK_BATCH_READ, cfg.SPARK_BATCH_EAGER, cfg.SPARK_BATCH_READ_MAX_RECORDS,
})

ARROW_KEY = "spark.sql.execution.arrow.pyspark.enabled"
LOCAL_RELATION_KEY = "spark.sql.execution.arrow.localRelationThreshold"


def require_pyspark(what: str) -> None:
    """Raise ``SparkUnavailableError`` unless pyspark and pyarrow can be imported."""
    for module in ("pyspark", "pyarrow"):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise SparkUnavailableError(what, module) from exc


def session_settings(config: Mapping[str, Any]) -> dict[str, str]:
    """The ``spark.*`` settings handed to the session builder (Arrow on unless said otherwise)."""
    settings = {k: str(v) for k, v in config.items()
                if k.startswith("spark.") and k not in ENGINE_KEYS and v is not None}
    settings.setdefault(ARROW_KEY, "true")
    # A batch's Arrow table becomes a frame of one partition per record batch, not a local
    # relation on the driver: a row-wise function's output is then told apart by partition
    # (``parts.run_combined``).
    settings.setdefault(LOCAL_RELATION_KEY, "0")
    return settings


class SparkSessions:
    """Hands out the client's ``SparkSession``. Thread-safe; ``get`` blocks while one starts."""

    def __init__(self, config: Mapping[str, Any], app_name: str) -> None:
        self.config = config
        self._app_name = app_name
        self._lock = threading.Lock()
        self._session: Any = None
        self._owned = False

    @property
    def started(self) -> bool:
        return self._session is not None

    @property
    def owned(self) -> bool:
        """Whether this client created the session (and so stops it on close)."""
        return self._owned

    def get(self) -> Any:
        """The session: an active one of the process, or a new one from the ``spark.*`` settings.

        Call it off the event loop (a session takes seconds to start).
        """
        with self._lock:
            if self._session is not None and not _stopped(self._session):
                return self._session
            require_pyspark("A Spark stage")
            from pyspark.sql import SparkSession

            active = SparkSession.getActiveSession() or SparkSession._instantiatedSession
            if active is not None and not _stopped(active):
                log.info("Using the SparkSession already active in this process (master %s)",
                         active.sparkContext.master)
                self._session, self._owned = active, False
                return active
            settings = session_settings(self.config)
            builder = SparkSession.builder.appName(self._app_name)
            for key, value in settings.items():
                builder = builder.config(key, value)
            log.info("Starting a SparkSession on %s", settings.get("spark.master"))
            self._session, self._owned = builder.getOrCreate(), True
            return self._session

    def cancel_tagged(self, tag: str) -> None:
        """Cancel the session's jobs tagged ``tag`` (a timeout, a close); nothing before it started."""
        session = self._session
        if session is None:
            return
        try:
            session.sparkContext.cancelJobsWithTag(tag)
        except Exception:
            log.warning("Could not cancel the Spark jobs tagged %s", tag, exc_info=True)

    def stop(self) -> None:
        """Stop the session if this client created it; a borrowed one keeps running."""
        with self._lock:
            session, owned = self._session, self._owned
            self._session, self._owned = None, False
        if session is not None and owned:
            log.info("Stopping the SparkSession")
            session.stop()


def _stopped(session: Any) -> bool:
    context = getattr(session, "_sc", None)
    return context is None or getattr(context, "_jsc", None) is None
