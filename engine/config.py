"""``StreamsConfig``: every dotted key the engine reads, with type, default and check.

Keys keep Kafka Streams' dotted names. The table below is the single source of
truth: validation, defaults and the documentation all come from it. Values are
checked once, at construction; a wrong type or value raises ``ConfigError``
naming the key. An unknown key is a ``ConfigError`` too, suggesting the closest
known key (a misspelled ``task.timeout.ms`` would otherwise be silently ignored);
``config.unknown.keys: warn`` turns that into a warning. Settings meant for the
clients pass through with the ``consumer.``, ``producer.``, ``admin.`` and
``spark.`` prefixes.

Secrets are never shown: whatever prints a value (``repr``, logs, a ``ConfigError``,
the console) asks ``shown(key, value)``, which hides the value of every key
``is_secret(key)`` names, with or without a pass-through prefix.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import ipaddress
import logging
import os
import re
import secrets
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from streamloop.errors import ConfigError, UnknownConfigError

log = logging.getLogger(__name__)

PASS_THROUGH_PREFIXES = ("consumer.", "producer.", "admin.", "spark.")

HIDDEN = "[hidden]"
# Kafka's secret settings all end so: sasl.jaas.config, ssl.key.password, ssl.keystore.password,
# sasl.oauthbearer.client.secret, ...; aiokafka's spell them sasl_plain_password, sasl_oauth_token.
_SECRET_SUFFIXES = ("password", "secret", "token", "jaas.config", "jaas_config")


def is_secret(key: str) -> bool:
    """Whether ``key`` holds a secret, by its name alone (so it covers keys added later)."""
    return key.lower().endswith(_SECRET_SUFFIXES)


def shown(key: str, value: Any) -> Any:
    """``value`` as it may be printed: ``[hidden]`` for a secret key that is set."""
    return HIDDEN if value is not None and is_secret(key) else value


def _redacted(key: str, value: Any, text: str) -> str:
    """``text`` (a message about ``value``) with the value hidden when ``key`` is secret."""
    if not is_secret(key):
        return text
    for form in (repr(value), str(value)):
        if form:
            text = text.replace(form, HIDDEN)
    return text


def is_loopback(host: str) -> bool:
    """Whether listening on ``host`` keeps a port to this machine: ``localhost`` or a loopback address.

    Any other name counts as reachable from outside, without resolving it.
    """
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def default_state_dir() -> str:
    """The per-user state directory of this platform, read from the environment when called.

    ``$XDG_STATE_HOME/streamloop`` (else ``~/.local/state/streamloop``) on Linux and other
    Unixes, ``~/Library/Application Support/streamloop`` on macOS, ``%LOCALAPPDATA%\\streamloop``
    on Windows. Never a shared place such as the temp directory: another user could create
    it first.
    """
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or os.path.join(os.path.expanduser("~"), "AppData", "Local")
    elif sys.platform == "darwin":
        base = os.path.join(os.path.expanduser("~"), "Library", "Application Support")
    else:
        xdg = os.environ.get("XDG_STATE_HOME", "")
        # The XDG spec says to ignore a relative path.
        base = xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "streamloop")


@dataclass(frozen=True, slots=True)
class ConfigKey:
    name: str
    type: type | tuple[type, ...]
    default: Any
    doc: str
    check: Callable[[Any], str | None] | None = None
    deprecated: str | None = None
    # A default read when a config is made (from the environment), and its text in the docs.
    default_factory: Callable[[], Any] | None = None
    default_doc: str | None = None


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


def _security_protocol(value: Any) -> str | None:
    # Kafka reads the protocol's name in any case.
    return _one_of(*SECURITY_PROTOCOLS)(value.upper() if isinstance(value, str) else value)


def _endpoint_identification(value: Any) -> str | None:
    if isinstance(value, str) and value.lower() in ("https", ""):
        return None
    return f"must be 'https' (check the broker's host name) or '' (do not), got {value!r}"


def _sasl_mechanism(value: Any) -> str | None:
    if value == "GSSAPI":
        return "GSSAPI (Kerberos) is not supported; use one of " + ", ".join(SASL_MECHANISMS)
    return _one_of(*SASL_MECHANISMS)(value)


def _pem_only(value: Any) -> str | None:
    if value == "PEM":
        return None
    return (f"only PEM files are read, got {value!r}; convert the store to PEM (keytool -importkeystore "
            "to PKCS12, then openssl pkcs12; see docs/security.md)")


def _secret(value: Any) -> str | None:
    # Never show the value: it holds a password.
    return None if isinstance(value, str) and value.strip() else "expected a non-empty string (value not shown)"


_ENDPOINT = re.compile(r"\[([0-9A-Fa-f:.%]+)\]:([0-9]{1,5})|([A-Za-z0-9_.%-]+):([0-9]{1,5})")


def split_endpoint(value: str) -> tuple[str, int]:
    """``host:port`` (an IPv6 host in brackets) as ``(host, port)``; ``ValueError`` saying why not."""
    match = _ENDPOINT.fullmatch(value.strip())
    port = int(match.group(2) or match.group(4)) if match else 0
    if match is None or not 0 < port < 65536:
        raise ValueError(f"expected host:port (where other instances reach this one for interactive queries, "
                         f"e.g. 'app-1.internal:8080'; a port 1-65535), got {value!r}")
    return match.group(1) or match.group(3), port


def _endpoint(value: Any) -> str | None:
    if not value.strip():
        return None  # unset: this instance publishes no endpoint
    try:
        split_endpoint(value)
    except ValueError as exc:
        return str(exc)
    return None


MEMORY_SCHEME = "memory://"
_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(:[0-9]{1,5})?")


def _opentelemetry_installed(value: Any) -> str | None:
    """Tracing on needs the OpenTelemetry API: said when the config is made, not when a task starts.
    ``find_spec`` of a top-level package looks for it without importing it."""
    if value and importlib.util.find_spec("opentelemetry") is None:
        return "needs the 'opentelemetry-api' package: pip install 'streamloop[otel]'"
    return None


def check_bootstrap_servers(value: Any) -> str | None:
    """Why ``value`` is not ``host:port[,host:port]`` nor ``memory://name``; None when it is one of them."""
    if not value.strip():
        return "must not be empty"
    if value.startswith(MEMORY_SCHEME) or all(_HOST_PORT.fullmatch(part.strip()) for part in value.split(",")):
        return None
    return (f"expected host:port[,host:port] (a Kafka cluster) or memory://name (the embedded broker), "
            f"got {value!r}")


