"""``StreamsConfig``: every dotted key the engine reads, with type, default and check.

Keys keep Kafka Streams' dotted names. The table below is the single source of
truth: validation, defaults and the documentation all come from it. Values are
checked once, at construction; a wrong type or value raises ``ConfigError``
naming the key. An unknown key is a ``ConfigError`` too, suggesting the closest
known key (a misspelled ``task.timeout.ms`` would otherwise be silently ignored);
``config.unknown.keys: warn`` turns that into a warning. Settings meant for the
clients pass through with the ``consumer.``, ``producer.``, ``admin.`` and
``spark.`` prefixes.
"""

from __future__ import annotations

import difflib
import importlib
import logging
import os
import re
import secrets
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from engine.errors import ConfigError, UnknownConfigError

log = logging.getLogger(__name__)

PASS_THROUGH_PREFIXES = ("consumer.", "producer.", "admin.", "spark.")
# Kafka's security settings (security.protocol, sasl.*, ssl.*) are not unknown keys.
SECURITY_PREFIXES = ("security.", "sasl.", "ssl.")


@dataclass(frozen=True, slots=True)
class ConfigKey:
    name: str
    type: type | tuple[type, ...]
    default: Any
    doc: str
    check: Callable[[Any], str | None] | None = None
    deprecated: str | None = None


def _at_least(minimum: int) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if value >= minimum else f"must be >= {minimum}, got {value}"

    return check


