"""streamloop.redaction: registered secrets hidden in every log record, in every form they are written in."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from streamloop import redaction

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="alice" '
        'password="p\\"w-é";')


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(name)s %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def lines() -> Iterator[Lines]:
    logger = logging.getLogger("aiokafka.conn")
    handler, level = Lines(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_the_password_inside_a_jaas_config_is_a_secret_unescaped_and_the_whole_value_too() -> None:
    found = redaction.config_secrets({"sasl.jaas.config": JAAS, "consumer.ssl.key.password": "k",
                                      "application.id": "app", "sasl.mechanism": "PLAIN"})
    assert found == {JAAS, 'p"w-é', 'p\\"w-é', "k"}


def test_a_bytes_repr_of_a_sasl_plain_payload_is_hidden_in_a_child_loggers_record(lines: Lines) -> None:
    owner = object()
    redaction.register(owner, {"p\"w-é"})
    try:
        logging.getLogger("aiokafka.conn").debug("Request %d: %s", 3, {"auth": b"\x00alice\x00" + 'p"w-é'.encode()})
        logging.getLogger("aiokafka.conn").debug("as text %r", 'p"w-é')
    finally:
        redaction.unregister(owner)
    assert lines.lines == ["aiokafka.conn Request 3: {'auth': b'\\x00alice\\x00[hidden]'}",
                           "aiokafka.conn as text '[hidden]'"]


def test_a_record_without_a_secret_keeps_its_message_and_arguments() -> None:
    owner = object()
    redaction.register(owner, {"hunter2"})
    try:
        record = logging.getLogger("streamloop").makeRecord("streamloop", logging.INFO, "f", 1, "n=%d", (1,), None)
    finally:
        redaction.unregister(owner)
    assert (record.msg, record.args) == ("n=%d", (1,))


def test_a_traceback_holding_a_secret_is_hidden(lines: Lines) -> None:
    owner = object()
    redaction.register(owner, {"hunter2"})
    try:
        try:
            raise ValueError("login hunter2 refused")
        except ValueError:
            logging.getLogger("aiokafka.conn").exception("failed")
    finally:
        redaction.unregister(owner)
    assert "hunter2" not in lines.lines[0]
    assert "ValueError: login [hidden] refused" in lines.lines[0]


def test_the_factory_is_installed_with_the_first_owner_and_removed_with_the_last() -> None:
    before = logging.getLogRecordFactory()
    first, second = object(), object()
    redaction.register(first, {"a-secret"})
    redaction.register(first, {"a-secret"})  # again: idempotent
    installed = logging.getLogRecordFactory()
    redaction.register(second, {"b-secret"})
    assert logging.getLogRecordFactory() is installed is not before
    redaction.unregister(first)
    assert redaction.redact_text("a-secret b-secret") == "a-secret [hidden]"
    redaction.unregister(second)
    assert logging.getLogRecordFactory() is before
    assert not redaction.registered()


def test_a_client_without_secrets_installs_nothing() -> None:
    before = logging.getLogRecordFactory()
    owner = object()
    redaction.register(owner, redaction.config_secrets({"application.id": "app"}))
    assert logging.getLogRecordFactory() is before
    redaction.unregister(owner)


def test_basic_auth_hides_the_pair_the_password_and_the_header_token() -> None:
    assert redaction.basic_auth_secrets("bob:s3cret") == {"bob:s3cret", "s3cret", "Ym9iOnMzY3JldA=="}


def test_a_schema_registry_client_hides_its_basic_auth_while_it_exists() -> None:
    import gc

    from streamloop.schema_registry import SchemaRegistryClient

    client = SchemaRegistryClient("http://registry.invalid:8081", basic_auth_user_info="bob:s3cret")
    assert redaction.redact_text("Authorization: Basic Ym9iOnMzY3JldA== s3cret") == \
        "Authorization: Basic [hidden] [hidden]"
    del client
    gc.collect()
    assert not redaction.registered()


def test_an_owner_collected_while_the_secrets_change_is_dropped_without_a_deadlock(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A garbage collection may run at any allocation, in the middle of ``register`` too, and run
    a dead client's ``weakref.finalize`` there, on the thread that holds the registry's lock.
    Seen in CI: a client's start hung in ``re.compile`` inside ``register``, its finalizer waiting
    on the lock its own thread held, and every later client start of that process with it."""
    import gc
    import threading
    import weakref

    class Owner:
        def __init__(self) -> None:
            self.cycle = self  # only the cycle collector frees it: at an allocation, not at ``del``

    dead = Owner()
    redaction.register(dead, {"dead-secret"})
    weakref.finalize(dead, redaction.unregister_id, id(dead))
    del dead
    real_forms, collected = redaction.forms, []

    def forms_with_a_collection(secret: str) -> set[str]:
        if not collected:
            collected.append(gc.collect())
        return real_forms(secret)

    monkeypatch.setattr(redaction, "forms", forms_with_a_collection)
    live = object()
    done = threading.Event()
    thread = threading.Thread(target=lambda: (redaction.register(live, {"live-secret"}), done.set()),
                              daemon=True)
    thread.start()
    assert done.wait(10), "register deadlocked on a finalizer run inside it"
    assert collected and collected[0] > 0
    assert redaction.redact_text("dead-secret live-secret") == "dead-secret [hidden]"
    redaction.unregister(live)
    assert not redaction.registered()