APPLICATION_ID = "application.id"
APPLICATION_SERVER = "application.server"
BOOTSTRAP_SERVERS = "bootstrap.servers"
CLIENT_ID = "client.id"
NUM_STREAM_THREADS = "num.stream.threads"
NUM_STANDBY_REPLICAS = "num.standby.replicas"
REBALANCE_PROTOCOL = "rebalance.protocol"
COOPERATIVE = "cooperative"
EAGER = "eager"
COMMIT_INTERVAL_MS = "commit.interval.ms"
CACHE_MAX_BYTES_BUFFERING = "cache.max.bytes.buffering"
STATESTORE_UNCOMMITTED_MAX_BYTES = "statestore.uncommitted.max.bytes"
TASK_TIMEOUT_MS = "task.timeout.ms"
MAX_TASK_IDLE_MS = "max.task.idle.ms"
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
PROCESSING_RETRY_BACKOFF_MS = "processing.retry.backoff.ms"
PROCESSING_RETRY_BACKOFF_MAX_MS = "processing.retry.backoff.max.ms"
PROCESSING_RETRY_MAX_ATTEMPTS = "processing.retry.max.attempts"
PROCESSING_RETRY_EXHAUSTED_ANSWER = "processing.retry.exhausted.answer"
DEFAULT_TIMESTAMP_EXTRACTOR = "default.timestamp.extractor"
ERRORS_DEAD_LETTER_QUEUE_TOPIC_NAME = "errors.dead.letter.queue.topic.name"
DEFAULT_DSL_STORE = "default.dsl.store"
STATE_CLEANUP_DELAY_MS = "state.cleanup.delay.ms"
CONFIG_UNKNOWN_KEYS = "config.unknown.keys"
METRICS_SAMPLE_WINDOW_MS = "metrics.sample.window.ms"
METRICS_NUM_SAMPLES = "metrics.num.samples"
METRICS_PROMETHEUS_HOST = "metrics.prometheus.host"
METRICS_PROMETHEUS_PORT = "metrics.prometheus.port"
TRACING_ENABLED = "tracing.enabled"
TRACING_TRACER_PROVIDER = "tracing.tracer.provider"
MONITOR_HOST = "monitor.host"
MONITOR_PORT = "monitor.port"
MONITOR_WEBUI_PORT = "monitor.webui.port"
MONITOR_CONSOLE_PORT = "monitor.console.port"
MONITOR_TOKEN = "monitor.token"
SPARK_MASTER = "spark.master"
SPARK_BATCH_MAX_RECORDS = "spark.batch.max.records"
SPARK_BATCH_MAX_WAIT_MS = "spark.batch.max.wait.ms"
SPARK_BATCH_MAX_IN_FLIGHT = "spark.batch.max.in.flight"
SPARK_BATCH_TIMEOUT_MS = "spark.batch.timeout.ms"
SPARK_BATCH_BULK = "spark.batch.bulk"
SPARK_BATCH_MAX_BYTES = "spark.batch.max.bytes"
SPARK_BATCH_SHARED = "spark.batch.shared"
SPARK_BATCH_SHARED_MAX_MS = "spark.batch.shared.max.ms"
SPARK_BATCH_READ = "spark.batch.read"
SPARK_BATCH_READ_MAX_RECORDS = "spark.batch.read.max.records"
SPARK_BATCH_EAGER = "spark.batch.eager"
SPARK_READ_DRIVER = "driver"
SPARK_READ_EXECUTORS = "executors"
SECURITY_PROTOCOL = "security.protocol"
SASL_MECHANISM = "sasl.mechanism"
SASL_JAAS_CONFIG = "sasl.jaas.config"
SASL_LOGIN_CALLBACK_HANDLER_CLASS = "sasl.login.callback.handler.class"
SSL_TRUSTSTORE_LOCATION = "ssl.truststore.location"
SSL_TRUSTSTORE_TYPE = "ssl.truststore.type"
SSL_KEYSTORE_LOCATION = "ssl.keystore.location"
SSL_KEYSTORE_TYPE = "ssl.keystore.type"
SSL_KEY_PASSWORD = "ssl.key.password"
SSL_ENDPOINT_IDENTIFICATION_ALGORITHM = "ssl.endpoint.identification.algorithm"
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")

