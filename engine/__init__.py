"""streamloop: Kafka Streams semantics for Python, on asyncio.

The public API, re-exported by name.
"""

from engine.client import ClientState, KafkaStreams, Metric
from engine.config import StreamsConfig
from engine.errors import (
    CommitFailedError,
    ConfigError,
    DeserializationError,
    IllegalStateError,
    MissingExtraError,
    MissingSinkTopicError,
    MissingSourceTopicError,
    ProcessingError,
    ProduceError,
    StreamsError,
    StreamsTimeoutError,
    TaskError,
    TopologyError,
    TransportError,
)
from engine.processors.api import BaseProcessor, Processor, ProcessorContext, PunctuationType
from engine.records import Record, TopicPartition
from engine.tasks.task_id import TaskId
from engine.threads.stream_thread import StreamThreadState, TaskDetails, TaskMetadata, TaskRunState, ThreadMetadata
from engine.topology.builder import BranchedKStream, KStream, StreamsBuilder
from engine.topology.topology import Topology

__all__ = [
    "BaseProcessor",
    "BranchedKStream",
    "ClientState",
    "CommitFailedError",
    "ConfigError",
    "DeserializationError",
    "IllegalStateError",
    "KStream",
    "KafkaStreams",
    "Metric",
    "MissingExtraError",
    "MissingSinkTopicError",
    "MissingSourceTopicError",
    "ProcessingError",
    "ProduceError",
    "Processor",
    "ProcessorContext",
    "PunctuationType",
    "Record",
    "StreamThreadState",
    "StreamsBuilder",
    "StreamsConfig",
    "StreamsError",
    "StreamsTimeoutError",
    "TaskError",
    "TaskDetails",
    "TaskId",
    "TaskMetadata",
    "TaskRunState",
    "ThreadMetadata",
    "TopicPartition",
    "Topology",
    "TopologyError",
    "TransportError",
]
