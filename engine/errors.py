"""The exceptions of the engine.

::

    StreamsError
    ├── ConfigError                  a config key has a wrong type or value (names the key)
    │   ├── StateDirectoryError      state.dir (or a file in it) is not private: another user's, writable
    │                                by group or others, or a symbolic link where a file is opened
    │   └── UnknownConfigError       a key that is not known nor passed through (names it, suggests the closest)
    ├── TopologyError                the topology cannot be built (names the node or topic)
    │   └── MissingSerdeError        a sink must write keys or values known not to be bytes (Windowed keys,
    │                                a Spark stage's rows) and no serde is given, known or set as default
    ├── IllegalStateError            a call made in a client state that does not allow it
    ├── ForwardingError              a processor forwarded what its context does not allow: a plain
    │                                Record from a process_values() processor (it could change the
    │                                key), anything from a transform_values() transformer
    ├── MissingSourceTopicError      source topics do not exist (names them)
    ├── MissingSinkTopicError        sink topics do not exist (names them)
    ├── SparkUnavailableError        a Spark stage is used without pyspark/pyarrow installed
    ├── StreamsTimeoutError          a blocking client call ran out of time (also a builtin TimeoutError)
    ├── StartupTimeoutError          a stream thread's start-up kept failing with retriable errors past
    │                                task.timeout.ms (not a TimeoutError: it ends the retries)
    ├── InternalTopicError           a repartition or changelog topic has the wrong partition count
    ├── StateStoreError              a state store cannot be opened, restored or used (names the store)
    │   └── InvalidStateStoreError   a query for a store that no local task has (yet), or a wrong kind
    ├── MissingExtraError            a feature needs an optional extra that is not installed (names it:
    │                                rocksdb, monitor, prometheus)
    ├── TaskError                    something went wrong in one task (carries task_id)
    │   ├── HandledRecordError       a record's error an exception handler was asked about (names the
    │   │   │                        handler's setting, its value and its answer)
    │   │   ├── DeserializationError a record's bytes could not be read (topic, partition, offset)
    │   │   └── ProcessingError      a user processor raised (topic, partition, offset, processor)
    │   ├── TaskTimeoutError         the task kept timing out past task.timeout.ms (not a TimeoutError:
    │   │                            it ends the retries of timeouts, it is not one of them)
    │   ├── TaskCorruptedError       exactly-once: the task's open transaction cannot commit (a timeout,
    │   │                            an aborted send); it is closed dirty, wiped and revived
    │   └── TaskMigratedError        exactly-once: another producer with the task's transactional.id
    │                                fenced this one (a zombie); close dirty and rejoin the group
    └── TransportError               a broker-side failure
        ├── AuthenticationError      the broker refused the client's login (SASL) or the TLS handshake
        │                            failed (names the mechanism); never retried, unlike a lost connection
        ├── CommitFailedError        the group moved on: the member no longer owns the partitions
        ├── RebalanceInProgressError cooperative: the group is rebalancing; the member still owns its
        │                            partitions and commits once the rebalance is over (the opposite of a
        │                            CommitFailedError, its sibling as in Kafka's clients)
        ├── ProduceError             a record could not be delivered (topic, partition)
        └── ProducerFencedError      a newer producer with the same transactional.id took over

A ``TaskError`` always has the original exception as ``__cause__``.

Some errors are deliberately *not* ``StreamsError``s, because they go where a user
processor's failure goes (the processing exception handler)::

    SerializationError               a sink's serde cannot write a record's key or value; the
                                     sink's failure on that record
    SparkBatchError                  a batch's job raised; once per record of the batch
    └── SparkSchemaError             one record's value does not fit the stage's schema=; for that
                                     record alone, before Spark is called (the rest of its batch runs)
    SparkBatchTimeoutError           a builtin ``TimeoutError``: retried under ``task.timeout.ms``

``MissingSerdeError`` is the same mistake as ``SerializationError`` found before any record
runs: when the type a sink must write is known when the client (or the test driver) is created.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streamloop.ids import TaskId


class StreamsError(Exception):
    """Base of every error the engine raises on purpose."""


class ConfigError(StreamsError, ValueError):
    """A config key has a wrong type or value."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"Invalid value for config '{key}': {message}")
        self.key = key


