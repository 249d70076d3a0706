"""Shared fixtures: the real Kafka broker (once per session) and the ``bootstrap`` fixture
that runs each behavioural test on both transports.

Under pytest-xdist (``make test`` runs ``-n``) the controller starts the one session broker
before the workers and hands its address to them (``pytest_configure_node``), so every worker
shares it and none stops it under another. Tests that share something only one process can hold
run on one worker (``xdist_group``, with ``--dist loadgroup``): the late broker, whose delays a
test sets for the whole broker, Spark, one session per process, and the secure brokers.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import settings as hypothesis_settings

from streamloop.transport import open_transport
from tests.support.cluster import Cluster

if TYPE_CHECKING:
    from tests.support.kafka_broker import KafkaBroker
    from tests.support.late_broker import LateKafka

# Wall-clock deadlines per example fail on a loaded 2-core CI machine without saying
# anything about the code; the tests' own timeouts still bound a hang.
hypothesis_settings.register_profile("streamloop", deadline=None)
hypothesis_settings.load_profile("streamloop")

_names = itertools.count()
_shared_broker: pytest.StashKey[KafkaBroker] = pytest.StashKey()


def _runs_workers(config: pytest.Config) -> bool:
    """The xdist controller of a parallel run (not a worker, not a plain run)."""
    return not hasattr(config, "workerinput") and bool(getattr(config.option, "numprocesses", None))


def pytest_configure(config: pytest.Config) -> None:
    if _runs_workers(config):
        from tests.support.kafka_broker import KafkaBroker

        config.stash[_shared_broker] = KafkaBroker().start()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist, on the controller: a worker is about to start; it uses the controller's broker."""
    broker = node.config.stash.get(_shared_broker, None)
    if broker is not None:
        node.workerinput["kafka_bootstrap"] = broker.bootstrap


def pytest_unconfigure(config: pytest.Config) -> None:
    broker = config.stash.get(_shared_broker, None)
    if broker is not None:
        broker.stop()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """One worker for the tests of the late broker, one for Spark's (see the module's docstring)."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        variant = callspec.params.get("bootstrap") if callspec is not None else None
        if names & {"late_kafka", "late_kafka_session", "kafka_defaults_bootstrap"} or variant == "kafka-defaults":
            item.add_marker(pytest.mark.xdist_group("late-broker"))
        elif "spark" in names or "spark" in item.nodeid or "test_demo" in item.nodeid:
            item.add_marker(pytest.mark.xdist_group("spark"))
        elif "secure_broker" in names:
            # Its modules each start a secure broker (module scope): one worker starts them one at a
            # time. Two SASL tests failed to bootstrap once while both ran at once on two workers.
            item.add_marker(pytest.mark.xdist_group("secure-broker"))


@pytest.fixture(scope="session", autouse=True)
def _state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The default ``state.dir`` is per user (``$XDG_STATE_HOME/streamloop``): point it into the
    session's temporary directory, for this process and the apps it starts, so no test that keeps
    the default writes into the user's home."""
    home = str(tmp_path_factory.mktemp("xdg-state"))
    before = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = home
    yield home
    if before is None:
        os.environ.pop("XDG_STATE_HOME", None)
    else:
        os.environ["XDG_STATE_HOME"] = before


@pytest.fixture(scope="session")
def kafka_bootstrap(request: pytest.FixtureRequest) -> Iterator[str]:
    """A single-node KRaft broker fetched with Maven and started on a free loopback port (under
    xdist, the controller's)."""
    shared = getattr(request.config, "workerinput", {}).get("kafka_bootstrap")
    if shared:
        yield shared
        return
    from tests.support.kafka_broker import kafka_broker_session

    for broker in kafka_broker_session():
        yield broker.bootstrap


@pytest.fixture(scope="session")
def late_kafka_session() -> Iterator[LateKafka]:
    """A dedicated broker at Kafka's *default* group settings behind the late proxy
    (tests/support/late_broker.py), started when a test first asks for it. Use ``late_kafka``
    (which resets it around each test) rather than this."""
    from tests.support.late_broker import late_kafka

    with late_kafka() as kafka:
        yield kafka


@pytest.fixture
def late_kafka(late_kafka_session: LateKafka) -> Iterator[LateKafka]:
    """The late broker with its delays at zero, its record empty and its proxy passing through
    when the test starts; the same again after it, so that no setting outlives its test.

    A client stopping waits for the group answers the proxy holds (an aiokafka consumer's stop
    waits for its JoinGroup): a fixture that stops clients after the test should set the delays
    to zero first (``late_kafka.set_delays(GroupDelays())``), as it tears down before this one."""
    late_kafka_session.reset()
    yield late_kafka_session
    late_kafka_session.reset()


@pytest.fixture
def kafka_defaults_bootstrap(late_kafka: LateKafka) -> str:
    """``bootstrap.servers`` of a broker at Kafka's default group settings
    (``group.initial.rebalance.delay.ms=3000``, ``group.min.session.timeout.ms=6000``),
    answering at once: the late broker with its delays at zero."""
    return late_kafka.bootstrap


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """The session's one local SparkSession; clients under test reuse it (and leave it running)."""
    from tests.support.spark import spark_session

    yield from spark_session()


@pytest.fixture(params=["memory", pytest.param("kafka", marks=pytest.mark.kafka)])
def bootstrap(request: pytest.FixtureRequest) -> str:
    """``bootstrap.servers`` of a fresh memory broker, or of the session's Kafka broker.

    A group test adds a third variant, a broker at Kafka's default group settings, with
    ``@pytest.mark.parametrize("bootstrap", EVERY_BROKER, indirect=True)`` (tests/support/cluster.py)."""
    if request.param == "memory":
        return f"memory://test-{uuid.uuid4().hex[:8]}"
    if request.param == "kafka-defaults":
        return request.getfixturevalue("kafka_defaults_bootstrap")
    return request.getfixturevalue("kafka_bootstrap")


@pytest.fixture
def cluster(bootstrap: str) -> Cluster:
    return Cluster(open_transport({"bootstrap.servers": bootstrap}), bootstrap)


@pytest.fixture
def names() -> Names:
    """Unique topic and application names, so tests sharing the Kafka broker never collide."""
    return Names(f"{next(_names)}-{os.getpid()}-{uuid.uuid4().hex[:6]}")


class Names:
    def __init__(self, suffix: str) -> None:
        self.suffix = suffix

    def __call__(self, base: str) -> str:
        return f"{base}-{self.suffix}"

    @property
    def app(self) -> str:
        return f"app-{self.suffix}"
