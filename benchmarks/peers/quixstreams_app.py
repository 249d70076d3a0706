"""quixstreams: one Application with a StreamingDataFrame (state for ``count``)."""

from __future__ import annotations

import time

from benchmarks.peers.process import PeerRun, installed_version, parse_run, python_command

NAME = "quixstreams"


def version() -> str:
    return installed_version("quixstreams")


def setting(workload: str) -> str:
    if workload == "async-io":
        return "one process; no async processors: the 5 ms block the loop"
    if workload == "count":
        return "stateful apply, RocksDB state with changelog"
    return "one process"


def missing_feature(workload: str) -> str | None:
    from benchmarks.dsl_workloads import not_available

    return not_available(workload)


def prepare() -> None:
    pass


def command(run: PeerRun) -> list[str]:
    return python_command(__name__, run)


def count(_value: object, state) -> int:  # type: ignore[no-untyped-def]
    n = state.get("n", 0) + 1
    state.set("n", n)
    return n


def wait_io(value: bytes) -> bytes:
    time.sleep(0.005)  # quixstreams calls processors synchronously
    return value


def main() -> None:
    from quixstreams import Application

    from benchmarks.workloads import enrich, keep

    run = parse_run()
    app = Application(
        broker_address=run.bootstrap,
        consumer_group=run.app_id,
        auto_offset_reset="earliest",
        commit_interval=1.0,
        state_dir=run.workdir,
        loglevel="WARNING",
        producer_extra_config={"linger.ms": 5},
    )
    if run.workload == "stateless":
        source = app.topic(run.source, key_deserializer="bytes", value_deserializer="json")
        sink = app.topic(run.sink, key_serializer="bytes", value_serializer="json")
        sdf = app.dataframe(source)
        sdf = sdf.filter(keep).apply(enrich)
    elif run.workload == "async-io":
        source = app.topic(run.source, key_deserializer="bytes", value_deserializer="bytes")
        sink = app.topic(run.sink, key_serializer="bytes", value_serializer="bytes")
        sdf = app.dataframe(source).apply(wait_io)
    elif run.workload == "count":
        source = app.topic(run.source, key_deserializer="bytes", value_deserializer="bytes")
        sink = app.topic(run.sink, key_serializer="bytes", value_serializer="json")
        sdf = app.dataframe(source).apply(count, stateful=True)
    else:
        raise ValueError(f"unknown workload {run.workload!r}")
    sdf.to_topic(sink)
    app.run()  # stops on SIGTERM/SIGINT


if __name__ == "__main__":
    main()
