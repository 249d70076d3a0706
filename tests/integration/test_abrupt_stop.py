"""A process killed with SIGKILL mid-stream loses nothing: the restarted application re-reads
from the last commit, and every input is in the output (at-least-once)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import pytest

from streamloop import StreamsBuilder
from streamloop.serdes import IntegerSerde, JsonSerde
from streamloop.testing import eventually_async
from tests.support.apps import make_streams
from tests.support.cluster import Cluster

pytestmark = [pytest.mark.kafka, pytest.mark.asyncio]

INT, JSON = IntegerSerde(), JsonSerde()
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
async def test_sigkill_mid_stream_then_restart_loses_nothing(kafka_bootstrap: str, names) -> None:
    from streamloop.transport import open_transport

    cluster = Cluster(open_transport({"bootstrap.servers": kafka_bootstrap}), kafka_bootstrap)
    source, sink = names("in"), names("out")
    await cluster.create_topics({source: 2, sink: 2})
    records = [(i, {"n": i}) for i in range(3000)]
    await cluster.produce(source, records, INT, JSON, partitions=2)
    with tempfile.TemporaryFile() as stderr:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.support.app_process", "--bootstrap", kafka_bootstrap,
            "--application-id", names.app, "--source", source, "--sink", sink,
            cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=stderr)
        try:
            seen = 0
            deadline = time.monotonic() + 90
            assert process.stdout is not None
            while seen < 1000:  # the app prints a line per record it processes
                remaining = deadline - time.monotonic()
                line = await asyncio.wait_for(process.stdout.readline(), max(remaining, 0.1)) if remaining > 0 else b""
                if not line:
                    stderr.seek(0)
                    pytest.fail(f"the app processed {seen} records, then stopped or hung:\n"
                                f"{stderr.read().decode(errors='replace')[-3000:]}")
                if json.loads(line)["event"] == "processed":
                    seen += 1
            os.kill(process.pid, signal.SIGKILL)  # no commit, no leave-group, no flush
        finally:
            if process.returncode is None:
                process.kill()
            await process.wait()

    builder = StreamsBuilder()
    (builder.stream(source, key_serde=INT, value_serde=JSON)
            .map_values(lambda value: {"n": value["n"]})
            .to(sink, key_serde=INT, value_serde=JSON))
    # The dead member is still in the group until its session times out (10 s in these tests).
    async with make_streams(builder.build(), kafka_bootstrap, names.app):
        async def complete() -> bool:
            out = {JSON.deserialize(r.value)["n"] for r in await cluster.read_all(sink)}
            return out >= {v["n"] for _, v in records}

        await eventually_async(complete, 90, "every input record in the output after the restart")
