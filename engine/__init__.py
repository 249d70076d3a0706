"""streamloop: Kafka Streams semantics for Python, on anyio (its asyncio backend).

The public API, re-exported by name.
"""

from engine.client import ClientState, KafkaStreams, Metric
from engine.config import StreamsConfig
from engine.errors import (
    AuthenticationError,
    BufferFullError,
    CommitFailedError,
    ConfigError,
    DeserializationError,
    HandledRecordError,
    HandlerError,
    IllegalStateError,
    InternalTopicError,
    InvalidStateStoreError,
    MissingExtraError,
    MissingSerdeError,
    MissingSinkTopicError,
    MissingSourceTopicError,
    ProcessingError,
    ProduceError,
    ProducerFencedError,
    RebalanceInProgressError,
    SerializationError,
    SparkUnavailableError,
    StartupTimeoutError,
    StateDirectoryError,
    StateStoreError,
    StoreLockedError,
    StreamsError,
    StreamsTimeoutError,
    TaskCorruptedError,
    TaskError,
    TaskMigratedError,
    TaskTimeoutError,
    TopologyError,
    TransportError,
    UnknownConfigError,
)
from engine.health import HealthResult
from engine.ids import TaskId
from engine.processors.api import BaseProcessor, Processor, ProcessorContext, PunctuationType
from engine.records import Record, TopicPartition
from engine.state import JoinWindows, Materialized, SessionWindows, SlidingWindows, Stores, TimeWindows, Windowed
from engine.state.metadata import HostInfo, KeyQueryMetadata, StreamsMetadata
from engine.state.timestamped import ValueAndTimestamp
from engine.state.versioned import VersionedRecord
from engine.threads.stream_thread import StreamThreadState, TaskDetails, TaskMetadata, TaskRunState, ThreadMetadata
from engine.timestamps import (
    ConsumedRecord,
    FailOnInvalidTimestamp,
    InvalidTimestampError,
    LogAndSkipOnInvalidTimestamp,
    TimestampExtractor,
    UsePartitionTimeOnInvalidTimestamp,
    WallclockTimestampExtractor,
)
from engine.topology.branches import BranchedKStream
from engine.topology.builder import KStream, StreamsBuilder
from engine.topology.global_tables import GlobalKTable
from engine.topology.grouped_table import KGroupedTable
from engine.topology.joins import StreamJoined
from engine.topology.repartition import Repartitioned
from engine.topology.suppressed import BufferConfig, Suppressed
from engine.topology.tables import KGroupedStream, KTable, TimeWindowedKStream
from engine.topology.topology import Topology
from engine.topology.windowed_streams import SessionWindowedKStream, SlidingWindowedKStream

__all__ = [
    "AuthenticationError",
    "BaseProcessor",
    "BranchedKStream",
    "BufferConfig",
    "BufferFullError",
    "ClientState",
    "CommitFailedError",
    "ConfigError",
    "ConsumedRecord",
    "DeserializationError",
    "FailOnInvalidTimestamp",
    "GlobalKTable",
    "HandledRecordError",
    "HandlerError",
    "HealthResult",
    "HostInfo",
    "IllegalStateError",
    "InternalTopicError",
    "InvalidStateStoreError",
    "InvalidTimestampError",
    "JoinWindows",
    "KGroupedStream",
    "KGroupedTable",
    "KStream",
    "KTable",
    "KafkaStreams",
    "KeyQueryMetadata",
    "LogAndSkipOnInvalidTimestamp",
    "Materialized",
    "Metric",
    "MissingExtraError",
    "MissingSerdeError",
    "MissingSinkTopicError",
    "MissingSourceTopicError",
    "ProcessingError",
    "Processor",
    "ProcessorContext",
    "ProduceError",
    "ProducerFencedError",
    "PunctuationType",
    "RebalanceInProgressError",
    "Record",
    "Repartitioned",
    "SerializationError",
    "SessionWindowedKStream",
    "SessionWindows",
    "SlidingWindowedKStream",
    "SlidingWindows",
    "SparkUnavailableError",
    "StartupTimeoutError",
    "StateDirectoryError",
    "StateStoreError",
    "StoreLockedError",
    "Stores",
    "StreamJoined",
    "StreamThreadState",
    "StreamsBuilder",
    "StreamsConfig",
    "StreamsError",
    "StreamsMetadata",
    "StreamsTimeoutError",
    "Suppressed",
    "TaskCorruptedError",
    "TaskDetails",
    "TaskError",
    "TaskId",
    "TaskMetadata",
    "TaskMigratedError",
    "TaskRunState",
    "TaskTimeoutError",
    "ThreadMetadata",
    "TimeWindowedKStream",
    "TimeWindows",
    "TimestampExtractor",
    "TopicPartition",
    "Topology",
    "TopologyError",
    "TransportError",
    "UnknownConfigError",
    "UsePartitionTimeOnInvalidTimestamp",
    "ValueAndTimestamp",
    "VersionedRecord",
    "WallclockTimestampExtractor",
    "Windowed",
]