def _one_of(*choices: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if value in choices else f"must be one of {list(choices)}, got {value!r}"

    return check


def _non_empty(value: Any) -> str | None:
    return None if value.strip() else "must not be empty"


MEMORY_SCHEME = "memory://"
_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(:[0-9]{1,5})?")


def check_bootstrap_servers(value: Any) -> str | None:
    """Why ``value`` is not ``host:port[,host:port]`` nor ``memory://name``; None when it is one of them."""
    if not value.strip():
        return "must not be empty"
    if value.startswith(MEMORY_SCHEME) or all(_HOST_PORT.fullmatch(part.strip()) for part in value.split(",")):
        return None
    return (f"expected host:port[,host:port] (a Kafka cluster) or memory://name (the embedded broker), "
            f"got {value!r}")


APPLICATION_ID = "application.id"
BOOTSTRAP_SERVERS = "bootstrap.servers"
CLIENT_ID = "client.id"
NUM_STREAM_THREADS = "num.stream.threads"
COMMIT_INTERVAL_MS = "commit.interval.ms"
CACHE_MAX_BYTES_BUFFERING = "cache.max.bytes.buffering"
TASK_TIMEOUT_MS = "task.timeout.ms"
POLL_MS = "poll.ms"
MAX_POLL_RECORDS = "max.poll.records"
BUFFERED_RECORDS_PER_PARTITION = "buffered.records.per.partition"
MAX_POLL_INTERVAL_MS = "max.poll.interval.ms"
SESSION_TIMEOUT_MS = "session.timeout.ms"
HEARTBEAT_INTERVAL_MS = "heartbeat.interval.ms"
REQUEST_TIMEOUT_MS = "request.timeout.ms"
RETRY_BACKOFF_MS = "retry.backoff.ms"
RETRY_BACKOFF_MAX_MS = "retry.backoff.max.ms"
AUTO_OFFSET_RESET = "auto.offset.reset"
GROUP_INSTANCE_ID = "group.instance.id"
PROCESSING_GUARANTEE = "processing.guarantee"
AT_LEAST_ONCE = "at_least_once"
EXACTLY_ONCE_V2 = "exactly_once_v2"
# Kafka Streams' default commit interval under exactly-once: a transaction per 100 ms.
EOS_COMMIT_INTERVAL_MS = 100
DEFAULT_KEY_SERDE = "default.key.serde"
DEFAULT_VALUE_SERDE = "default.value.serde"
REPLICATION_FACTOR = "replication.factor"
STATE_DIR = "state.dir"
LINGER_MS = "linger.ms"
BATCH_SIZE = "batch.size"
ACKS = "acks"
RETRIES = "retries"
ERROR_SHUTDOWN_TIMEOUT_MS = "error.shutdown.timeout.ms"
NUM_THREADS_PER_TASK = "num.threads.per.task"
PROCESSING_ORDERING = "processing.ordering"
DEFAULT_DESERIALIZATION_EXCEPTION_HANDLER = "default.deserialization.exception.handler"
PROCESSING_EXCEPTION_HANDLER = "processing.exception.handler"
ERRORS_DEAD_LETTER_QUEUE_TOPIC_NAME = "errors.dead.letter.queue.topic.name"
DEFAULT_DSL_STORE = "default.dsl.store"
STATE_CLEANUP_DELAY_MS = "state.cleanup.delay.ms"
CONFIG_UNKNOWN_KEYS = "config.unknown.keys"
METRICS_SAMPLE_WINDOW_MS = "metrics.sample.window.ms"
METRICS_NUM_SAMPLES = "metrics.num.samples"
METRICS_PROMETHEUS_HOST = "metrics.prometheus.host"
METRICS_PROMETHEUS_PORT = "metrics.prometheus.port"
MONITOR_HOST = "monitor.host"
MONITOR_PORT = "monitor.port"
MONITOR_WEBUI_PORT = "monitor.webui.port"
MONITOR_CONSOLE_PORT = "monitor.console.port"
SPARK_MASTER = "spark.master"
SPARK_BATCH_MAX_RECORDS = "spark.batch.max.records"
SPARK_BATCH_MAX_WAIT_MS = "spark.batch.max.wait.ms"
SPARK_BATCH_MAX_IN_FLIGHT = "spark.batch.max.in.flight"
SPARK_BATCH_TIMEOUT_MS = "spark.batch.timeout.ms"

KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(APPLICATION_ID, str, None,
              "The consumer group and the prefix of internal topics and client ids. Required.",
              _non_empty),
    ConfigKey(BOOTSTRAP_SERVERS, str, None,
              "host:port[,host:port] of the Kafka cluster, or memory://[name] for the embedded broker. Required.",
              check_bootstrap_servers),
    ConfigKey(CLIENT_ID, str, "",
              "Prefix of thread and client names; defaults to <application.id>-<6 random hex digits>."),
    ConfigKey(CONFIG_UNKNOWN_KEYS, str, "error",
              "What a key that is neither known nor under a pass-through prefix does: 'error' raises a "
              "ConfigError that suggests the closest known key; 'warn' logs that and ignores the key.",
              _one_of("error", "warn")),
    ConfigKey(NUM_STREAM_THREADS, int, 1, "Stream threads started by start().", _at_least(0)),
    ConfigKey(COMMIT_INTERVAL_MS, int, 30_000,
              "How often a stream thread commits the offsets of fully processed records "
              "(100 under exactly_once_v2 unless set).", _at_least(0)),
    ConfigKey(CACHE_MAX_BYTES_BUFFERING, int, 10 * 1024 * 1024,
              "Record cache size of the whole client, split evenly across its alive stream threads.",
              _at_least(0)),
    ConfigKey(TASK_TIMEOUT_MS, int, 300_000,
              "How long a task may keep timing out before it fails (KIP-572).", _at_least(0)),
    ConfigKey(POLL_MS, int, 100, "How long a poll waits for records.", _at_least(0)),
    ConfigKey(MAX_POLL_RECORDS, int, 1000, "Records fetched per poll at most.", _at_least(1)),
    ConfigKey(BUFFERED_RECORDS_PER_PARTITION, int, 1000,
              "Records buffered per partition before fetching from it pauses (back-pressure).",
              _at_least(1)),
    ConfigKey(MAX_POLL_INTERVAL_MS, int, 300_000,
              "A member that does not poll within this time leaves the group.", _at_least(1)),
    ConfigKey(SESSION_TIMEOUT_MS, int, 45_000,
              "Group session timeout: a member whose heartbeats stop for this long is removed from the group. "
              "Some Kafka-compatible brokers (Tansu) hold each JoinGroup reply for half of it, so every start "
              "and rebalance waits about 23 s at the default; a lower value (e.g. 10000) shortens that, but "
              "heartbeats run on the stream thread's event loop, so a short timeout and a busy loop risk "
              "eviction. See [Running in production](operations.md#brokers-that-hold-joingroup).", _at_least(1)),
    ConfigKey(HEARTBEAT_INTERVAL_MS, int, 3_000, "Group heartbeat interval.", _at_least(1)),
    ConfigKey(REQUEST_TIMEOUT_MS, int, 40_000, "Client request timeout.", _at_least(1)),
    ConfigKey(RETRY_BACKOFF_MS, int, 100, "Back-off before retrying a failed request.", _at_least(0)),
    ConfigKey(RETRY_BACKOFF_MAX_MS, int, 1_000,
              "Cap of the growing back-off between retries of a timed-out task.", _at_least(0)),
    ConfigKey(AUTO_OFFSET_RESET, str, "earliest",
              "Where a partition without committed offset starts.", _one_of("earliest", "latest", "none")),
    ConfigKey(GROUP_INSTANCE_ID, (str, type(None)), None,
              "Static membership id; each stream thread appends -<n>."),
    ConfigKey(PROCESSING_GUARANTEE, str, AT_LEAST_ONCE,
              "Delivery guarantee: at_least_once, or exactly_once_v2 (transactions; Kafka only, "
              "see docs/exactly_once.md).", _one_of(AT_LEAST_ONCE, EXACTLY_ONCE_V2)),
    ConfigKey(DEFAULT_KEY_SERDE, object, None, "Serde for keys where the topology names none (bytes)."),
    ConfigKey(DEFAULT_VALUE_SERDE, object, None, "Serde for values where the topology names none (bytes)."),
    ConfigKey(REPLICATION_FACTOR, int, -1,
              "Replication factor of the internal (repartition, changelog) topics the engine creates; "
              "-1 creates them with 1 (aiokafka cannot ask for the broker's default): set it to 3 on a "
              "production cluster.", _at_least(-1)),
    ConfigKey(STATE_DIR, str, os.path.join(tempfile.gettempdir(), "streamloop"),
              "Directory for local state: persistent stores and checkpoints under <application.id>/<task id>/."),
    ConfigKey(DEFAULT_DSL_STORE, str, "rocksDB",
              "Store of the DSL's tables unless Materialized says otherwise: 'rocksDB' (persistent, "
              "restores only the changelog's tail after a clean stop) or 'in_memory'.",
              _one_of("rocksDB", "in_memory")),
    ConfigKey(STATE_CLEANUP_DELAY_MS, int, 600_000,
              "A task directory in state.dir that no local thread owns is deleted after this long.",
              _at_least(0)),
    ConfigKey(LINGER_MS, int, 5, "Producer linger.", _at_least(0)),
    ConfigKey(BATCH_SIZE, int, 64 * 1024, "Producer batch size in bytes.", _at_least(1)),
    ConfigKey(ACKS, str, "all", "Producer acks.", _one_of("all", "-1", "0", "1")),
    ConfigKey(NUM_THREADS_PER_TASK, int, 1,
              "Records of one task processed at the same time (async processors run as concurrent "
              "coroutines); 1 processes them one by one.", _at_least(1)),
    ConfigKey(PROCESSING_ORDERING, str, "partition",
              "With num.threads.per.task > 1: 'partition' keeps output in offset order, 'key' keeps "
              "each key's records in order, 'unordered' keeps none.", _one_of("partition", "key", "unordered")),
    ConfigKey(ERROR_SHUTDOWN_TIMEOUT_MS, int, 30_000,
              "How long a shutdown caused by the uncaught-exception handler may take.", _at_least(0)),
    ConfigKey(DEFAULT_DESERIALIZATION_EXCEPTION_HANDLER, object, "handlers.LogAndFailExceptionHandler",
              "What to do with a record whose bytes cannot be read: a handler class, instance or dotted path."),
    ConfigKey(PROCESSING_EXCEPTION_HANDLER, object, "handlers.LogAndFailProcessingExceptionHandler",
              "What to do when a processor raises: a handler class, instance or dotted path."),
    ConfigKey(ERRORS_DEAD_LETTER_QUEUE_TOPIC_NAME, (str, type(None)), None,
              "Topic that receives every record an error handler was asked about (KIP-1034)."),
    ConfigKey(METRICS_SAMPLE_WINDOW_MS, int, 30_000,
              "Length of one sample window of the windowed metrics (rates, latency avg/max).", _at_least(1)),
    ConfigKey(METRICS_NUM_SAMPLES, int, 2,
              "Sample windows kept for the windowed metrics.", _at_least(1)),
    ConfigKey(METRICS_PROMETHEUS_HOST, str, "127.0.0.1",
              "Address the Prometheus endpoint listens on (extra 'prometheus').", _non_empty),
    ConfigKey(METRICS_PROMETHEUS_PORT, (int, type(None)), None,
              "Port of the Prometheus endpoint serving metrics() (0: any free port); none when unset."),
    ConfigKey(MONITOR_HOST, str, "127.0.0.1",
              "Address the aiomonitor console listens on (`streamloop run --monitor`).", _non_empty),
    ConfigKey(MONITOR_PORT, int, 20101, "Port of the aiomonitor console (telnet).", _at_least(1)),
    ConfigKey(MONITOR_WEBUI_PORT, int, 20102, "Port of aiomonitor's web UI (0: any free port).", _at_least(0)),
    ConfigKey(MONITOR_CONSOLE_PORT, int, 20103,
              "Port of aiomonitor's Python REPL (the console's `console` command).", _at_least(1)),
    ConfigKey(SPARK_MASTER, str, "local[*]",
              "Where Spark stages run: local[*] in this process, or a cluster (spark://host:7077, yarn, "
              "k8s://...). Every other spark.* key is passed to the SparkSession too.", _non_empty),
    ConfigKey(SPARK_BATCH_MAX_RECORDS, int, 10_000,
              "Records of one task per Spark batch at most, where the stage does not say.", _at_least(1)),
    ConfigKey(SPARK_BATCH_MAX_WAIT_MS, int, 1_000,
              "How long a Spark batch waits to fill before it runs anyway, where the stage does not say.",
              _at_least(0)),
    ConfigKey(SPARK_BATCH_MAX_IN_FLIGHT, int, 2,
              "Spark batches of one task running at once; more records wait (back-pressure).", _at_least(1)),
    ConfigKey(SPARK_BATCH_TIMEOUT_MS, int, 120_000,
              "A Spark batch running longer is cancelled and retried as a timeout under task.timeout.ms "
              "(0: no limit).", _at_least(0)),
    ConfigKey(RETRIES, int, 0,
              "Ignored: since KIP-572 task.timeout.ms bounds retries.", _at_least(0),
              deprecated="use task.timeout.ms"),
)

