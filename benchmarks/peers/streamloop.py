"""streamloop: the engine under test, through its public DSL."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from benchmarks.dsl_workloads import DSL_WORKLOADS
from benchmarks.peers.process import PeerRun, installed_version, parse_run, python_command, run_until_terminated

if TYPE_CHECKING:
    from streamloop import StreamsBuilder, Topology

NAME = "streamloop"
THREADS_PER_TASK_ASYNC = 32


def version() -> str:
    return installed_version("streamloop")


def setting(workload: str) -> str:
    if workload == "async-io":
        return f"1 stream thread, num.threads.per.task={THREADS_PER_TASK_ASYNC} (partition order)"
    if workload == "count":
        return "1 stream thread, RocksDB store with changelog, record cache off (every update goes out)"
    if workload in DSL_WORKLOADS:
        from benchmarks.dsl_workloads import parameters

        grace = f", grace {parameters()['join.grace.ms'] // 1000} s" if workload == "join" else ""
        return "1 stream thread, RocksDB stores with changelogs, record cache off" + grace
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
    elif run.workload in DSL_WORKLOADS:
        dsl_topology(builder, run)
    else:
        raise ValueError(f"unknown workload {run.workload!r}")
    return builder.build()


def dsl_topology(builder: StreamsBuilder, run: PeerRun) -> None:
    """The DSL workloads (benchmarks/dsl_workloads.py), as StreamsBench.java writes them."""
    from benchmarks import dsl_workloads as dsl
    from streamloop import BufferConfig, JoinWindows, SessionWindows, Suppressed, TimeWindows
    from streamloop.serdes import BytesSerde, JsonSerde, StringSerde

    sources = run.source.split(",")
    text, json = StringSerde(), JsonSerde()
    if run.workload == "join":
        orders = builder.stream(sources[0], key_serde=text, value_serde=json)
        payments = builder.stream(sources[1], key_serde=text, value_serde=json)
        windows = JoinWindows.of_time_difference_and_grace(dsl.JOIN_WINDOW_MS, dsl.parameters()["join.grace.ms"])
        orders.join(payments, dsl.paid, windows).to(run.sink, key_serde=text, value_serde=json)
    elif run.workload == "suppress":
        (builder.stream(sources[0], key_serde=text, value_serde=BytesSerde())
                .group_by_key()
                .windowed_by(TimeWindows.of_size_with_no_grace(dsl.SUPPRESS_WINDOW_MS))
                .count()
                .suppress(Suppressed.until_window_closes(BufferConfig.unbounded()))
                .to_stream()
                .map(lambda window, n: (dsl.window_key(window.key, window.start), n))
                .to(run.sink, key_serde=text, value_serde=json))
    elif run.workload == "session":
        (builder.stream(sources[0], key_serde=text, value_serde=BytesSerde())
                .group_by_key()
                .windowed_by(SessionWindows.of_inactivity_gap_with_no_grace(dsl.SESSION_GAP_MS))
                .count()
                .to_stream()
                .map(lambda session, n: (dsl.session_key(session.key, session.start, session.end), n))
                .to(run.sink, key_serde=text, value_serde=json))
    elif run.workload in ("table-join", "fk-join"):
        orders_table = builder.table(sources[0], key_serde=text, value_serde=json)
        customers = builder.table(sources[1], key_serde=text, value_serde=json)
        # Neither join is materialized, as in StreamsBench.java: each result goes on unstored.
        joined = (orders_table.join(customers, dsl.enriched) if run.workload == "table-join"
                  else orders_table.join(customers, dsl.customer_of, dsl.enriched))
        joined.to_stream().to(run.sink, key_serde=text, value_serde=json)
    else:
        raise ValueError(f"unknown workload {run.workload!r}")


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
    if run.workload == "count" or run.workload in DSL_WORKLOADS:
        # As the Kafka Streams peer: every update goes out, none coalesced by the cache.
        config["cache.max.bytes.buffering"] = 0
    streams = KafkaStreams(topology(run), config)

    async def serve(stop: asyncio.Event) -> None:
        async with streams:
            await stop.wait()

    run_until_terminated(serve)


if __name__ == "__main__":
    main()
