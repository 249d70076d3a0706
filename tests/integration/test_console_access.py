"""The guarded console, over real sockets: loopback by default, the token asked for before the first
command, the web UI behind the token and refusing cross-site changes, the Prometheus endpoint's address."""

from __future__ import annotations

import asyncio
import http.client
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from streamloop.client import KafkaStreams
from streamloop.errors import ConfigError
from streamloop.testing.waiting import eventually
from streamloop.topology.builder import StreamsBuilder
from tests.support.console_client import ConsoleClient
from tests.support.ports import free_ports

pytest.importorskip("aiomonitor")
pytest.importorskip("prometheus_client")

from streamloop.console.monitor import StreamsMonitor, open_monitor
from streamloop.prometheus import PrometheusExporter

# aiomonitor's web UI keys its app with a string, which aiohttp warns about (an error under our filters).
pytestmark = pytest.mark.filterwarnings("ignore:It is recommended to use web.AppKey")

TOKEN = "t0ken-0f-the-c0nsole"
LOOPBACK = "127.0.0.1"




def outside_address() -> str:
    """An address of this machine that is not loopback (no packet is sent), or skip."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))
            address: str = probe.getsockname()[0]
        except OSError:
            pytest.skip("no network interface besides loopback")
    if address.startswith("127."):
        pytest.skip("no network interface besides loopback")
    return address


def outside_address_or_none() -> str | None:
    try:
        return outside_address()
    except pytest.skip.Exception:
        return None


def reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=5):
            return True
    except OSError:
        return False


@pytest.fixture
def open_console() -> Iterator[Callable[..., StreamsMonitor]]:
    """Opens the console of a (not started) client in this process, watching a loop that runs on a
    thread of its own (as the runner's loop does)."""
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, name="monitored-loop", daemon=True)
    runner.start()
    opened: list[StreamsMonitor] = []

    def open_(**settings: Any) -> StreamsMonitor:
        telnet, webui, repl = free_ports(3)
        builder = StreamsBuilder()
        builder.stream("in").to("out")
        streams = KafkaStreams(builder.build(), {
            "application.id": "console-access", "bootstrap.servers": "memory://console-access",
            "monitor.port": telnet, "monitor.webui.port": webui, "monitor.console.port": repl, **settings})
        monitor = open_monitor(streams, loop)
        opened.append(monitor)
        return monitor

    yield open_
    for monitor in opened:
        monitor.close()
    loop.call_soon_threadsafe(loop.stop)
    runner.join(timeout=10)
    loop.close()


def request(monitor: StreamsMonitor, method: str, path: str, headers: dict[str, str] | None = None,
            body: str | None = None) -> http.client.HTTPResponse:
    assert monitor.webui_address is not None
    connection = http.client.HTTPConnection(LOOPBACK, monitor.webui_address[1], timeout=10)
    all_headers = {"Content-Type": "application/x-www-form-urlencoded", **(headers or {})} if body else headers
    connection.request(method, path, body=body, headers=all_headers or {})
    response = connection.getresponse()
    response.read()
    connection.close()
    return response


# -- the telnet console ------------------------------------------------------------------------


def test_the_console_asks_for_the_token_before_the_first_command(open_console) -> None:
    monitor = open_console(**{"monitor.token": TOKEN})
    with ConsoleClient(LOOPBACK, monitor.port, token=TOKEN) as console:
        shown = console.command("config monitor.token")
        assert "[hidden]" in shown
        assert "console-access" in console.command("config application.id")
        assert TOKEN not in console.text  # neither echoed at the prompt nor shown by config


