"""The aiomonitor console, driven for real: ``streamloop run --monitor`` as a subprocess,
a telnet client typing commands on its port, the answers read back."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamloop.testing.waiting import eventually
from tests.support.console_client import ConsoleClient
from tests.support.ports import free_ports

pytest.importorskip("aiomonitor")

ROOT = Path(__file__).resolve().parents[2]

APP = textwrap.dedent('''
    import asyncio
    from streamloop import KafkaStreams, StreamsBuilder
    from streamloop.serdes import JsonSerde
    from streamloop.transport import open_transport
    from streamloop.transport.base import ProducerSettings

    BOOTSTRAP = "memory://console-test"
    PORTS = {ports!r}
    WEBUI_PORT = {webui_port!r}

    async def _input():
        transport = open_transport({{"bootstrap.servers": BOOTSTRAP}})
        admin = transport.admin("a")
        await admin.start()
        await admin.create_topics({{"in": 2, "out": 1}})
        await admin.close()
        producer = transport.producer(ProducerSettings("p"))
        await producer.start()
        for partition in (0, 1):
            for i in range(10):
                poison = partition == 1 and i == 4
                producer.append("in", partition, None, JsonSerde().serialize({{"i": i, "poison": poison}}), None, ())
        await producer.flush()
        await producer.close()

    def check(value):
        if value["poison"]:
            raise ValueError("poison")
        return value

    def make():
        asyncio.run(_input())
        builder = StreamsBuilder()
        builder.stream("in", value_serde=JsonSerde()).map_values(check).to("out", value_serde=JsonSerde())
        return KafkaStreams(builder.build(), {{
            "application.id": "console", "bootstrap.servers": BOOTSTRAP, "commit.interval.ms": 50,
            "poll.ms": 20,
            "processing.exception.handler": "streamloop.handlers.LogAndPauseProcessingExceptionHandler",
            "monitor.port": PORTS[0], "monitor.webui.port": WEBUI_PORT, "monitor.console.port": PORTS[1],
        }})
''')




@pytest.fixture
def console_app(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int, Path]]:
    ports = free_ports(2)
    (tmp_path / "console_app.py").write_text(APP.format(ports=ports, webui_port=0))
    log = tmp_path / "app.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    with log.open("w") as out:
        process = subprocess.Popen([sys.executable, "-m", "streamloop", "run", "console_app:make", "--monitor"],
                                   cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        yield process, ports[0], log
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()


def rows(answer: str) -> list[list[str]]:
    """The table rows of an answer, split on runs of two or more spaces."""
    return [re.split(r"\s{2,}", line.strip()) for line in answer.splitlines() if line.strip()]


def test_console_commands_inspect_and_change_a_running_client(
        console_app: tuple[subprocess.Popen[str], int, Path]) -> None:
    process, port, log = console_app
    with ConsoleClient("127.0.0.1", port) as console:
        threads = console.command("threads")
        assert re.search(r"console-[0-9a-f-]+-StreamThread-1\s+RUNNING\s+0_0,0_1\s+10485760", threads), threads

        # The poison record pauses task 0_1 at offset 4; 0_0 runs through.
        paused = eventually(lambda: (answer := console.command("paused")) != "no paused tasks" and answer,
                            30, "task 0_1 paused")
        assert rows(paused)[1][0] == "0_1"
        assert rows(paused)[1][2] == "in-1 offset 4"

        tasks = {row[0]: row for row in rows(console.command("tasks"))[1:]}
        assert tasks["0_1"][3] == "paused"
        assert tasks["0_0"][3] == "running"
        assert tasks["0_0"][2] == "in-0"
        eventually(lambda: {row[0]: row for row in rows(console.command("tasks"))[1:]}["0_0"][4] == "in-0@10",
                   30, "task 0_0 committed up to offset 10")
        eventually(lambda: {row[0]: row for row in rows(console.command("tasks"))[1:]}["0_1"][5] == "6",
                   30, "the lag of the paused task (records 4..9) measured")

        assert console.command("resume 0_9") == "task 0_9 is not paused here"
        assert console.command("resume 0_1 --skip") == "resumed 0_1 after the failed record"
        eventually(lambda: console.command("paused") == "no paused tasks", 30, "0_1 running again")
        eventually(lambda: {row[0]: row for row in rows(console.command("tasks"))[1:]}["0_1"][4] == "in-1@10",
                   30, "task 0_1 committed past the skipped record")

        metrics = console.command("metrics processed")
        per_task = {row[2]: row[3] for row in rows(metrics)[1:] if row[1] == "records-processed-total"}
        assert per_task == {"task-id=0_0,thread-id=" + tasks["0_0"][1]: "10",
                            "task-id=0_1,thread-id=" + tasks["0_1"][1]: "9"}
        assert "process-rate" in console.command("metrics process-rate")

        added = console.command("add-thread")
        assert re.fullmatch(r"added console-[0-9a-f-]+-StreamThread-2", added), added
        eventually(lambda: len(rows(console.command("threads"))) == 4, 30, "two threads listed")

        removed = console.command("remove-thread")
        assert re.fullmatch(r"removed console-[0-9a-f-]+-StreamThread-\d", removed), removed

        topology = console.command("topology")
        assert topology.startswith("Topologies:\n   Sub-topology: 0")
        assert "Source: KSTREAM-SOURCE-0000000000 (topics: [in])" in topology

        # aiomonitor's own commands are still there.
        assert "tasks running" in console.command("ps")

    # A client that resets its connection leaves the console working for the next one.
    dropped = ConsoleClient("127.0.0.1", port)
    dropped._sock.sendall(b"metrics\r")
    dropped.reset()
    with ConsoleClient("127.0.0.1", port) as console:
        assert "RUNNING" in console.command("threads")
    assert "Press ENTER" not in log.read_text()
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=60) == 0, log.read_text()
    assert "Stopped in state NOT_RUNNING" in log.read_text()


def test_monitor_without_aiomonitor_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "console_app.py").write_text(APP.format(ports=[1, 2], webui_port=0))
    # A module named aiomonitor that cannot be imported hides the installed one.
    (tmp_path / "aiomonitor").mkdir()
    (tmp_path / "aiomonitor" / "__init__.py").write_text("raise ImportError('not installed')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    done = subprocess.run([sys.executable, "-m", "engine", "run", "console_app:make", "--monitor"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "pip install 'streamloop[monitor]'" in done.stderr


def test_a_console_port_in_use_is_a_clear_error_before_the_client_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        (tmp_path / "console_app.py").write_text(APP.format(ports=[port, free_ports(1)[0]], webui_port=0))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
        done = subprocess.run([sys.executable, "-m", "engine", "run", "console_app:make", "--monitor"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert f"Invalid value for config 'monitor.port': cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "Started console_app:make" not in done.stderr


def test_a_web_ui_port_in_use_is_a_clear_error_not_a_hang(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        webui = taken.getsockname()[1]
        (tmp_path / "console_app.py").write_text(APP.format(ports=free_ports(2), webui_port=webui))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
        done = subprocess.run([sys.executable, "-m", "engine", "run", "console_app:make", "--monitor"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert f"Invalid value for config 'monitor.webui.port': aiomonitor's web UI could not start on " \
           f"127.0.0.1:{webui}" in done.stderr
