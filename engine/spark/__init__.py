"""Spark stages: micro-batches of a task's records handed to PySpark on worker threads.

``pyspark`` is optional (``pip install streamloop[spark]``): nothing here imports it
at module load, so ``import streamloop`` works without it. ``session`` holds the client's
lazy, shared ``SparkSession``; ``stage`` the batch processor behind
``KStream.spark_batch`` and ``KStream.to_spark``; ``sink`` the writer of the latter.

Import-light on purpose: ``row_wise`` (``parts``) only marks a function.
"""

from .parts import row_wise

__all__ = ["row_wise"]