class StateDirectoryError(ConfigError):
    """``state.dir`` cannot hold local state safely; says what is wrong with which path and the fix.

    Checked as SSH checks a key: state is refused rather than written where another user could
    read, replace or plant files.
    """

    def __init__(self, path: str, problem: str, fix: str) -> None:
        super().__init__("state.dir", f"{path} {problem}. {fix}")
        self.path = path
        self.problem = problem


class UnknownConfigError(ConfigError):
    """Config keys that are neither known nor under a pass-through prefix.

    ``unknown`` maps each such key to the closest known key (None when none is close); ``key`` is the first.
    """

    def __init__(self, unknown: Mapping[str, str | None], hint: str) -> None:
        described = "; ".join(f"'{name}'" + (f": did you mean `{closest}`?" if closest else "")
                              for name, closest in unknown.items())
        StreamsError.__init__(self, f"Unknown config {described}. {hint}")
        self.key = next(iter(unknown))
        self.unknown = dict(unknown)


class TopologyError(StreamsError):
    """The topology is malformed (an unknown parent, a duplicate name, no source)."""


def _serde_fixes(what: str, call: str | None, origin: str = "default") -> str:
    """How to fix a sink's missing or wrong serde. ``call`` takes the sink's serdes (None: an
    internal sink, which takes the stream's); ``origin`` is where its serde came from."""
    if call is None:
        return (f"Set the config default.{what}.serde (this internal sink writes with the serdes the stream "
                "knows; no call takes its own).")
    if origin == "sink":
        return f"Pass {what}_serde= to {call} a serde that writes it."
    if origin == "stream":
        return f"Pass {what}_serde= to {call} for this sink: it replaces the stream's."
    return (f"Either pass {what}_serde= to {call} for this sink, or set the config default.{what}.serde "
            "for every sink that knows no serde.")


class MissingSerdeError(TopologyError):
    """A sink must write keys or values whose type is known not to be bytes, with no serde for them.

    Raised when the client (or the test driver) is created: the sink has no serde of its own,
    the stream knows none at that point, and ``default.key.serde``/``default.value.serde`` is not
    set. The same mistake found only at a record is a ``SerializationError``.
    """

    def __init__(self, sink: str, topic: str, what: str, kind: str, call: str | None) -> None:
        super().__init__(
            f"Sink '{sink}' (topic '{topic}') writes {what}s that are {kind}, not bytes, and has no {what} "
            f"serde: none is given to it, the stream knows none here, and default.{what}.serde is not set. "
            + _serde_fixes(what, call))
        self.sink = sink
        self.topic = topic
        self.what = what


class IllegalStateError(StreamsError, RuntimeError):
    """The call is not allowed in the client's current state."""


class ForwardingError(StreamsError, TypeError):
    """A processor called ``context.forward`` with what its context does not take (names the node).

    A ``process_values()`` processor may forward only a ``FixedKeyRecord`` (made from the record it
    got, by ``with_value``/``with_timestamp``/``with_headers``), so that the key cannot change and no
    repartition is needed; a ``transform_values()`` transformer forwards nothing (it returns the new
    value). Not sent to the processing exception handler: the processor is wrong for every record.
    """

    def __init__(self, node: str, message: str) -> None:
        super().__init__(f"Processor '{node}': {message}")
        self.node = node


class MissingSourceTopicError(StreamsError):
    def __init__(self, topics: Iterable[str]) -> None:
        self.topics = sorted(topics)
        super().__init__(
            f"Source topics {self.topics} do not exist. Create them before starting the application."
        )


class MissingSinkTopicError(StreamsError):
    def __init__(self, topics: Iterable[str]) -> None:
        self.topics = sorted(topics)
        super().__init__(
            f"Sink topics {self.topics} do not exist. Create them before starting the application."
        )