_BY_NAME = {key.name: key for key in KEYS}


def _closest_key(name: str) -> str | None:
    """The known key closest to ``name`` (difflib), None when none is close."""
    close = difflib.get_close_matches(name, _BY_NAME, n=1) if isinstance(name, str) else []
    return close[0] if close else None


class StreamsConfig(Mapping[str, Any]):
    """Validated configuration of a ``KafkaStreams`` client.

    Reads as a mapping of every known key (defaults filled in) plus the
    pass-through keys given. Raises ``ConfigError`` for a wrong type or value and
    for a missing required key.
    """

    def __init__(self, settings: Mapping[str, Any]) -> None:
        if isinstance(settings, StreamsConfig):
            settings = settings._given
        if not isinstance(settings, Mapping):
            raise ConfigError("<config>", f"expected a mapping of keys to values, got {type(settings).__name__}")
        self._given: dict[str, Any] = dict(settings)
        values: dict[str, Any] = {}
        for key in KEYS:
            if key.name in settings:
                values[key.name] = self._check(key, settings[key.name])
            elif key.default is None and key.type is str:
                raise ConfigError(key.name, "is required")
            else:
                values[key.name] = key.default
        self._check_unknown(settings, values[CONFIG_UNKNOWN_KEYS])
        if not values[CLIENT_ID]:
            # Short: it prefixes every thread name and log line. The assignor's process id is a full uuid.
            values[CLIENT_ID] = f"{values[APPLICATION_ID]}-{secrets.token_hex(3)}"
        for name, value in settings.items():
            if name.startswith(PASS_THROUGH_PREFIXES):
                values[name] = value
        if values[PROCESSING_GUARANTEE] == EXACTLY_ONCE_V2:
            self._check_exactly_once(values, settings)
        self._values = values

    @staticmethod
    def _check_unknown(settings: Mapping[str, Any], policy: str) -> None:
        unknown = {name: _closest_key(name) for name in settings
                   if name not in _BY_NAME and not str(name).startswith(PASS_THROUGH_PREFIXES + SECURITY_PREFIXES)}
        if not unknown:
            return
        if policy == "error":
            raise UnknownConfigError(unknown, "Client settings pass through under the prefixes "
                                     + ", ".join(f"'{p}'" for p in PASS_THROUGH_PREFIXES)
                                     + f"; set '{CONFIG_UNKNOWN_KEYS}': 'warn' to only log unknown keys.")
        for name, closest in unknown.items():
            if closest is None:
                log.warning("Unknown config '%s' is ignored", name)
            else:
                log.warning("Unknown config '%s' is ignored: did you mean `%s`?", name, closest)

    @staticmethod
    def _check_exactly_once(values: dict[str, Any], settings: Mapping[str, Any]) -> None:
        if COMMIT_INTERVAL_MS not in settings:
            values[COMMIT_INTERVAL_MS] = EOS_COMMIT_INTERVAL_MS
        if str(values[BOOTSTRAP_SERVERS]).startswith("memory://"):
            raise ConfigError(PROCESSING_GUARANTEE, "exactly_once_v2 needs Kafka transactions (read_committed, "
                              "abort), which the in-process memory:// broker does not model; use a Kafka cluster")
        if str(values[ACKS]) not in ("all", "-1"):
            raise ConfigError(ACKS, f"must be 'all' under exactly_once_v2 (transactions are idempotent), "
                              f"got {values[ACKS]!r}")
        if values[NUM_THREADS_PER_TASK] > 1:
            raise ConfigError(NUM_THREADS_PER_TASK, "records in flight cannot be committed atomically with their "
                              "output; use 1 under exactly_once_v2")

    @staticmethod
    def _check(key: ConfigKey, value: Any) -> Any:
        if key.deprecated:
            log.warning("Config '%s' is deprecated and ignored: %s", key.name, key.deprecated)
        expected = key.type
        # bool is an int in Python; a flag where a count is expected is a mistake.
        if expected is int and isinstance(value, bool):
            raise ConfigError(key.name, f"expected int, got bool {value!r}")
        if expected is int and isinstance(value, str) and re.fullmatch(r"\s*-?[0-9]+\s*", value):
            value = int(value)
        if expected is not object and not isinstance(value, expected):
            names = expected.__name__ if isinstance(expected, type) else " or ".join(t.__name__ for t in expected)
            raise ConfigError(key.name, f"expected {names}, got {type(value).__name__} {value!r}")
        if key.check is not None and value is not None:
            problem = key.check(value)
            if problem:
                raise ConfigError(key.name, problem)
        return value

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def with_prefix(self, prefix: str) -> dict[str, Any]:
        """The pass-through keys under ``prefix`` with the prefix removed."""
        return {k[len(prefix):]: v for k, v in self._values.items() if k.startswith(prefix)}

    def seconds(self, name: str) -> float:
        """A ``*.ms`` key converted to seconds (the one place that converts)."""
        return float(self._values[name]) / 1000.0

    def __repr__(self) -> str:
        return f"StreamsConfig({self._values!r})"


