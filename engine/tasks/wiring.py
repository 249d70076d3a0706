"""The task machinery of a stream thread, built from the config: the ``TaskManager`` and
what it is given (error handling, task timers, default serdes, state settings).

Two callers build it: the stream thread over Kafka clients, and the test driver (a stream
thread without its poll loop) over its in-memory topic logs. They build it here, in one
place, so that what the driver tests is what a client runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from streamloop import config as cfg
from streamloop.config import StreamsConfig, load_handler
from streamloop.handlers.responses import Answer
from streamloop.serdes import BytesSerde, Serde, as_serde
from streamloop.state.task_state import StateSettings
from streamloop.state.uncommitted import UncommittedBudget
from streamloop.timestamps import load_timestamp_extractor

from .error_handling import ErrorHandling
from .manager import TaskManager
from .retries import RetryPolicy
from .timeouts import TaskTimer

if TYPE_CHECKING:
    from streamloop.collector import RecordCollector
    from streamloop.commit import CommitProtocol
    from streamloop.ids import TaskId
    from streamloop.logcontext import LogContext
    from streamloop.spark.session import SparkSessions
    from streamloop.state.cache import ThreadCache
    from streamloop.state.restore import StateRestoreListener
    from streamloop.topology.topology import Topology
    from streamloop.transport.base import Consumer

    from .manager import ExactlyOnce
    from .task import StreamTask
    from .tracing import Tracing


def default_serde(config: StreamsConfig, key: str) -> Serde:
    """``default.key.serde`` or ``default.value.serde``: bytes when not set."""
    value = config[key]
    return BytesSerde() if value is None else as_serde(value, key)


def error_handling(config: StreamsConfig, collector: RecordCollector) -> ErrorHandling:
    """The configured deserialization and processing exception handlers, and the dead-letter topic."""
    return ErrorHandling(
        load_handler(config, cfg.DEFAULT_DESERIALIZATION_EXCEPTION_HANDLER),
        load_handler(config, cfg.PROCESSING_EXCEPTION_HANDLER),
        config[cfg.ERRORS_DEAD_LETTER_QUEUE_TOPIC_NAME],
        collector,
        RetryPolicy(config[cfg.PROCESSING_RETRY_BACKOFF_MS], config[cfg.PROCESSING_RETRY_BACKOFF_MAX_MS],
                    config[cfg.PROCESSING_RETRY_MAX_ATTEMPTS], Answer(config[cfg.PROCESSING_RETRY_EXHAUSTED_ANSWER])),
    )


def tracing(config: StreamsConfig) -> Tracing | None:
    """The thread's tracing when ``tracing.enabled``, else None: then OpenTelemetry is never imported."""
    if not config[cfg.TRACING_ENABLED]:
        return None
    from .tracing import Tracing  # the optional extra, loaded only when asked for

    return Tracing(config[cfg.APPLICATION_ID], config[cfg.TRACING_TRACER_PROVIDER])


def task_timers(config: StreamsConfig, monotonic_ms: Callable[[], int]) -> Callable[[TaskId, LogContext], TaskTimer]:
    """Makes each task's ``task.timeout.ms`` timer, with the configured back-off, on ``monotonic_ms``."""

    def timer(task_id: TaskId, logger: LogContext) -> TaskTimer:
        return TaskTimer(task_id, config[cfg.TASK_TIMEOUT_MS], config[cfg.RETRY_BACKOFF_MS],
                         config[cfg.RETRY_BACKOFF_MAX_MS], monotonic_ms, logger)

    return timer


def state_settings(config: StreamsConfig, state_dir: str, cache: ThreadCache, reader_factory: Callable[[], Any],
                   restore_listener: StateRestoreListener | None = None,
                   global_stores: Mapping[str, Any] | None = None,
                   uncommitted: UncommittedBudget | None = None) -> StateSettings:
    """Where the tasks' stores live and how they restore (``reader_factory``: a groupless reader);
    ``global_stores``: the client's global tables' stores, which every task reads; ``uncommitted``:
    the thread's bound of persistent stores' writes held until a commit (the whole setting if None)."""
    if uncommitted is None:
        uncommitted = UncommittedBudget(config[cfg.STATESTORE_UNCOMMITTED_MAX_BYTES])
    return StateSettings(state_dir, config[cfg.DEFAULT_DSL_STORE] == "rocksDB", cache, reader_factory,
                         restore_listener, dict(global_stores or {}), uncommitted)


def task_manager(
    config: StreamsConfig,
    topology: Topology,
    consumer: Consumer,
    collector: RecordCollector,
    committer: CommitProtocol,
    *,
    spawn: Callable[[StreamTask], None],
    logger: LogContext,
    clock_ms: Callable[[], int],
    monotonic_ms: Callable[[], int],
    errors: ErrorHandling,
    state: StateSettings,
    on_tasks_changed: Callable[[], None] = lambda: None,
    spark: SparkSessions | None = None,
    exactly_once: ExactlyOnce | None = None,
) -> TaskManager:
    """The thread's ``TaskManager`` (a client's stream thread, or the test driver's)."""
    return TaskManager(
        config[cfg.APPLICATION_ID], topology, consumer, collector, committer, spawn, logger, clock_ms,
        default_serde(config, cfg.DEFAULT_KEY_SERDE), default_serde(config, cfg.DEFAULT_VALUE_SERDE),
        config[cfg.BUFFERED_RECORDS_PER_PARTITION],
        timer_factory=task_timers(config, monotonic_ms),
        monotonic_ms=monotonic_ms,
        errors=errors,
        on_tasks_changed=on_tasks_changed,
        threads_per_task=config[cfg.NUM_THREADS_PER_TASK],
        ordering=config[cfg.PROCESSING_ORDERING],
        state=state,
        config=config,
        spark=spark,
        exactly_once=exactly_once,
        timestamp_extractor=load_timestamp_extractor(config),
        tracing=tracing(config),
    )