class SparkUnavailableError(StreamsError, ImportError):
    """A Spark stage is used but pyspark (or pyarrow) cannot be imported."""

    def __init__(self, what: str, module: str) -> None:
        super().__init__(f"{what} needs {module}, which is not installed: "
                         "pip install 'streamloop[spark]'")
        self.module = module


class StreamsTimeoutError(StreamsError, TimeoutError):
    """A blocking client call (close, remove_stream_thread, …) did not finish in time."""


class StartupTimeoutError(StreamsError):
    """A stream thread could not start: a start-up step (starting the admin client, the producer or
    the consumer, checking the topics) kept failing with retriable errors for ``task.timeout.ms``.
    The last error is ``__cause__``. Unlike ``StreamsTimeoutError`` it is not a ``TimeoutError``:
    it ends the retries of retriable errors, it is not one of them."""

    def __init__(self, thread: str, what: str, timeout_ms: int) -> None:
        super().__init__(f"Stream thread {thread} could not start: {what} kept failing with retriable errors "
                         f"for {timeout_ms} ms. Check that the brokers are reachable; adjust task.timeout.ms "
                         "if needed.")
        self.thread = thread
        self.what = what
        self.timeout_ms = timeout_ms


class MissingExtraError(StreamsError, ImportError):
    """A feature needs a package of an optional extra (e.g. ``monitor``) that is not installed."""

    def __init__(self, feature: str, extra: str, package: str, instead: str = "") -> None:
        """``instead``: what works without the extra, said after the install command."""
        super().__init__(f"{feature} needs the '{package}' package: pip install 'streamloop[{extra}]'"
                         + (f"; {instead}" if instead else ""))
        self.feature = feature
        self.extra = extra
        self.package = package


class TaskError(StreamsError):
    """An error inside one task; ``task_id`` names it."""

    def __init__(self, message: str, task_id: TaskId | None) -> None:
        super().__init__(message if task_id is None else f"Task {task_id}: {message}")
        self.task_id = task_id


class HandledRecordError(TaskError):
    """A record's error that an exception handler was asked about.

    After the handler answered, ``handler_setting`` is the config key that chose it
    (``default.deserialization.exception.handler`` or ``processing.exception.handler``),
    ``handler`` its class and ``answer`` what it answered; the message then ends with them,
    so that whoever reads the error learns which setting to change.
    """

    handler_setting: str | None = None
    handler: str | None = None
    answer: str | None = None

    def answered(self, setting: str, handler: str, answer: str) -> None:
        """Caller: ``ErrorHandling``, once the handler named by ``setting`` answered."""
        self.handler_setting = setting
        self.handler = handler
        self.answer = answer

    def __str__(self) -> str:
        message = super().__str__()
        if self.handler_setting is None:
            return message
        note = f". {self.handler_setting} is {self.handler}, which answered {self.answer}"
        if self.answer == "FAIL":
            note += "; a handler that answers CONTINUE skips such records, PAUSE pauses the task (docs: bad-records)"
        return message + note


class DeserializationError(HandledRecordError):
    """The key or value bytes of a fetched record could not be deserialized."""

    def __init__(
        self,
        task_id: TaskId | None,
        topic: str,
        partition: int,
        offset: int,
        what: str,
        cause: BaseException,
    ) -> None:
        super().__init__(
            f"Failed to deserialize the {what} of the record at {topic}-{partition} offset {offset}: "
            f"{type(cause).__name__}: {cause}",
            task_id,
        )
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.what = what


class ProcessingError(HandledRecordError):
    """A user processor raised while processing a record."""

    def __init__(
        self,
        task_id: TaskId | None,
        processor: str,
        topic: str | None,
        partition: int | None,
        offset: int | None,
        cause: BaseException,
    ) -> None:
        where = f" at {topic}-{partition} offset {offset}" if topic is not None else ""
        super().__init__(
            f"Processor '{processor}' failed on the record{where}: {type(cause).__name__}: {cause}",
            task_id,
        )
        self.processor = processor
        self.topic = topic
        self.partition = partition
        self.offset = offset


