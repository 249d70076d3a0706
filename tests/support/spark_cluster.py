"""A standalone Spark cluster on loopback: one Master and N Workers from the pyspark install.

Each daemon is ``$SPARK_HOME/bin/spark-class org.apache.spark.deploy.{master.Master,worker.Worker}``
in the foreground, in its own process group (so stopping a worker also ends the executors it
started), logging to a file in a temporary directory. Ports come from the test broker's free-port
helper (loopback, below 32768). ``start`` returns once the Master's web UI (``/json/``) shows every
worker ALIVE, or raises ``SparkClusterError`` with the daemons' log tails after a deadline.

    with SparkCluster(workers=2) as cluster:
        settings = {"spark.master": cluster.master_url, **cluster.client_settings()}
        cluster.kill_worker(0)             # SIGKILL, as a lost machine

Command line: ``python -m tests.support.spark_cluster run [--workers N]`` prints the master URL
and waits for Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.ports import free_port

START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 15.0


class SparkClusterError(RuntimeError):
    pass


def spark_home() -> Path:
    """The pyspark install, which is a complete Spark distribution (``bin/``, ``jars/``)."""
    env = os.environ.get("SPARK_HOME")
    if env:
        return Path(env)
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class _Daemon:
    def __init__(self, name: str, args: list[str], log: Path, env: dict[str, str]) -> None:
        self.name = name
        self.log = log
        with open(log, "wb") as out:
            # A new session: the daemon and every executor it forks form one process group.
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        if self.alive:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait(STOP_TIMEOUT_S)
        # The group's executors may outlive their worker by a moment.
        self.signal(signal.SIGKILL)

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return f"(no log for {self.name})"
        return f"--- {self.name} ---\n" + "\n".join(text.splitlines()[-lines:])


class SparkCluster:
    """A Master and ``workers`` Workers of ``cores`` cores and ``memory`` each."""

    def __init__(self, workers: int = 2, *, cores: int = 1, memory: str = "1g") -> None:
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.host = "127.0.0.1"
        self._dir: Path | None = None
        self._master: _Daemon | None = None
        self._workers: list[_Daemon] = []
        self.master_port = 0
        self.web_port = 0

    @property
    def master_url(self) -> str:
        return f"spark://{self.host}:{self.master_port}"

    def client_settings(self, executor_memory: str = "512m") -> dict[str, str]:
        """``spark.*`` settings for a driver using this cluster: the master, loopback for the
        driver, and one executor per worker that fits its cores and memory."""
        return {
            "spark.master": self.master_url,
            "spark.driver.host": self.host,
            "spark.driver.bindAddress": self.host,
            "spark.executor.memory": executor_memory,
            "spark.executor.cores": str(self.cores),
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": str(max(2, self.workers * self.cores)),
        }

    def _env(self) -> dict[str, str]:
        assert self._dir is not None
        env = dict(os.environ)
        env.update({
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": self.host,
            "SPARK_LOG_DIR": str(self._dir / "logs"),
            "SPARK_NO_DAEMONIZE": "1",
            # Executors run the driver's Python for any Python worker a job needs.
            "PYSPARK_PYTHON": sys.executable,
        })
        return env

    def _spark_class(self, main: str, *args: str) -> list[str]:
        return [str(spark_home() / "bin" / "spark-class"), main, *args]

    def start(self) -> SparkCluster:
        if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
            raise SparkClusterError("java (17+) is needed on PATH to run a Spark cluster")
        self._dir = Path(tempfile.mkdtemp(prefix="spark-cluster-"))
        (self._dir / "logs").mkdir()
        env = self._env()
        try:
            self.master_port = free_port()
            self.web_port = free_port({self.master_port})
            self._master = _Daemon("master", self._spark_class(
                "org.apache.spark.deploy.master.Master", "--host", self.host, "--port", str(self.master_port),
                "--webui-port", str(self.web_port)), self._dir / "master.log", env)
            self._wait(lambda state: state is not None, "the master's web UI")
            taken = {self.master_port, self.web_port}
            for _ in range(self.workers):
                self.add_worker(taken)
            self._wait(lambda state: state is not None and state["alive"] >= self.workers,
                       f"{self.workers} alive workers")
        except BaseException:
            self.stop()
            raise
        return self

    def add_worker(self, taken: set[int] | None = None) -> None:
        """Start one more worker (also after a kill); ``wait_for_workers`` waits for it."""
        assert self._dir is not None
        taken = set() if taken is None else taken
        port = free_port(taken)
        web = free_port(taken | {port})
        taken |= {port, web}
        index = len(self._workers)
        work = self._dir / f"worker-{index}"
        work.mkdir()
        self._workers.append(_Daemon(f"worker-{index}", self._spark_class(
            "org.apache.spark.deploy.worker.Worker", "--host", self.host, "--port", str(port),
            "--webui-port", str(web), "--cores", str(self.cores), "--memory", self.memory,
            "--work-dir", str(work), self.master_url), self._dir / f"worker-{index}.log", self._env()))

    def state(self) -> dict[str, Any] | None:
        """The master's view (``alive`` workers, ``workers``, ``activeapps``), None while it is not up."""
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.web_port}/json/", timeout=2) as response:
                body = json.loads(response.read())
        except (OSError, ValueError):
            return None
        alive = sum(1 for w in body.get("workers", []) if w.get("state") == "ALIVE")
        return {"alive": alive, "workers": body.get("workers", []), "activeapps": body.get("activeapps", [])}

    def wait_for_workers(self, count: int, timeout: float = START_TIMEOUT_S) -> None:
        self._wait(lambda state: state is not None and state["alive"] == count, f"{count} alive workers", timeout)

    def _wait(self, ready: Any, what: str, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self._master is None or not self._master.alive:
                raise SparkClusterError(f"the Spark master exited while waiting for {what}\n{self.logs()}")
            if ready(self.state()):
                return
            if time.monotonic() > deadline:
                raise SparkClusterError(f"no {what} after {timeout:.0f} s\n{self.logs()}")
            time.sleep(0.1)

    def executor_pids(self, worker: int) -> list[int]:
        """The executor JVMs a worker started (its process group, less the worker itself)."""
        daemon = self._workers[worker]
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == daemon.proc.pid:
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (entry / "stat").read_text()
                fields = stat[stat.rindex(")") + 2:].split()
                if int(fields[2]) == daemon.proc.pid:  # pgrp
                    found.append(int(entry.name))
        return found

    def kill_worker(self, index: int) -> None:
        """SIGKILL a worker and its executors at once, as a machine lost mid-job."""
        daemon = self._workers[index]
        daemon.signal(signal.SIGKILL)
        daemon.proc.wait(STOP_TIMEOUT_S)

    def logs(self) -> str:
        daemons = [d for d in (self._master, *self._workers) if d is not None]
        return "\n".join(d.tail() for d in daemons)

    def stop(self) -> None:
        for daemon in reversed(self._workers):
            daemon.stop()
        if self._master is not None:
            self._master.stop()
        self._workers, self._master = [], None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["run"])
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    with SparkCluster(workers=args.workers) as cluster:
        print(cluster.master_url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
