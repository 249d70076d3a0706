"""streamloop: the engine under test, through its public DSL."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from benchmarks.peers.process import PeerRun, installed_version, parse_run, python_command, run_until_terminated

if TYPE_CHECKING:
    from streamloop import Topology

NAME = "streamloop"
THREADS_PER_TASK_ASYNC = 32


def version() -> str:
    return installed_version("streamloop")


def setting(workload: str) -> str:
    if workload == "async-io":
        return f"1 stream thread, num.threads.per.task={THREADS_PER_TASK_ASYNC} (partition order)"
    if workload == "count":
        return "1 stream thread, RocksDB store with changelog, record cache off (every update goes out)"
    return "1 stream thread"


def missing_feature(workload: str) -> str | None:
    """Why this engine cannot run ``workload`` yet, or None."""
    from streamloop import KStream

    if workload == "count" and not hasattr(KStream, "group_by_key"):
        return "not available: KStream.group_by_key is missing (state stores are not in this build)"
    return None


def prepare() -> None:
    pass


def command(run: PeerRun) -> list[str]:
    return python_command(__name__, run)


def topology(run: PeerRun) -> Topology:
    from benchmarks.workloads import enrich, keep, simulated_io
    from streamloop import StreamsBuilder
    from streamloop.serdes import BytesSerde, JsonSerde, StringSerde

    builder = StreamsBuilder()
    if run.workload == "stateless":
        (builder.stream(run.source, key_serde=BytesSerde(), value_serde=JsonSerde())
                .filter(lambda _key, order: keep(order))
                .map_values(enrich)
                .to(run.sink, key_serde=BytesSerde(), value_serde=JsonSerde()))
    elif run.workload == "async-io":
        (builder.stream(run.source, key_serde=BytesSerde(), value_serde=BytesSerde())
                .map_values(simulated_io)
                .to(run.sink, key_serde=BytesSerde(), value_serde=BytesSerde()))
    elif run.workload == "count":
        (builder.stream(run.source, key_serde=StringSerde(), value_serde=BytesSerde())
                .group_by_key()  # type: ignore[attr-defined]
                .count()
                .to_stream()
                .to(run.sink, key_serde=StringSerde(), value_serde=JsonSerde()))
    else:
        raise ValueError(f"unknown workload {run.workload!r}")
    return builder.build()


def main() -> None:
    from streamloop import KafkaStreams

    run = parse_run()
    config = {
        "application.id": run.app_id,
        "bootstrap.servers": run.bootstrap,
        "num.stream.threads": 1,
        "commit.interval.ms": 1000,
        "linger.ms": 5,
        "state.dir": run.workdir,
    }
    if run.workload == "async-io":
        config["num.threads.per.task"] = THREADS_PER_TASK_ASYNC
    if run.workload == "count":
        # As the Kafka Streams peer: every update goes out, none coalesced by the cache.
        config["cache.max.bytes.buffering"] = 0
    streams = KafkaStreams(topology(run), config)

    async def serve(stop: asyncio.Event) -> None:
        async with streams:
            await stop.wait()

    run_until_terminated(serve)


if __name__ == "__main__":
    main()