SECURITY_KEYS = (SECURITY_PROTOCOL, SASL_MECHANISM, SASL_JAAS_CONFIG, SASL_LOGIN_CALLBACK_HANDLER_CLASS,
                 SSL_TRUSTSTORE_LOCATION, SSL_TRUSTSTORE_TYPE, SSL_KEYSTORE_LOCATION, SSL_KEYSTORE_TYPE,
                 SSL_KEY_PASSWORD, SSL_ENDPOINT_IDENTIFICATION_ALGORITHM)
"""Kafka's security keys: unprefixed they reach every Kafka client; ``consumer.``, ``producer.``
or ``admin.`` in front overrides one for that kind of client (see streamloop.transport.kafka.security)."""
# Security settings in other clients' spelling (kafka-python/aiokafka, librdkafka): ignoring one
# would leave a cluster's TLS or login silently unconfigured, so each is an error naming Kafka's key.
_FOREIGN_SECURITY_KEYS = {
    "ssl.cafile": SSL_TRUSTSTORE_LOCATION,
    "ssl.ca.location": SSL_TRUSTSTORE_LOCATION,
    "ssl.certfile": SSL_KEYSTORE_LOCATION,
    "ssl.keyfile": SSL_KEYSTORE_LOCATION,
    "ssl.certificate.location": SSL_KEYSTORE_LOCATION,
    "ssl.key.location": SSL_KEYSTORE_LOCATION,
    "ssl.password": SSL_KEY_PASSWORD,
    "sasl.username": SASL_JAAS_CONFIG,
    "sasl.password": SASL_JAAS_CONFIG,
    "sasl.plain.username": SASL_JAAS_CONFIG,
    "sasl.plain.password": SASL_JAAS_CONFIG,
}

KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(APPLICATION_ID, str, None,
              "The consumer group and the prefix of internal topics and client ids. Required.",
              _non_empty),
    ConfigKey(APPLICATION_SERVER, str, "",
              "host:port where this instance answers interactive queries (your service's endpoint). Every "
              "instance learns the endpoints of all and which partitions of each store they own, for "
              "query_metadata_for_key() and metadata_for_all_clients(); empty: this instance publishes none.",
              _endpoint),
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
    ConfigKey(NUM_STANDBY_REPLICAS, int, 0,
              "Standby copies of each task with persistent logged stores, kept warm from their changelogs "
              "on other instances, so a failover restores only the tail.", _at_least(0)),
    ConfigKey(REBALANCE_PROTOCOL, str, COOPERATIVE,
              "cooperative: tasks that stay with a thread keep running through a rebalance and only moved "
              "tasks are closed, handed over in a follow-up rebalance (Kafka Streams' default, KIP-429); "
              "eager: every rebalance closes every task first (Kafka Streams with upgrade.from < 2.4).",
              _one_of(COOPERATIVE, EAGER)),
    ConfigKey(COMMIT_INTERVAL_MS, int, 30_000,
              "How often a stream thread commits the offsets of fully processed records "
              "(100 under exactly_once_v2 unless set).", _at_least(0)),
    ConfigKey(CACHE_MAX_BYTES_BUFFERING, int, 10 * 1024 * 1024,
              "Record cache size of the whole client, split evenly across its alive stream threads.",
              _at_least(0)),
    ConfigKey(STATESTORE_UNCOMMITTED_MAX_BYTES, int, 64 * 1024 * 1024,
              "Bytes of persistent stores' writes held until a commit covers them, for the whole client, "
              "split evenly across its alive stream threads; past it a thread commits early (KIP-892). "
              "-1: no bound.", _at_least(-1)),
    ConfigKey(TASK_TIMEOUT_MS, int, 300_000,
              "How long a task may keep timing out before it fails (KIP-572).", _at_least(0)),
    ConfigKey(MAX_TASK_IDLE_MS, int, 0,
              "How long a task with several input partitions waits for an empty partition that is "
              "behind (fetch lag > 0, or never fetched) before it goes on with the others (KIP-353, "
              "KIP-695). 0: wait only while the empty partition is behind; -1: never wait.",
              _at_least(-1)),
    ConfigKey(POLL_MS, int, 100, "How long a poll waits for records.", _at_least(0)),
    ConfigKey(MAX_POLL_RECORDS, int, 1000, "Records fetched per poll at most.", _at_least(1)),
    ConfigKey(BUFFERED_RECORDS_PER_PARTITION, int, 1000,
              "Records buffered per partition before fetching from it pauses (back-pressure). What the "
              "consumer already fetched for the partition when it pauses is buffered too, not fetched "
              "again, so a buffer may exceed this by at most one fetch (the consumer's "
              "`max.partition.fetch.bytes`, 1 MiB).",
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
    ConfigKey(STATE_DIR, str, "",
              "Directory for local state: persistent stores and checkpoints under <application.id>/<task id>/. "
              "The default is per user: $XDG_STATE_HOME/streamloop (else ~/.local/state/streamloop) on Linux, "
              "~/Library/Application Support/streamloop on macOS, %LOCALAPPDATA%\\streamloop on Windows. "
              "Directories are created 0700 and files 0600; a directory owned by another user or writable by "
              "group or others is refused. See [Operations](operations.md#security-of-the-state-directory-"
              "and-the-console).", _non_empty,
              default_factory=default_state_dir, default_doc="<per-user state directory>/streamloop"),
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
              "each key's records in order, 'unordered' keeps none. In a task with state stores, two "
              "records of one key are never in flight at once under any of them.",
              _one_of("partition", "key", "unordered")),
    ConfigKey(ERROR_SHUTDOWN_TIMEOUT_MS, int, 30_000,
              "How long a shutdown caused by the uncaught-exception handler may take.", _at_least(0)),
    ConfigKey(DEFAULT_DESERIALIZATION_EXCEPTION_HANDLER, object, "streamloop.handlers.LogAndFailExceptionHandler",
              "What to do with a record whose bytes cannot be read: a handler class, instance or dotted path."),
    ConfigKey(PROCESSING_EXCEPTION_HANDLER, object, "streamloop.handlers.LogAndFailProcessingExceptionHandler",
              "What to do when a processor raises: a handler class, instance or dotted path."),
    ConfigKey(PROCESSING_RETRY_BACKOFF_MS, int, 100,
              "Back-off before a record whose processing handler answered RETRY runs again; it doubles with "
              "each attempt, with +-20% jitter.", _at_least(1)),
    ConfigKey(PROCESSING_RETRY_BACKOFF_MAX_MS, int, 10_000,
              "The longest back-off between two attempts of a record answered RETRY; must be >= "
              "processing.retry.backoff.ms.", _at_least(1)),
    ConfigKey(PROCESSING_RETRY_MAX_ATTEMPTS, int, 5,
              "Attempts of one record, its first run included, before a RETRY answer gives way to "
              "processing.retry.exhausted.answer (1: RETRY never runs a record again).", _at_least(1)),
    ConfigKey(PROCESSING_RETRY_EXHAUSTED_ANSWER, str, "fail",
              "The answer that applies when the processing handler answers RETRY on a record's last attempt: "
              "'fail', 'continue' (with errors.dead.letter.queue.topic.name set, the record goes there) or "
              "'pause'.", _one_of("fail", "continue", "pause")),
    ConfigKey(DEFAULT_TIMESTAMP_EXTRACTOR, object, "streamloop.timestamps.FailOnInvalidTimestamp",
              "The event time of each consumed record where its source names no extractor: an extractor "
              "(extract(record, partition_time) -> ms) class, instance or dotted path."),
    ConfigKey(ERRORS_DEAD_LETTER_QUEUE_TOPIC_NAME, (str, type(None)), None,
              "Topic that receives every record an error handler was asked about (KIP-1034)."),
    ConfigKey(METRICS_SAMPLE_WINDOW_MS, int, 30_000,
              "Length of one sample window of the windowed metrics (rates, latency avg/max).", _at_least(1)),
    ConfigKey(METRICS_NUM_SAMPLES, int, 2,
              "Sample windows kept for the windowed metrics.", _at_least(1)),
    ConfigKey(METRICS_PROMETHEUS_HOST, str, "127.0.0.1",
              "Address the Prometheus endpoint listens on (extra 'prometheus'). Loopback by default; any other "
              "address serves the metrics to anyone who reaches it, without a token, and logs a WARNING.",
              _non_empty),
    ConfigKey(METRICS_PROMETHEUS_PORT, (int, type(None)), None,
              "Port of the Prometheus endpoint serving metrics() (0: any free port); none when unset."),
    ConfigKey(TRACING_ENABLED, bool, False,
              "Trace each record with OpenTelemetry (extra 'otel'): a span per record per sub-topology, "
              "its parent read from the record's W3C traceparent header, and the header written to its "
              "output. Off: OpenTelemetry is not even imported. See [Tracing](tracing.md).",
              _opentelemetry_installed),
    ConfigKey(TRACING_TRACER_PROVIDER, object, None,
              "With tracing.enabled, the OpenTelemetry TracerProvider the spans go to; OpenTelemetry's "
              "global one (trace.set_tracer_provider) when unset."),
    ConfigKey(MONITOR_HOST, str, "127.0.0.1",
              "Address the aiomonitor console and its web UI listen on (`streamloop run --monitor`). Loopback "
              "by default; any other address needs monitor.token and logs a WARNING: the console runs "
              "arbitrary code in the application's process.", _non_empty),
    ConfigKey(MONITOR_PORT, int, 20101, "Port of the aiomonitor console (telnet).", _at_least(1)),
    ConfigKey(MONITOR_WEBUI_PORT, int, 20102, "Port of aiomonitor's web UI (0: any free port).", _at_least(0)),
    ConfigKey(MONITOR_CONSOLE_PORT, int, 20103,
              "Ignored: the console's Python REPL (its `console` command) listens on a private Unix socket, "
              "not on a TCP port any local user could reach.", _at_least(1),
              deprecated="the console's REPL listens on a private Unix socket"),
    ConfigKey(MONITOR_TOKEN, (str, type(None)), None,
              "Token the console asks for before the first command, and the web UI in an "
              "`Authorization: Bearer` header or a cookie. Required when monitor.host is not a loopback "
              "address: the console runs arbitrary code. Never shown.",
              lambda value: None if value.strip() else "must not be empty (unset it for no token)"),
    ConfigKey(SPARK_MASTER, str, "local[*]",
              "Where Spark stages run: local[*] in this process, or a cluster (spark://host:7077, yarn, "
              "k8s://...). Every other spark.* key is passed to the SparkSession too.", _non_empty),
    ConfigKey(SPARK_BATCH_MAX_RECORDS, int, 40_000,
              "Records of one task per Spark batch at most, where the stage does not say (a task holds up to "
              "this times spark.batch.max.in.flight in this process).", _at_least(1)),
    ConfigKey(SPARK_BATCH_MAX_WAIT_MS, int, 1_000,
              "How long a Spark batch waits to fill before it runs anyway, where the stage does not say.",
              _at_least(0)),
    ConfigKey(SPARK_BATCH_MAX_IN_FLIGHT, int, 2,
              "Spark batches of one task running at once (on the bulk path: jobs of the stage on a stream "
              "thread, see spark.batch.shared); more records wait (back-pressure).", _at_least(1)),
    ConfigKey(SPARK_BATCH_TIMEOUT_MS, int, 120_000,
              "A Spark batch running longer is cancelled and retried as a timeout under task.timeout.ms "
              "(0: no limit).", _at_least(0)),
    ConfigKey(SPARK_BATCH_BULK, bool, True,
              "A Spark stage right after its source takes fetched records in bulk, one offset range per "
              "batch, decoded on a worker thread (false: each record in flight on its own, as a stage after "
              "other processors runs; for comparing the two)."),
    ConfigKey(SPARK_BATCH_SHARED, bool, True,
              "On the bulk path, the batches of one Spark stage from all tasks of a stream thread run in one "
              "Spark job (each task still releases and commits its own offset range); max.records, "
              "max.bytes, max.wait.ms and max.in.flight then count per job of the stage on the thread "
              "(false: each task runs its own jobs)."),
    ConfigKey(SPARK_BATCH_SHARED_MAX_MS, int, 10_000,
              "A Spark job shared by several tasks that runs longer is given up and each task's part runs on "
              "its own, so one task's slow records hold the others back at most this long; any job running "
              "longer stops counting against max.in.flight (0: never). A to_spark job, which writes as it runs, "
              "is never given up.", _at_least(0)),
    ConfigKey(SPARK_BATCH_EAGER, bool, True,
              "On the bulk path, a Spark job is sealed as soon as it holds records and the stage has no other "
              "job running (with max.in.flight above 2: fewer than max.in.flight - 1), so Spark is never idle "
              "while records wait; max.records, max.bytes and max.wait.ms still seal it sooner (false: a job "
              "waits for one of those)."),
    ConfigKey(SPARK_BATCH_MAX_BYTES, int, 0,
              "On the bulk path, a Spark job is sealed once its records' keys and values reach this many "
              "bytes, before max.records (0: no limit).", _at_least(0)),
    ConfigKey(SPARK_BATCH_READ, str, SPARK_READ_DRIVER,
              "Who reads the records of a Spark stage right after its source: driver (this process fetches, "
              "decodes and frames them) or executors (Spark's executors read each task's offset range from "
              "Kafka themselves and the records never pass through this process; needs the stage's schema=, "
              "see docs/spark.md). A stage's read= overrides it.",
              _one_of(SPARK_READ_DRIVER, SPARK_READ_EXECUTORS)),
    ConfigKey(SPARK_BATCH_READ_MAX_RECORDS, int, 250_000,
              "With read=executors, the offsets of one task's range at most, where the stage's max_records= does "
              "not say: the records never pass through this process, so spark.batch.max.records (what a batch "
              "holds here) does not bound them, and each range pays a job's fixed cost once. A range whose read "
              "runs past spark.batch.timeout.ms is retried with half its offsets, and the task's next ranges stay "
              "that small until one takes under a quarter of the timeout.", _at_least(1)),
    ConfigKey(SECURITY_PROTOCOL, str, "PLAINTEXT",
              "How every Kafka client connects: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL. This key and "
              "the sasl.* and ssl.* keys below reach the consumer, producer, admin and restore consumer; "
              "a consumer.-, producer.- or admin.-prefixed key overrides one for that client. See "
              "[Security](security.md).", _security_protocol),
    ConfigKey(SASL_MECHANISM, (str, type(None)), None,
              "SASL mechanism, required with SASL_*: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER "
              "(Kafka's default GSSAPI is not supported).", _sasl_mechanism),
    ConfigKey(SASL_JAAS_CONFIG, object, None,
              "The login of PLAIN and SCRAM: `<PlainLoginModule or ScramLoginModule> required "
              "username=\"…\" password=\"…\";` (never logged).", _secret),
    ConfigKey(SASL_LOGIN_CALLBACK_HANDLER_CLASS, object, None,
              "OAUTHBEARER's token source: an aiokafka AbstractTokenProvider (instance, class or dotted path)."),
    ConfigKey(SSL_TRUSTSTORE_LOCATION, (str, type(None)), None,
              "PEM file of the CA certificates that sign the brokers' certificates; the system's CAs "
              "when unset."),
    ConfigKey(SSL_TRUSTSTORE_TYPE, str, "PEM", "Format of the truststore: only PEM.", _pem_only),
    ConfigKey(SSL_KEYSTORE_LOCATION, (str, type(None)), None,
              "The client's own certificate, for brokers that require one (ssl.client.auth=required): "
              "a PEM file holding the certificate (chain) and its private key."),
    ConfigKey(SSL_KEYSTORE_TYPE, str, "PEM", "Format of the keystore: only PEM.", _pem_only),
    ConfigKey(SSL_KEY_PASSWORD, object, None,
              "Password of an encrypted private key in ssl.keystore.location (never logged).", _secret),
    ConfigKey(SSL_ENDPOINT_IDENTIFICATION_ALGORITHM, str, "https",
              "'https' checks that a broker's certificate names the host connected to; '' only checks "
              "that a trusted CA signed it.", _endpoint_identification),
    ConfigKey(RETRIES, int, 0,
              "Ignored: since KIP-572 task.timeout.ms bounds retries.", _at_least(0),
              deprecated="use task.timeout.ms"),
)