class TaskTimeoutError(TaskError):
    """A task did not make progress within ``task.timeout.ms``; the last timeout is ``__cause__``."""

    def __init__(self, task_id: TaskId | None, timeout_ms: int, what: str) -> None:
        if timeout_ms == 0:
            message = f"{what} timed out and task.timeout.ms is 0 (no retries)"
        else:
            message = (f"did not make progress within {timeout_ms} ms ({what} kept timing out). "
                       "Adjust task.timeout.ms if needed.")
        super().__init__(message, task_id)
        self.timeout_ms = timeout_ms
        self.what = what


class InternalTopicError(StreamsError):
    """An internal topic (repartition or changelog) exists with the wrong number of partitions."""

    def __init__(self, wrong: dict[str, tuple[int, int | None]]) -> None:
        self.topics = dict(sorted(wrong.items()))
        listed = "; ".join(f"'{t}' has {found} partitions, expected {expected}"
                           for t, (expected, found) in self.topics.items())
        super().__init__(f"Internal topics do not fit the topology: {listed}. Delete them (or reset the "
                         "application) so that they are created again, or give the source topics back "
                         "their partition count.")


class TaskCorruptedError(TaskError):
    """Exactly-once: the task's transaction must be aborted; its state is wiped and restored.

    Handled inside the stream thread (the task is revived from its last commit), never raised
    to the user, except as ``__cause__`` of a ``TaskTimeoutError`` once ``task.timeout.ms`` ran out.
    """

    def __init__(self, task_id: TaskId | None, what: str) -> None:
        super().__init__(f"is corrupted ({what}); its transaction is aborted and it restarts from its last commit",
                         task_id)
        self.what = what


class TaskMigratedError(TaskError):
    """Exactly-once: the task's producer was fenced: a newer owner of the task initialised the same
    ``transactional.id``. This member is a zombie for the task; it closes it dirty and rejoins."""

    def __init__(self, task_id: TaskId | None, what: str) -> None:
        super().__init__(f"was migrated: {what}", task_id)
        self.what = what


class StateStoreError(StreamsError):
    """A state store cannot be opened, restored or used as asked."""

    def __init__(self, store: str, message: str) -> None:
        super().__init__(f"State store '{store}': {message}")
        self.store = store


class StoreLockedError(StateStoreError):
    """The store's files are still held by the task's previous owner in this process (it is closing)."""


class BufferFullError(StreamsError):
    """A suppression buffer configured to shut down when full is full."""


class HandlerError(StreamsError):
    """An error handler raised or gave no valid answer (fatal, like the error it handled)."""


class InvalidStateStoreError(StateStoreError):
    """An interactive query names a store this client does not (currently) host, or the wrong kind."""


class TransportError(StreamsError):
    """A failure reported by the broker or the client library."""

    retriable: bool = False


class AuthenticationError(TransportError):
    """The broker refused the client's credentials, or the TLS handshake with it failed.

    ``mechanism`` is the SASL mechanism (``PLAIN``, ``SCRAM-SHA-256`` …) or ``SSL``. Raised
    when a client starts; it is not retried (unlike a ``TransportError`` for a lost connection,
    which is retried under ``task.timeout.ms``): the settings must change. The aiokafka error
    is ``__cause__``. The message never holds a password.
    """

    def __init__(self, mechanism: str, client_id: str, detail: str) -> None:
        if mechanism == "SSL":
            fix = ("Check that the listener at bootstrap.servers speaks TLS, ssl.truststore.location (the CA "
                   "that signed the broker's certificate), ssl.endpoint.identification.algorithm and "
                   "ssl.keystore.location")
            what = "the TLS handshake with the broker failed"
        else:
            fix = f"Check the username and password in sasl.jaas.config and that the broker enables {mechanism}"
            what = f"the broker refused the SASL {mechanism} login"
        super().__init__(f"Client '{client_id}': {what} ({detail}). {fix}; authentication failures are not retried.")
        self.mechanism = mechanism
        self.client_id = client_id


