"""Shared fixtures: the real Kafka broker (once per session) and the ``bootstrap`` fixture
that runs each behavioural test on both transports."""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings as hypothesis_settings

from engine.transport import open_transport
from tests.support.cluster import Cluster

if TYPE_CHECKING:
    from tests.support.late_broker import LateKafka

# Wall-clock deadlines per example fail on a loaded 2-core CI machine without saying
# anything about the code; the tests' own timeouts still bound a hang.
hypothesis_settings.register_profile("streamloop", deadline=None)
hypothesis_settings.load_profile("streamloop")

_names = itertools.count()


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
def kafka_bootstrap() -> Iterator[str]:
    """A single-node KRaft broker fetched with Maven and started on a free loopback port."""
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