@pytest.mark.parametrize("typed", ["not-the-token", "threads", ""])
def test_anything_but_the_token_closes_the_console_connection(open_console, typed: str,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    monitor = open_console(**{"monitor.token": TOKEN})
    with ConsoleClient(LOOPBACK, monitor.port, prompt="token:") as console:
        console.type_line(typed)
        console.wait_closed()
    assert "wrong token" in console.text
    assert "streamloop >>>" not in console.text
    eventually(lambda: any("Refused a console session" in r.getMessage() for r in caplog.records), 10,
               "the refusal logged")


def test_without_a_token_the_console_opens_at_once_on_loopback(open_console) -> None:
    monitor = open_console()
    with ConsoleClient(LOOPBACK, monitor.port) as console:
        assert "token:" not in console.text
        assert "monitor.token" in console.command("config monitor")


def test_the_console_and_web_ui_listen_on_loopback_by_default(open_console) -> None:
    outside = outside_address()
    monitor = open_console()
    assert monitor.webui_address is not None
    with ConsoleClient(LOOPBACK, monitor.port) as console:  # (a bare connect and close leaks a socket
        assert "streamloop >>>" in console.text          # in prompt_toolkit's telnet server)
    assert request(monitor, "GET", "/").status == 200
    for port in (monitor.port, monitor.webui_address[1]):
        assert not reachable(outside, port), f"port {port} answers on {outside}"


def test_off_loopback_without_a_token_is_refused_before_listening(open_console) -> None:
    with pytest.raises(ConfigError, match=r"Invalid value for config 'monitor.token': must be set for the console "
                                          r"to listen on 0.0.0.0"):
        open_console(**{"monitor.host": "0.0.0.0"})


def test_off_loopback_with_a_token_warns_and_still_asks_for_it(open_console,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="streamloop.console"):
        monitor = open_console(**{"monitor.host": "0.0.0.0", "monitor.token": TOKEN})
    assert any(r.levelno == logging.WARNING and "runs arbitrary code" in r.getMessage() for r in caplog.records)
    with ConsoleClient(LOOPBACK, monitor.port, token=TOKEN) as console:
        assert "RUNNING" not in console.command("threads")  # the client is not started: CREATED
    assert request(monitor, "GET", "/").status == 401


def test_the_python_repl_listens_on_no_port_and_shows_the_config_without_secrets(open_console) -> None:
    monitor = open_console(**{"monitor.host": "0.0.0.0", "monitor.token": TOKEN})
    repl_port = monitor.streams.config["monitor.console.port"]
    with ConsoleClient(LOOPBACK, monitor.port, token=TOKEN) as console:
        start = len(console.text)
        console.type_line("console")
        console.wait_for("asyncio event loop", start)  # aioconsole's banner: the REPL is up
        assert not reachable(LOOPBACK, repl_port), "the REPL listens on a TCP port"
        assert not reachable(outside_address_or_none() or LOOPBACK, repl_port)
        start = len(console.text)
        console.type_line('config["monitor.token"], repr(streams.config).count("[hidden]"), 6 * 7')
        console.wait_for("('[hidden]', 1, 42)", start)
        start = len(console.text)
        console.type_line("\x04")  # Ctrl+D leaves the REPL, not the console
        console.wait_for("The Python REPL is closed.", start)
        assert "client" in console.command("threads")
    assert TOKEN not in console.text


# -- the web UI --------------------------------------------------------------------------------


def test_the_web_ui_wants_the_token(open_console) -> None:
    monitor = open_console(**{"monitor.token": TOKEN})
    assert request(monitor, "GET", "/").status == 401
    assert request(monitor, "GET", "/", {"Authorization": "Bearer wrong"}).status == 401
    assert request(monitor, "GET", "/", {"Authorization": f"Bearer {TOKEN}"}).status == 200
    assert request(monitor, "DELETE", "/api/task?task_id=1").status == 401
    assert request(monitor, "POST", "/api/live-tasks", body="filter=").status == 401
    assert request(monitor, "POST", "/api/live-tasks", {"Authorization": f"Bearer {TOKEN}"},
                   body="filter=").status == 200


def test_the_token_in_the_address_is_traded_for_a_same_site_cookie(open_console) -> None:
    monitor = open_console(**{"monitor.token": TOKEN})
    assert request(monitor, "GET", "/?token=wrong").status == 401
    login = request(monitor, "GET", "/?token=" + TOKEN + "&task_type=running")
    assert login.status == 303
    assert login.headers["Location"] == "/?task_type=running"
    cookie = login.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    name_value = cookie.split(";")[0]
    assert request(monitor, "GET", "/", {"Cookie": name_value}).status == 200
    assert request(monitor, "POST", "/api/live-tasks", {"Cookie": name_value}, body="filter=").status == 200


@pytest.mark.parametrize("token", [TOKEN, None])
@pytest.mark.parametrize("headers", [{"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"},
                                     {"Sec-Fetch-Site": "same-site"}])
def test_cross_site_changes_are_refused_even_with_the_token(open_console, token: str | None,
                                                            headers: dict[str, str]) -> None:
    monitor = open_console(**({"monitor.token": token} if token else {}))
    auth = {"Authorization": f"Bearer {TOKEN}"} if token else {}
    assert request(monitor, "DELETE", "/api/task?task_id=1", {**auth, **headers}).status == 403
    assert request(monitor, "POST", "/api/live-tasks", {**auth, **headers}, body="filter=").status == 403
    assert monitor.webui_address is not None
    same_origin = {"Origin": f"http://{LOOPBACK}:{monitor.webui_address[1]}", "Sec-Fetch-Site": "same-origin"}
    assert request(monitor, "POST", "/api/live-tasks", {**auth, **same_origin}, body="filter=").status == 200


def test_without_a_token_only_a_loopback_host_is_answered(open_console) -> None:
    """A page that rebinds its own name to 127.0.0.1 reaches the port, but with its own Host."""
    monitor = open_console()
    assert request(monitor, "GET", "/").status == 200
    assert request(monitor, "GET", "/", {"Host": "localhost"}).status == 200
    assert request(monitor, "GET", "/", {"Host": "evil.example"}).status == 421
    assert request(monitor, "POST", "/api/live-tasks", {"Host": "evil.example"}, body="filter=").status == 421


# -- the Prometheus endpoint ---------------------------------------------------------------------


def test_the_prometheus_endpoint_listens_on_loopback_by_default(caplog: pytest.LogCaptureFixture) -> None:
    outside = outside_address()
    from streamloop.config import METRICS_PROMETHEUS_HOST, StreamsConfig

    host = StreamsConfig({"application.id": "a", "bootstrap.servers": "memory://"})[METRICS_PROMETHEUS_HOST]
    with caplog.at_level(logging.WARNING, logger="streamloop.prometheus"):
        exporter = PrometheusExporter(lambda: [], host, 0)
    try:
        assert reachable(LOOPBACK, exporter.port)
        assert not reachable(outside, exporter.port)
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    finally:
        exporter.close()


def test_a_prometheus_endpoint_off_loopback_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="streamloop.prometheus"):
        exporter = PrometheusExporter(lambda: [], "0.0.0.0", 0)
    try:
        assert reachable(LOOPBACK, exporter.port)
        assert any("off loopback" in r.getMessage() and "without a token" in r.getMessage()
                   for r in caplog.records)
    finally:
        exporter.close()
