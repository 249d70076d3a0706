"""Kafka's security keys turned into aiokafka's client options.

Kafka's clients read ``security.protocol``, ``sasl.mechanism``, ``sasl.jaas.config`` and the
``ssl.*`` stores; aiokafka takes ``security_protocol``, ``sasl_mechanism``,
``sasl_plain_username``/``sasl_plain_password``, ``sasl_oauth_token_provider`` and an
``ssl_context``. :func:`security_options` maps the first onto the second for one client.

Its settings come in layers, later ones overriding earlier ones key by key: the unprefixed
keys (every client), then the keys of the client's kind (``consumer.``, ``producer.``,
``admin.``; the restore consumer is a consumer). A layer's prefix names its keys in errors.

What aiokafka cannot do is a ``ConfigError`` naming the key, raised when the options are made
(the transport makes them when it is created, so a ``KafkaStreams`` fails at construction):

- ``sasl.mechanism`` must be set with SASL_PLAINTEXT and SASL_SSL: Kafka's default, GSSAPI
  (Kerberos), is not supported.
- ``sasl.jaas.config`` is read for PLAIN (``PlainLoginModule``) and SCRAM (``ScramLoginModule``):
  one login module, flag ``required``, options ``username`` and ``password``. OAUTHBEARER takes
  its token from ``sasl.login.callback.handler.class``, an aiokafka ``AbstractTokenProvider``.
- The stores are PEM files: ``ssl.truststore.location`` holds CA certificates (the system's CAs
  when unset), ``ssl.keystore.location`` the client's certificate chain and its private key,
  encrypted with ``ssl.key.password`` or not encrypted.

The values of ``sasl.jaas.config`` and ``ssl.key.password`` never appear in an error.
"""

from __future__ import annotations

import importlib
import os
import re
import ssl
from collections.abc import Mapping
from typing import Any

from aiokafka.abc import AbstractTokenProvider

from streamloop import config as cfg
from streamloop import redaction
from streamloop.errors import ConfigError

__all__ = ["CLIENT_KINDS", "client_secrets", "is_security_key", "security_options", "unused_security_keys"]

CLIENT_KINDS = ("consumer", "producer", "admin")

_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "OAUTHBEARER": "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule",
}
_DEFAULTS = {key.name: key.default for key in cfg.KEYS if key.name in cfg.SECURITY_KEYS}
_JAAS_FORM = '\'<LoginModule class> required username="..." password="...";\''
_JAAS_ENTRY = re.compile(r"\s*(?P<module>[A-Za-z_$][\w.$]*)\s+(?P<flag>\w+)(?P<options>.*?);\s*", re.S)
_JAAS_OPTION = re.compile(r'\s*(?P<name>[\w.-]+)\s*=\s*(?:"(?P<quoted>(?:[^"\\]|\\.)*)"|(?P<bare>[^\s";=]+))',
                          re.S)


def is_security_key(name: str) -> bool:
    """Whether ``name`` (without a client prefix) is one of Kafka's security keys read here."""
    return name in cfg.SECURITY_KEYS


class _Layers:
    """The security keys of one client: each key's value from the last layer that has it."""

    def __init__(self, layers: tuple[tuple[str, Mapping[str, object]], ...]) -> None:
        self._given: dict[str, tuple[str, Any]] = {}
        for prefix, settings in layers:
            for name in cfg.SECURITY_KEYS:
                if name in settings:
                    shown = prefix + name
                    self._given[name] = (shown, cfg.check_value(name, settings[name], shown))

    def __bool__(self) -> bool:
        return bool(self._given)

    def get(self, name: str) -> Any:
        """The checked value of ``name``, or its default."""
        if name in self._given:
            return self._given[name][1]
        return _DEFAULTS[name]

    def shown(self, name: str) -> str:
        """The key as the user wrote it (with its prefix), to name it in an error."""
        return self._given[name][0] if name in self._given else name


def security_options(*layers: tuple[str, Mapping[str, object]]) -> dict[str, object]:
    """aiokafka options for the security keys in ``layers`` (``(prefix, keys without it)``).

    Empty when no layer has a security key, so that aiokafka's defaults (and options given in
    aiokafka's own names) stay. Raises ``ConfigError`` naming the key for a value that cannot be
    used: see the module docstring.
    """
    given = _Layers(layers)
    if not given:
        return {}
    protocol = given.get(cfg.SECURITY_PROTOCOL).upper()
    options: dict[str, object] = {"security_protocol": protocol}
    if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        options.update(_sasl_options(given, protocol))
    if protocol in ("SSL", "SASL_SSL"):
        options["ssl_context"] = _ssl_context(given)
    return options