def load_handler(config: StreamsConfig, key: str) -> Any:
    """The handler named by ``key``: an instance, a class, or a ``module.Name`` dotted path.

    Raises ``ConfigError`` naming the key when it cannot be loaded or has no ``handle``.
    """
    value = config[key]
    if isinstance(value, str):
        module_name, _, attribute = value.rpartition(".")
        if not module_name:
            raise ConfigError(key, f"expected a dotted path like 'package.module.Handler', got {value!r}")
        try:
            value = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(key, f"cannot load {value!r}: {exc}") from exc
    if isinstance(value, type):
        value = value()
    if not callable(getattr(value, "handle", None)):
        raise ConfigError(key, f"{value!r} has no handle() method")
    configure = getattr(value, "configure", None)
    if callable(configure):
        configure(config)
    return value


def reference_markdown() -> str:
    """The configuration reference page (``docs/configuration.md``), made from ``KEYS``."""
    lines = [
        "# Configuration reference",
        "",
        "Every key `StreamsConfig` reads, with its default. Keys keep Kafka Streams' dotted names;",
        "`consumer.*`, `producer.*`, `admin.*` and `spark.*` keys pass through to the clients.",
        "Any other key is an error that names the closest known key (\"did you mean `task.timeout.ms`?\"),",
        "or only a logged warning with `config.unknown.keys: warn`.",
        "",
        "| key | default | meaning |",
        "|---|---|---|",
    ]
    for key in KEYS:
        default = "<tempdir>/streamloop" if key.name == STATE_DIR else key.default
        note = f" *Deprecated: {key.deprecated}.*" if key.deprecated else ""
        lines.append(f"| `{key.name}` | `{default!r}` | {key.doc}{note} |")
    return "\n".join(lines) + "\n"
