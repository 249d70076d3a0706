"""faust-streaming: one worker process with one agent (a table for ``count``)."""

from __future__ import annotations

from benchmarks.peers.process import PeerRun, installed_version, parse_run, python_command

NAME = "faust-streaming"
# The same number of records in flight as streamloop's 4 tasks x 32 (agent actors share the input).
CONCURRENCY_ASYNC = 128


def version() -> str:
    return installed_version("faust-streaming")


def setting(workload: str) -> str:
    if workload == "async-io":
        return f"agent concurrency={CONCURRENCY_ASYNC} (output not in order)"
    if workload == "count":
        return "agent + in-memory Table with changelog"
    return "one agent"


def missing_feature(workload: str) -> str | None:
    from benchmarks.dsl_workloads import not_available

    return not_available(workload)


def prepare() -> None:
    pass


def command(run: PeerRun) -> list[str]:
    return python_command(__name__, run)


def main() -> None:
    import faust
    import orjson

    from benchmarks.workloads import PARTITIONS, enrich, keep, simulated_io

    run = parse_run()
    app = faust.App(
        run.app_id,
        broker=f"kafka://{run.bootstrap}",
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=False,
        topic_disable_leader=True,
        consumer_auto_offset_reset="earliest",
        datadir=run.workdir,
        broker_commit_interval=1.0,
        producer_linger_ms=5,
    )
    source = app.topic(run.source, key_type=bytes, value_type=bytes, partitions=PARTITIONS)
    sink = app.topic(run.sink, key_type=bytes, value_type=bytes, partitions=PARTITIONS)

    if run.workload == "stateless":
        @app.agent(source)
        async def stateless(stream):  # type: ignore[no-untyped-def]
            async for key, value in stream.items():
                order = orjson.loads(value)
                if keep(order):
                    await sink.send(key=key, value=orjson.dumps(enrich(order)))
    elif run.workload == "async-io":
        @app.agent(source, concurrency=CONCURRENCY_ASYNC)
        async def async_io(stream):  # type: ignore[no-untyped-def]
            async for key, value in stream.items():
                await sink.send(key=key, value=await simulated_io(value))
    elif run.workload == "count":
        counts = app.Table("counts", default=int, partitions=PARTITIONS, key_type=bytes, value_type=int)

        @app.agent(source)
        async def count(stream):  # type: ignore[no-untyped-def]
            async for key, _value in stream.items():
                counts[key] += 1
                await sink.send(key=key, value=b"%d" % counts[key])
    else:
        raise ValueError(f"unknown workload {run.workload!r}")

    faust.Worker(app, loglevel="WARNING", quiet=True, workdir=run.workdir).execute_from_commandline()


if __name__ == "__main__":
    main()