_SASL_ONLY = (cfg.SASL_MECHANISM, cfg.SASL_JAAS_CONFIG, cfg.SASL_LOGIN_CALLBACK_HANDLER_CLASS)
_SSL_ONLY = (cfg.SSL_TRUSTSTORE_LOCATION, cfg.SSL_KEYSTORE_LOCATION, cfg.SSL_KEY_PASSWORD)


def client_secrets(options: Mapping[str, object], *layers: tuple[str, Mapping[str, object]]) -> set[str]:
    """The secrets one client holds: its aiokafka ``options`` (``sasl_plain_password``) and its
    layers' Kafka keys (``ssl.key.password``, the whole ``sasl.jaas.config``), for
    ``streamloop.redaction`` to hide in every log line while the client runs."""
    found = redaction.config_secrets(options)
    for _prefix, settings in layers:
        found |= redaction.config_secrets(settings)
    return found


def unused_security_keys(*layers: tuple[str, Mapping[str, object]]) -> list[str]:
    """The keys set in ``layers`` (as written) that the client's ``security.protocol`` does not use:
    ``sasl.*`` without SASL, ``ssl.*`` stores without TLS. Values are checked as in
    :func:`security_options`."""
    given = _Layers(layers)
    protocol = given.get(cfg.SECURITY_PROTOCOL).upper()
    unused = [] if protocol.startswith("SASL_") else list(_SASL_ONLY)
    if protocol not in ("SSL", "SASL_SSL"):
        unused += _SSL_ONLY
    return [given.shown(name) for name in unused if given.get(name) is not None]


# -- SASL --------------------------------------------------------------------------------


def _sasl_options(given: _Layers, protocol: str) -> dict[str, object]:
    mechanism = given.get(cfg.SASL_MECHANISM)
    if mechanism is None:
        raise ConfigError(given.shown(cfg.SASL_MECHANISM),
                          f"must be set with security.protocol={protocol}: Kafka's default GSSAPI (Kerberos) "
                          f"is not supported; use one of {', '.join(cfg.SASL_MECHANISMS)}")
    jaas = given.get(cfg.SASL_JAAS_CONFIG)
    jaas_key = given.shown(cfg.SASL_JAAS_CONFIG)
    if mechanism == "OAUTHBEARER":
        if jaas is not None:
            _login_options(jaas, jaas_key, mechanism, allowed=frozenset())
        return {"sasl_mechanism": mechanism, "sasl_oauth_token_provider": _token_provider(given)}
    if jaas is None:
        raise ConfigError(jaas_key, f"must be set with sasl.mechanism={mechanism}: "
                          f"{_LOGIN_MODULES[mechanism]} required username=\"...\" password=\"...\";")
    login = _login_options(jaas, jaas_key, mechanism, allowed=frozenset({"username", "password"}))
    for option in ("username", "password"):
        if not login.get(option):
            raise ConfigError(jaas_key, f"has no {option}: {mechanism} needs {_JAAS_FORM}")
    return {"sasl_mechanism": mechanism, "sasl_plain_username": login["username"],
            "sasl_plain_password": login["password"]}


def _login_options(jaas: str, key: str, mechanism: str, allowed: frozenset[str]) -> dict[str, str]:
    """The options of the one login module of ``jaas``, checked against ``mechanism``.

    Error messages never quote ``jaas``: it holds a password.
    """
    entry = _JAAS_ENTRY.fullmatch(jaas)
    if entry is None:
        raise ConfigError(key, f"cannot be parsed (value not shown); expected {_JAAS_FORM}")
    module, flag = entry.group("module"), entry.group("flag")
    if module != _LOGIN_MODULES[mechanism]:
        # Only a qualified class name is shown: a first word without dots may be a misplaced secret.
        named = f"the login module {module}" if module.startswith(("org.", "com.", "io.")) else "another login module"
        raise ConfigError(key, f"names {named}, but sasl.mechanism={mechanism} needs {_LOGIN_MODULES[mechanism]}")
    if flag != "required":
        # Not quoted: a password written where the flag goes would be printed.
        known = flag in ("requisite", "sufficient", "optional")
        shown_flag = f"the control flag {flag!r}" if known else "a control flag other than 'required' (not shown)"
        raise ConfigError(key, f"has {shown_flag}; only 'required' is supported (one login module)")
    options: dict[str, str] = {}
    text, at = entry.group("options"), 0
    while text[at:].strip():
        option = _JAAS_OPTION.match(text, at)
        if option is None:
            raise ConfigError(key, f"cannot be parsed after the login module (value not shown); expected {_JAAS_FORM}")
        quoted = option.group("quoted")
        options[option.group("name")] = (re.sub(r"\\(.)", r"\1", quoted, flags=re.S) if quoted is not None
                                         else option.group("bare"))
        at = option.end()
    unknown = sorted(set(options) - allowed)
    if unknown:
        use = (f"only {', '.join(sorted(allowed))} are read" if allowed
               else "options are not read: the token comes from sasl.login.callback.handler.class")
        raise ConfigError(key, f"has options {unknown} that this client cannot apply ({use})")
    return options


