"""The peers ``benchmarks/compare.py`` measures: each runs as its own process.

A peer module names itself (``NAME``), says which setting it runs each workload
with (``setting``), which version is installed (``version``), and how its process
starts (``command``); ``prepare`` fetches or builds what it needs first. Python
peers run their ``main`` in a child process (``python -m benchmarks.peers.<module>``),
so their dependencies and event loops never meet; the Kafka Streams peer runs a JVM.
"""

from __future__ import annotations

from types import ModuleType

from benchmarks.peers import aiokafka_loop, faust_streaming, kafka_streams, quixstreams_app, streamloop

PEERS: dict[str, ModuleType] = {
    "streamloop": streamloop,
    "aiokafka": aiokafka_loop,
    "faust": faust_streaming,
    "quixstreams": quixstreams_app,
    "kafka-streams": kafka_streams,
}