_BY_NAME = {key.name: key for key in KEYS}


def default(name: str) -> Any:
    """Key ``name``'s default, for code that reads a bare mapping (a test's, a stage's own settings)
    where the key may be missing: the default lives here only."""
    return _BY_NAME[name].default


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
            elif key.default_factory is not None:
                values[key.name] = key.default_factory()
            else:
                values[key.name] = key.default
        for name in settings:
            self._reject_foreign_security_key(name)
        self._check_unknown(settings, values[CONFIG_UNKNOWN_KEYS])
        if not values[CLIENT_ID]:
            # Short: it prefixes every thread name and log line. The assignor's process id is a full uuid.
            values[CLIENT_ID] = f"{values[APPLICATION_ID]}-{secrets.token_hex(3)}"
        for name, value in settings.items():
            if name.startswith(PASS_THROUGH_PREFIXES):
                values[name] = value
        if values[PROCESSING_GUARANTEE] == EXACTLY_ONCE_V2:
            self._check_exactly_once(values, settings)
        if values[PROCESSING_RETRY_BACKOFF_MAX_MS] < values[PROCESSING_RETRY_BACKOFF_MS]:
            raise ConfigError(PROCESSING_RETRY_BACKOFF_MAX_MS,
                              f"must be >= {PROCESSING_RETRY_BACKOFF_MS} ({values[PROCESSING_RETRY_BACKOFF_MS]}), "
                              f"got {values[PROCESSING_RETRY_BACKOFF_MAX_MS]}; raise it or lower "
                              f"{PROCESSING_RETRY_BACKOFF_MS}")
        self._values = values

    @staticmethod
    def _reject_foreign_security_key(name: str) -> None:
        prefix, _, rest = name.partition(".")
        unprefixed = rest if prefix in ("consumer", "producer", "admin") else name
        kafka_key = _FOREIGN_SECURITY_KEYS.get(unprefixed.replace("_", "."))
        if kafka_key is not None:
            raise ConfigError(name, f"is not a Kafka key; set {name[:len(name) - len(unprefixed)]}{kafka_key} "
                              "instead (PEM files; see docs/security.md)")

    @staticmethod
    def _check_unknown(settings: Mapping[str, Any], policy: str) -> None:
        unknown = {name: _closest_key(name) for name in settings
                   if name not in _BY_NAME and not str(name).startswith(PASS_THROUGH_PREFIXES)}
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

    @staticmethod
    def _check(key: ConfigKey, value: Any, label: str | None = None) -> Any:
        """``value`` checked (and converted) for ``key``; a ``ConfigError`` names ``label`` (the key as
        the user wrote it, e.g. with a client prefix) or the key."""
        if key.deprecated:
            log.warning("Config '%s' is deprecated and ignored: %s", key.name, key.deprecated)
        expected = key.type
        # bool is an int in Python; a flag where a count is expected is a mistake.
        if expected is int and isinstance(value, bool):
            raise ConfigError(label or key.name, f"expected int, got bool {value!r}")
        if expected is int and isinstance(value, str) and re.fullmatch(r"\s*-?[0-9]+\s*", value):
            value = int(value)
        if expected is not object and not isinstance(value, expected):
            names = expected.__name__ if isinstance(expected, type) else " or ".join(t.__name__ for t in expected)
            raise ConfigError(label or key.name,
                              f"expected {names}, got {type(value).__name__} {shown(key.name, value)!r}")
        if key.check is not None and value is not None:
            problem = key.check(value)
            if problem:
                raise ConfigError(label or key.name, _redacted(key.name, value, problem))
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

    def shown_values(self) -> dict[str, Any]:
        """Every key with the value that may be printed (``shown()``: secrets hidden)."""
        return {name: shown(name, value) for name, value in self._values.items()}

    def describe(self) -> str:
        """``StreamsConfig values:`` and one ``key = value`` line per key, secrets hidden (Kafka's log)."""
        return "StreamsConfig values:\n" + "\n".join(
            f"\t{name} = {value}" for name, value in sorted(self.shown_values().items()))

    def __repr__(self) -> str:
        return f"StreamsConfig({self.shown_values()!r})"


def check_value(name: str, value: Any, label: str) -> Any:
    """``value`` checked as the known key ``name`` though it was given as ``label`` (a prefixed
    pass-through key such as ``consumer.security.protocol``); a ``ConfigError`` names ``label``."""
    return StreamsConfig._check(_BY_NAME[name], value, label)


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
        default = key.default_doc if key.default_doc is not None else repr(key.default)
        note = f" *Deprecated: {key.deprecated}.*" if key.deprecated else ""
        lines.append(f"| `{key.name}` | `{default}` | {key.doc}{note} |")
    return "\n".join(lines) + "\n"
