"""Helpers for testing applications built on the engine.

``TopologyTestDriver`` runs a topology in the calling thread with no broker and no real
time; ``streamloop.testing.strategies`` (needs hypothesis) draws inputs and fault schedules
that the driver and ``play_on_memory_broker`` (real clients on ``memory://``) play;
``eventually``/``eventually_async`` wait on a condition with a deadline;
``create_topics``, ``produce`` and ``read`` feed and read the ``memory://`` broker's topics
through serdes, from a test or a script.
"""

from streamloop.testing.driver import TopologyTestDriver
from streamloop.testing.driver_errors import DriverTimeoutError, UnusedTopics, UnusedTopicsError
from streamloop.testing.memory_play import play_on_memory_broker
from streamloop.testing.memory_topics import create_topics, produce, read
from streamloop.testing.scenario import (
    AdvanceWallClock,
    BadRecord,
    Crash,
    Input,
    ProcessorTimeout,
    Rebalance,
    Step,
    by_key,
    inputs,
)
from streamloop.testing.topics import EmptyTopicError, TestInputTopic, TestOutputTopic, TestRecord
from streamloop.testing.waiting import eventually, eventually_async

__all__ = [
    "AdvanceWallClock",
    "BadRecord",
    "Crash",
    "DriverTimeoutError",
    "EmptyTopicError",
    "Input",
    "ProcessorTimeout",
    "Rebalance",
    "Step",
    "TestInputTopic",
    "TestOutputTopic",
    "TestRecord",
    "TopologyTestDriver",
    "UnusedTopics",
    "UnusedTopicsError",
    "by_key",
    "create_topics",
    "eventually",
    "eventually_async",
    "inputs",
    "play_on_memory_broker",
    "produce",
    "read",
]
