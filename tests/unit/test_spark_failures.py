"""``streamloop.spark.failures.is_transient``: the cluster's failures are retried, the job's are not."""

from __future__ import annotations

import pytest

from streamloop.spark.failures import SparkBatchTransientError, is_transient
from streamloop.tasks.timeouts import is_timeout


class JavaSide(Exception):
    """Stands for a pyspark ``CapturedException`` / ``Py4JJavaError``: its text is the JVM's."""


class Py4JNetworkError(Exception):
    pass


@pytest.mark.parametrize("text", [
    "Job aborted due to stage failure: Task 1 in stage 3.0 failed 4 times, most recent failure: Lost task 1.3 "
    "in stage 3.0 (TID 9) (127.0.0.1 executor 1): ExecutorLostFailure (executor 1 exited caused by one of the "
    "running tasks) Reason: Command exited with code 137",
    "Job aborted due to stage failure: ResultStage 4 has failed the maximum allowable number of times: 4. "
    "Most recent failure reason: org.apache.spark.shuffle.FetchFailedException: Failed to connect",
    "Lost executor 0 on 127.0.0.1: worker lost: 127.0.0.1:29408 got disassociated",
    "java.net.ConnectException: Connection refused: /127.0.0.1:7077",
    "org.apache.spark.rpc.RpcTimeoutException: Futures timed out after [120 seconds]",
    "Job 7 cancelled as part of cancellation of all jobs with job tag streamloop-app-0_1-enrich-3",
])
def test_the_clusters_failures_are_transient(text: str) -> None:
    assert is_transient(JavaSide(text))
    assert not is_transient(RuntimeError("wrapped"))
    wrapped = RuntimeError("the batch failed")
    wrapped.__cause__ = JavaSide(text)
    assert is_transient(wrapped)


@pytest.mark.parametrize("exc", [
    JavaSide("[USER_RAISED_EXCEPTION] order 7 is bad SQLSTATE: P0001"),
    JavaSide("[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column named `tierr` cannot be resolved"),
    JavaSide("Job aborted due to stage failure: Task 0 in stage 1.0 failed 4 times, most recent failure: "
             "java.lang.ArithmeticException: / by zero"),
    JavaSide("Job 3 cancelled because SparkContext was shut down (lost executor 1)"),
    ValueError("a bug in the stage's function"),
    KeyError("tier"),
])
def test_the_jobs_own_errors_and_a_closing_client_are_not(exc: BaseException) -> None:
    assert not is_transient(exc)


def test_py4j_losing_the_gateway_is_transient() -> None:
    assert is_transient(Py4JNetworkError("An error occurred while trying to connect to the Java server"))
    assert is_transient(ConnectionRefusedError(111, "Connection refused"))


def test_an_error_whose_text_cannot_be_read_is_not_transient() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("the JVM is gone")

    assert not is_transient(Unprintable())


def test_the_transient_error_is_a_timeout_the_task_retries() -> None:
    cause = JavaSide("ExecutorLostFailure (executor 1 exited)")
    error = SparkBatchTransientError("enrich", 10, cause)
    assert isinstance(error, TimeoutError) and is_timeout(error)
    assert "enrich" in str(error) and "ExecutorLostFailure" in str(error)
