"""Which Spark failures are transient: worth running the batch again under ``task.timeout.ms``.

A Spark job fails for two kinds of reasons. The cluster's: an executor or a whole worker lost
mid-job (the job aborts once a task has failed ``spark.task.maxFailures`` times that way, or a
stage keeps losing its shuffle files), the driver unable to reach an executor or the master, an
RPC that timed out, or the job cancelled through its tag when the batch ran past
``spark.batch.timeout.ms``. Running the batch again is the fix, as Kafka Streams retries a
``TimeoutException``. And the job's own: an ``AnalysisException``, a value that breaks an
expression, ``raise_error``, a bug in the user's function. Running it again gives the same error,
so those take the processing-error path at once.

``is_transient`` looks at the error and what it was raised from (``__cause__``), Python side
(py4j's connection errors) and JVM side (the text of the Java exception that pyspark carries, which
names the failure reason Spark's scheduler recorded). A stage turns a transient failure into
``SparkBatchTransientError``, a ``TimeoutError``, which the task retries in place.
"""

from __future__ import annotations

import re

# What Spark's scheduler and RPC layer write when the cluster, not the job, failed the work.
_TRANSIENT = re.compile(
    "|".join((
        r"ExecutorLostFailure",           # TaskEndReason of a task on a lost executor
        r"[Ll]ost executor",              # TaskSchedulerImpl / DAGScheduler on executor loss
        r"[Ww]orker lost",                # the master told the driver a worker is gone
        r"executor lost",
        r"FetchFailed",                   # shuffle output gone with its executor
        r"MetadataFetchFailedException",
        r"java\.net\.ConnectException",   # an executor / the master refused the connection
        r"[Cc]onnection refused",
        r"[Cc]onnection reset by peer",
        r"RpcTimeoutException",
        r"cancelled as part of cancellation of (?:all jobs with )?job tag",  # our timeout's cancel
        r"part of cancelled job tags?",
    )))
# The driver's own SparkContext is gone (the client is closing): never retried, whatever else is said.
_FINAL = re.compile(r"SparkContext (?:was shut down|is shutting down)|[Nn]o active SparkContext|"
                    r"because SparkContext was shut down")

_MAX_DEPTH = 8


def _python_transient(exc: BaseException) -> bool:
    if isinstance(exc, (ConnectionRefusedError, ConnectionResetError, ConnectionAbortedError)):
        return True
    # py4j's gateway connection (the driver's JVM) dropped or refused: py4j is optional here.
    return type(exc).__name__ in {"Py4JNetworkError"}


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error in its ``__cause__`` chain) is a Spark failure of the cluster,
    one that running the batch again may get past; ``False`` for an error of the job itself."""
    current: BaseException | None = exc
    for _ in range(_MAX_DEPTH):
        if current is None:
            return False
        if _python_transient(current):
            return True
        text = _describe(current)
        if _FINAL.search(text):
            return False
        if _TRANSIENT.search(text):
            return True
        current = current.__cause__
    return False


def _describe(exc: BaseException) -> str:
    """The error's text, with the Java exception's message where pyspark carries one.

    ``str`` of a ``Py4JJavaError`` asks the JVM, which may be gone: any failure here is no match.
    """
    try:
        return str(exc)
    except Exception:  # describing must never hide the original failure
        return type(exc).__name__


class SparkBatchTransientError(TimeoutError):
    """A Spark batch failed for a transient reason (``is_transient``); its records are retried
    under ``task.timeout.ms``, after which ``TaskTimeoutError`` (from this) goes to the
    uncaught-exception handler. The Spark error is ``__cause__``."""

    def __init__(self, stage: str, size: int, cause: BaseException) -> None:
        super().__init__(f"Spark stage '{stage}': a batch of {size} records failed for a transient reason, "
                         f"retried under task.timeout.ms: {type(cause).__name__}: {_describe(cause)[:500]}")
        self.stage = stage
        self.size = size
