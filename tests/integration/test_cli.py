"""``streamloop run`` as a real subprocess: graceful close on SIGTERM, exit codes."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]

APP = textwrap.dedent('''
    import asyncio
    from streamloop import KafkaStreams, StreamsBuilder
    from streamloop.serdes import IntegerSerde, JsonSerde
    from streamloop.transport import open_transport
    from streamloop.transport.base import ProducerSettings

    BOOTSTRAP = "memory://cli-test"

    async def _input(poison):
        transport = open_transport({"bootstrap.servers": BOOTSTRAP})
        admin = transport.admin("a")
        await admin.start()
        await admin.create_topics({"in": 1, "out": 1})
        await admin.close()
        producer = transport.producer(ProducerSettings("p"))
        await producer.start()
        for i in range(5):
            producer.append("in", 0, None, JsonSerde().serialize({"i": i, "poison": poison and i == 3}), None, ())
        await producer.flush()
        await producer.close()

    def check(value):
        if value["poison"]:
            raise ValueError("poison")
        # One string, one write: with PYTHONUNBUFFERED each argument of print() is a write of its
        # own, and a log line from another thread could land between them.
        print(f"processed {value['i']}", flush=True)
        return value

    def make(poison=False):
        asyncio.run(_input(poison))
        builder = StreamsBuilder()
        builder.stream("in", value_serde=JsonSerde()).map_values(check).to("out", value_serde=JsonSerde())
        return KafkaStreams(builder.build(), {"application.id": "cli", "bootstrap.servers": BOOTSTRAP,
                                              "commit.interval.ms": 100})

    def healthy():
        return make()

    def poisoned():
        return make(poison=True)

    def _print_state(new, old):
        print(f"user listener {old.name} -> {new.name}", flush=True)

    def listening():
        streams = make()
        streams.set_state_listener(_print_state)
        return streams

    def listening_poisoned():
        streams = make(poison=True)
        streams.set_state_listener(_print_state)
        return streams

    not_an_app = 42
''')


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "cli_test_app.py").write_text(APP)
    return tmp_path


def start(app_dir: Path, target: str, *options: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(app_dir), str(ROOT)])}
    return subprocess.Popen([sys.executable, "-m", "streamloop", "run", *options, target], cwd=app_dir, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def read_until(process: subprocess.Popen[str], needle: str, timeout: float = 30) -> str:
    seen = []
    deadline = time.monotonic() + timeout
    assert process.stdout is not None
    for line in process.stdout:
        seen.append(line)
        if needle in line:
            return "".join(seen)
        if time.monotonic() > deadline:
            break
    raise AssertionError(f"{needle!r} not printed within {timeout} s:\n{''.join(seen)}")


def test_sigterm_closes_gracefully_and_exits_zero(app_dir: Path) -> None:
    process = start(app_dir, "cli_test_app:healthy")
    try:
        read_until(process, "processed 4")
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0
    assert "Stopped in state NOT_RUNNING" in rest


def test_a_client_that_ends_in_error_exits_non_zero(app_dir: Path) -> None:
    process = start(app_dir, "cli_test_app:poisoned")
    try:
        output, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 1
    assert "Stopped in state ERROR" in output


def test_the_runner_keeps_the_users_state_listener(app_dir: Path) -> None:
    process = start(app_dir, "cli_test_app:listening")
    try:
        read_until(process, "user listener REBALANCING -> RUNNING")
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0
    assert "user listener PENDING_SHUTDOWN -> NOT_RUNNING" in rest


def test_a_client_with_a_user_listener_that_ends_in_error_still_exits(app_dir: Path) -> None:
    process = start(app_dir, "cli_test_app:listening_poisoned")
    try:
        output, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 1
    assert "user listener PENDING_ERROR -> ERROR" in output
    assert "Stopped in state ERROR" in output


@pytest.mark.parametrize(("target", "message"), [
    ("cli_test_app", "Expected 'package.module:attribute'"),
    ("no_such_module:app", "Cannot import module"),
    ("cli_test_app:missing", "has no attribute"),
    ("cli_test_app:not_an_app", "not a KafkaStreams"),
])
def test_a_bad_target_is_a_clear_error(app_dir: Path, target: str, message: str) -> None:
    process = start(app_dir, target)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 2
    assert message in output


# What pip's console script ``streamloop`` does: its sys.path[0] is the script's directory, not the
# current one (unlike ``python -m streamloop``).
CONSOLE_SCRIPT = "import sys\nfrom streamloop.cli import main\nsys.exit(main())\n"


def start_console_script(app_dir: Path, tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    script = tmp_path / "bin" / "streamloop"
    script.parent.mkdir(exist_ok=True)
    script.write_text(CONSOLE_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, str(script), *args], cwd=app_dir, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_run_finds_the_module_in_the_current_directory_without_pythonpath(app_dir: Path, tmp_path: Path) -> None:
    process = start_console_script(app_dir, tmp_path, "run", "cli_test_app:healthy")
    try:
        read_until(process, "processed 4")
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, rest


def test_run_finds_the_module_in_the_app_dir_given(app_dir: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    process = start_console_script(elsewhere, tmp_path, "run", "--app-dir", str(app_dir), "cli_test_app:healthy")
    try:
        read_until(process, "processed 4")
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, rest


def test_demo_runs_through_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    from streamloop.cli import main
    from streamloop.transport.memory import MemoryBroker

    MemoryBroker.reset("demo")
    try:
        # The demo's Spark stage has its own tests (tests/unit/test_demo.py); here, the command.
        assert main(["demo", "--orders", "300", "--rate", "100000", "--no-spark"]) == 0
    finally:
        MemoryBroker.reset("demo")
    assert "Check: every kept order is in the output" in capsys.readouterr().out


@pytest.mark.parametrize(("command", "options"), [
    ("demo", ["--orders", "--rate", "orders per second", "--threads", "--spark"]),
    ("run", ["--app-dir", "--close-timeout", "--log-level", "DEBUG, INFO", "--monitor", "--progress",
             "--no-progress", "--progress-interval", "--http", "--ready-max-lag"]),
])
def test_help_of_a_command_lists_its_options(command: str, options: list[str],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from streamloop.cli import main

    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])

    assert exited.value.code == 0
    help_text = capsys.readouterr().out
    assert [option for option in options if option not in help_text] == []


PROGRESS_LINE = re.compile(r"^RUNNING  in [0-9,]+/s  processed [0-9,]+/s  lag [0-9,-]+  threads 1  tasks 1$", re.M)


def test_progress_lines_are_printed_when_asked_for(app_dir: Path) -> None:
    process = start(app_dir, "cli_test_app:healthy", "--progress", "--progress-interval", "0.2")
    try:
        read_until(process, "processed 4")
        seen = read_until(process, "  tasks 1")
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    assert PROGRESS_LINE.search(seen + rest), seen + rest


def test_progress_lines_are_printed_on_a_terminal_by_default(app_dir: Path) -> None:
    main_fd, terminal_fd = pty.openpty()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(app_dir), str(ROOT)])}
    process = subprocess.Popen([sys.executable, "-m", "engine", "run", "--progress-interval", "0.2",
                                "cli_test_app:healthy"], cwd=app_dir, env=env, stdout=terminal_fd,
                               stderr=terminal_fd)
    os.close(terminal_fd)
    seen = b""
    try:
        deadline = time.monotonic() + 30
        while not PROGRESS_LINE.search(seen.decode(errors="replace").replace("\r\n", "\n")):
            assert time.monotonic() < deadline, f"no progress line within 30 s:\n{seen.decode(errors='replace')}"
            if select.select([main_fd], [], [], 1.0)[0]:
                seen += os.read(main_fd, 4096)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        process.kill()
        os.close(main_fd)





def http_get(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_run_with_http_serves_the_probes_until_it_has_closed(app_dir: Path) -> None:
    port = free_port()
    process = start(app_dir, "cli_test_app:healthy", "--http", str(port))
    try:
        seen = read_until(process, "processed 4")
        assert f"Serving health, metrics and queries at http://127.0.0.1:{port}/" in seen
        assert http_get(f"http://127.0.0.1:{port}/health/live") == (200, {"state": "RUNNING"})
        assert http_get(f"http://127.0.0.1:{port}/health/ready?max_lag=0")[0] in (200, 503)  # lag may be unmeasured
        assert http_get(f"http://127.0.0.1:{port}/health/ready") == (200, {"state": "RUNNING"})
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0
    assert "Stopped in state NOT_RUNNING" in rest


def test_run_with_http_on_a_bad_endpoint_is_a_clear_error(app_dir: Path) -> None:
    process = start(app_dir, "cli_test_app:healthy", "--http", "localhost:99999")
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 2
    assert "--http" in output and "1-65535" in output