def _token_provider(given: _Layers) -> AbstractTokenProvider:
    key = given.shown(cfg.SASL_LOGIN_CALLBACK_HANDLER_CLASS)
    value = given.get(cfg.SASL_LOGIN_CALLBACK_HANDLER_CLASS)
    if value is None:
        raise ConfigError(key, "must be set with sasl.mechanism=OAUTHBEARER: an aiokafka AbstractTokenProvider "
                          "(instance, class or dotted path) that returns the token")
    if isinstance(value, str):
        module_name, _, attribute = value.rpartition(".")
        try:
            value = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ConfigError(key, f"cannot load {value!r}: {exc}") from exc
    if isinstance(value, type):
        value = value()
    if not isinstance(value, AbstractTokenProvider):
        raise ConfigError(key, f"expected an aiokafka.abc.AbstractTokenProvider, got {type(value).__name__}")
    return value


# -- SSL ---------------------------------------------------------------------------------


class _NoKeyPassword(Exception):
    pass


def _no_key_password() -> str:
    # Without a callback OpenSSL would prompt on the terminal for an encrypted key's password.
    raise _NoKeyPassword


def _ssl_context(given: _Layers) -> ssl.SSLContext:
    truststore = given.get(cfg.SSL_TRUSTSTORE_LOCATION)
    if truststore is None:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    else:
        key = given.shown(cfg.SSL_TRUSTSTORE_LOCATION)
        _require_file(truststore, key)
        try:
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=truststore)
        except ssl.SSLError as exc:
            raise ConfigError(key, f"{truststore!r} is not a PEM file of CA certificates ({exc.reason})") from exc
    context.check_hostname = given.get(cfg.SSL_ENDPOINT_IDENTIFICATION_ALGORITHM).lower() == "https"
    keystore = given.get(cfg.SSL_KEYSTORE_LOCATION)
    if keystore is not None:
        _load_keystore(context, keystore, given)
    return context


def _load_keystore(context: ssl.SSLContext, keystore: str, given: _Layers) -> None:
    key = given.shown(cfg.SSL_KEYSTORE_LOCATION)
    password_key = given.shown(cfg.SSL_KEY_PASSWORD)
    _require_file(keystore, key)
    try:
        with open(keystore, encoding="ascii", errors="replace") as file:
            text = file.read()
    except OSError as exc:
        raise ConfigError(key, f"cannot read {keystore!r}: {exc.strerror}") from exc
    if "CERTIFICATE-----" not in text or "PRIVATE KEY-----" not in text:
        raise ConfigError(key, f"{keystore!r} must be a PEM file holding the client's certificate (chain) "
                          "and its private key")
    encrypted = "ENCRYPTED PRIVATE KEY-----" in text or "Proc-Type: 4,ENCRYPTED" in text
    password = given.get(cfg.SSL_KEY_PASSWORD)
    if encrypted and password is None:
        raise ConfigError(password_key, f"must be set: the private key in {key} is encrypted")
    try:
        # The callback stands in for OpenSSL's prompt on the terminal, which it would show otherwise.
        context.load_cert_chain(keystore, password=password if password is not None else _no_key_password)
    except (ssl.SSLError, _NoKeyPassword) as exc:
        if encrypted:
            raise ConfigError(password_key, f"does not decrypt the private key in {key}") from None
        raise ConfigError(key, f"{keystore!r} cannot be loaded as a PEM certificate and key: {exc}") from exc


def _require_file(path: str, key: str) -> None:
    if not os.path.isfile(path):
        raise ConfigError(key, f"no such file: {path!r}")