class CommitFailedError(TransportError):
    """The commit was refused: a rebalance gave the partitions to another member."""


class RebalanceInProgressError(TransportError):
    """Cooperative protocol: the group is rebalancing, so the commit was not sent (or the broker
    refused it); the member keeps its partitions and commits again once the rebalance is over."""

    retriable = True


class ProduceError(TransportError):
    def __init__(self, topic: str, partition: int, cause: BaseException | str) -> None:
        super().__init__(f"Failed to produce to {topic}-{partition}: {cause}")
        self.topic = topic
        self.partition = partition


class SerializationError(Exception):
    """A sink's serde could not write a record's key or value; the serde's error is ``__cause__``.

    Not a ``StreamsError``: it goes to the processing exception handler as the sink's failure
    on that record (the default handler fails the task; ``CONTINUE`` drops the record). Its
    sibling ``MissingSerdeError`` is the same mistake found before any record runs.
    """

    def __init__(self, sink: str, topic: str, what: str, value: object, serde: object, origin: str,
                 call: str | None, cause: BaseException) -> None:
        if origin == "default":
            unset = (" (bytes only, the default when the setting is not set)"
                     if type(serde).__name__ == "BytesSerde" else "")
            reason = (f"no {what} serde is given to the sink or known for the stream here, so it uses "
                      f"default.{what}.serde, {serde!r}{unset}")
        else:
            where = "given to the sink" if origin == "sink" else "the stream's, known from upstream"
            reason = f"its {what} serde is {serde!r}, {where}"
        super().__init__(f"Sink '{sink}' (topic '{topic}') cannot write a {what} of type {type(value).__name__}: "
                         f"{reason}; it raised {type(cause).__name__}: {cause}. " + _serde_fixes(what, call, origin))
        self.sink = sink
        self.topic = topic
        self.what = what


class SparkBatchError(RuntimeError):
    """A Spark batch failed; raised for each record of the batch, the job's error as ``__cause__``."""

    def __init__(self, stage: str, size: int, cause: BaseException) -> None:
        super().__init__(f"Spark stage '{stage}' failed on a batch of {size} records: "
                         f"{type(cause).__name__}: {cause}")
        self.stage = stage
        self.size = size


class SparkSchemaError(SparkBatchError):
    """A record's value does not fit the type that its Spark stage's ``schema=`` declares for a field.

    Unlike its parent, it is about one record (``topic``, ``partition``, ``offset``): the record
    is left out of its batch before Spark is called, and the rest of the batch runs. ``field``
    is the field's path (``address.city``, ``items[].sku``), ``expected`` the declared type
    (``bigint``), ``found`` the Python type of the value (``str``, or ``null``).
    """

    def __init__(self, stage: str, field: str, expected: str, found: str, topic: str | None,
                 partition: int | None, offset: int | None) -> None:
        # Not SparkBatchError.__init__: its message is about a whole batch.
        RuntimeError.__init__(
            self, f"Spark stage '{stage}': field '{field}' of the record at {topic}-{partition} offset {offset} "
                  f"is {found}, but the schema declares {expected}. Fix the record upstream, or declare the "
                  "field's type in schema= so that it fits.")
        self.stage = stage
        self.size = 1
        self.field = field
        self.expected = expected
        self.found = found
        self.topic = topic
        self.partition = partition
        self.offset = offset


class SparkBatchTimeoutError(TimeoutError):
    """A Spark batch ran past ``spark.batch.timeout.ms`` and was cancelled; its records are retried."""

    def __init__(self, stage: str, size: int, timeout_ms: int) -> None:
        super().__init__(f"Spark stage '{stage}': a batch of {size} records ran past "
                         f"spark.batch.timeout.ms ({timeout_ms} ms) and was cancelled")
        self.stage = stage
        self.size = size
        self.timeout_ms = timeout_ms


class ProducerFencedError(TransportError):
    """A newer producer initialised this producer's ``transactional.id``: this one may never write again."""
