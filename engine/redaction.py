"""No configured secret in any log line: the engine's, aiokafka's or any other library's.

``config.shown()`` keeps the engine's own messages clean, but a client the engine starts logs
what it likes: aiokafka's DEBUG log of ``aiokafka.conn`` prints every request it sends, the
SASL/PLAIN authentication bytes ``b'\\x00user\\x00password'`` included. So while a client
runs, every log record made in the process passes through :func:`redact_record`: when its
message (formatted with its arguments), its traceback or its stack holds a registered secret,
in any of the forms it is written in (as is, escaped as in a ``str`` or ``bytes`` repr or in
JSON), the record is rewritten with ``[hidden]`` in its place. A record without a secret is left
exactly as it was made (its ``msg`` and ``args`` too, which some handlers group by).

Why a log record factory rather than a ``logging.Filter`` on the ``aiokafka`` and ``engine``
loggers: a logger's filters only see the records logged on that very logger, not those of its
children (``aiokafka.conn``) that propagate through it, and handlers belong to the application.
The factory sees every record when it is made, once, before any filter or handler.

Secrets are registered per owner (a ``KafkaStreams`` from its start to its close, a Schema
Registry client for its lifetime) with :func:`register` and dropped with :func:`unregister`;
the factory is installed with the first owner and removed with the last (unless another
factory was installed on top of it since: it then stays, passing records through).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import re
import threading
import traceback
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from streamloop.config import HIDDEN, is_secret

__all__ = ["config_secrets", "redact_record", "redact_text", "register", "registered", "unregister",
           "unregister_id"]

# The thread inside ``_changing`` now, and the owners a finalizer dropped while it was: a garbage
# collection may run at any allocation there (``re.compile`` allocates plenty) and call a dead
# owner's ``weakref.finalize`` on that very thread, which must neither wait on the lock it holds
# nor change ``_owners`` under the change in progress. Reentrant for the instants around
# ``_holder``'s assignments, where such a finalizer takes the lock again and changes it itself.
_lock = threading.RLock()
_holder: int | None = None
_dropped: list[int] = []
_owners: dict[int, frozenset[str]] = {}
# The compiled alternation of every form of every registered secret; None when there is none.
# Replaced as a whole under the lock, read without it by the factory (an atomic attribute read).
_pattern: re.Pattern[str] | None = None
_previous_factory: Any = None
_our_factory: Any = None

# A JAAS option ``password="…"`` (quoted, with backslash escapes) or ``password=…`` (bare).
_JAAS_PASSWORD = re.compile(r'password\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s";=]+))', re.S)


def forms(secret: str) -> set[str]:
    """The ways ``secret`` is written into a log line: as is, and escaped as a ``str`` repr, a
    ``bytes`` repr (aiokafka's request structs print their payloads so) and a JSON string."""
    found = {secret, repr(secret)[1:-1], json.dumps(secret)[1:-1]}
    with contextlib.suppress(UnicodeEncodeError):  # a lone surrogate: no bytes form to hide
        found.add(repr(secret.encode())[2:-1])
    return {form for form in found if form}


def config_secrets(settings: Mapping[str, Any]) -> set[str]:
    """The secret values of ``settings``: every string under a key ``config.is_secret`` names
    (prefixed pass-through keys too) and the password inside a ``sasl.jaas.config``, as the
    client sends it (unescaped)."""
    secrets: set[str] = set()
    for key, value in settings.items():
        if not isinstance(key, str) or not is_secret(key) or not isinstance(value, str) or not value:
            continue
        secrets.add(value)
        for match in _JAAS_PASSWORD.finditer(value):
            quoted, bare = match.group(1), match.group(2)
            password = re.sub(r"\\(.)", r"\1", quoted, flags=re.S) if quoted is not None else bare
            if password:
                secrets.update({password, quoted or password})
    return secrets


def basic_auth_secrets(user_info: str) -> set[str]:
    """The secrets of an HTTP basic-auth ``user:password``: the pair, the password and the header's token."""
    _, _, password = user_info.partition(":")
    token = base64.b64encode(user_info.encode()).decode("ascii")
    return {s for s in (user_info, password, token) if s}


def register(owner: object, secrets: Iterable[str]) -> None:
    """Hide ``secrets`` in every log record until ``unregister(owner)``; installs the factory.

    Idempotent per owner: registering again replaces the owner's secrets.
    """
    values = frozenset(s for s in secrets if s)
    with _changing():
        if values:
            _owners[id(owner)] = values
        else:
            _owners.pop(id(owner), None)


def unregister(owner: object) -> None:
    """Stop hiding ``owner``'s secrets (others' stay); the factory goes with the last owner."""
    unregister_id(id(owner))


def unregister_id(owner_id: int) -> None:
    """``unregister`` by the owner's ``id()``: for a ``weakref.finalize``, which must not hold the owner.

    Called by a collection inside a change on the same thread, it leaves the drop to that change.
    """
    if _holder == threading.get_ident():
        _dropped.append(owner_id)
        return
    with _changing():
        _owners.pop(owner_id, None)


@contextlib.contextmanager
def _changing() -> Iterator[None]:
    """The lock, held while ``_owners`` changes; the pattern rebuilt on the way out, after the
    owners that finalizers dropped meanwhile are gone too."""
    global _holder
    with _lock:
        _holder = threading.get_ident()
        try:
            yield
            _rebuild()
            while _dropped:  # a collection during the rebuild may have dropped more
                while _dropped:
                    _owners.pop(_dropped.pop(), None)
                _rebuild()
        finally:
            _holder = None


def registered() -> bool:
    """Whether any secret is hidden now (the factory is installed)."""
    return _pattern is not None


def _rebuild() -> None:
    global _pattern, _previous_factory, _our_factory
    every = {form for secrets in _owners.values() for secret in secrets for form in forms(secret)}
    # Longest first: a secret that contains another is hidden whole, not around the shorter one.
    _pattern = (re.compile("|".join(re.escape(f) for f in sorted(every, key=lambda f: (-len(f), f))))
                if every else None)
    if _pattern is not None and _our_factory is None:
        previous = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record: logging.LogRecord = previous(*args, **kwargs)
            return redact_record(record)

        _previous_factory, _our_factory = previous, factory
        logging.setLogRecordFactory(factory)
    elif _pattern is None and _our_factory is not None and logging.getLogRecordFactory() is _our_factory:
        logging.setLogRecordFactory(_previous_factory)
        _previous_factory = _our_factory = None


def redact_text(text: str) -> str:
    """``text`` with every registered secret replaced by ``[hidden]``."""
    pattern = _pattern
    return text if pattern is None else pattern.sub(HIDDEN, text)


def redact_record(record: logging.LogRecord) -> logging.LogRecord:
    """``record`` made safe in place: message, traceback and stack without a registered secret."""
    pattern = _pattern
    if pattern is None:
        return record
    try:
        message = record.getMessage()
    except Exception:  # a broken format string: logging reports it when a handler formats it
        message = None
    if message is not None and pattern.search(message):
        record.msg, record.args = pattern.sub(HIDDEN, message), None
    if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
        # What a Formatter would print (it reuses exc_text when set).
        text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        if pattern.search(text):
            record.exc_text = pattern.sub(HIDDEN, text)
            # The exception object itself still holds the secret: handlers that render it
            # again (not through exc_text) must not get it.
            record.exc_info = None
    elif record.exc_text and pattern.search(record.exc_text):
        record.exc_text = pattern.sub(HIDDEN, record.exc_text)
    if record.stack_info and pattern.search(record.stack_info):
        record.stack_info = pattern.sub(HIDDEN, record.stack_info)
    return record
