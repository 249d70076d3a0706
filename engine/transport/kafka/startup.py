"""Starting an aiokafka client: release what a failed start opened, and tell refused credentials
from an unreachable broker.

Security
    Kafka's ``security.protocol``, ``sasl.*`` and ``ssl.*`` keys become aiokafka options in
    :mod:`streamloop.transport.kafka.security`. aiokafka's bootstrap catches every connection error,
    a refused SASL login (``SaslAuthenticationFailed``) and a failed TLS handshake
    (``SSLCertVerificationError``) included, logs it and raises only ``KafkaConnectionError``
    "Unable to bootstrap", which reads as a timeout. So when a secured client cannot
    start, the transport connects once more to each bootstrap address and raises
    ``AuthenticationError`` (not retried) if that connection is refused, or, over TLS, closed
    by the broker before its first answer (a client certificate it requires is missing or not
    trusted). A refusal by a broker other than the bootstrap ones, or after the client started,
    is still reported as a lost connection (``NodeNotReadyError``).
"""

from __future__ import annotations

import asyncio
import inspect
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiokafka import errors as aioerrors
from aiokafka.conn import collect_hosts, create_conn

from streamloop.errors import AuthenticationError
from streamloop.transport import lost_connections
from streamloop.transport.kafka.errors import describe, transport_error

__all__ = ["start_or_clean_up"]


async def start_or_clean_up(
    start: Callable[[], Awaitable[Any]], stop: Callable[[], Awaitable[Any]], what: str,
    options: Mapping[str, object],
) -> None:
    """Start an aiokafka client; if that fails, release what it opened and report a TransportError
    (an ``AuthenticationError`` when the broker refused the client's credentials)."""
    try:
        await start()
    except BaseException as exc:
        lost_connections.note()  # aio-libs/aiokafka#715: a half-way start can lose a connection
        await stop()
        if isinstance(exc, aioerrors.KafkaConnectionError):
            await _raise_if_refused(options)
        if isinstance(exc, aioerrors.KafkaError):
            raise transport_error(exc, what) from exc
        raise


_SASL_REFUSALS: tuple[type[BaseException], ...] = (
    aioerrors.SaslAuthenticationFailed,
    aioerrors.AuthenticationFailedError,
    aioerrors.UnsupportedSaslMechanismError,
    aioerrors.IllegalSaslStateError,
)
_CONNECTION_OPTIONS = frozenset(inspect.signature(create_conn).parameters) - {"host", "port"}


async def _raise_if_refused(options: Mapping[str, object]) -> None:
    """Raise ``AuthenticationError`` if the bootstrap servers refuse the client's credentials.

    aiokafka's bootstrap logs each address's error and then raises only "Unable to bootstrap"
    (a ``KafkaConnectionError``, retried as a timeout). One more connection to each address
    tells a refused login or TLS handshake apart from an unreachable broker.
    """
    if options.get("security_protocol", "PLAINTEXT") == "PLAINTEXT":
        return
    kwargs = {k: v for k, v in options.items() if k in _CONNECTION_OPTIONS}
    timeout = float(options.get("request_timeout_ms", 40_000)) / 1000  # type: ignore[arg-type]  # an int option
    client_id = str(options.get("client_id"))
    for host, port, _family in collect_hosts(options["bootstrap_servers"]):
        try:
            conn = await asyncio.wait_for(create_conn(host, port, **kwargs), timeout)
        except _SASL_REFUSALS as exc:
            raise AuthenticationError(str(options.get("sasl_mechanism")), client_id, str(exc) or describe(exc)) from exc
        except ssl.SSLError as exc:
            raise AuthenticationError("SSL", client_id, describe(exc)) from exc
        except aioerrors.KafkaConnectionError as exc:
            # Connected, then closed by the broker before its first answer: over TLS that is how a
            # broker with ssl.client.auth=required refuses a missing or untrusted client certificate.
            if options.get("ssl_context") is not None:
                raise AuthenticationError("SSL", client_id, "the broker closed the connection after the TLS "
                                          "handshake: it requires a client certificate that it trusts "
                                          "(ssl.keystore.location)") from exc
            continue
        except (TimeoutError, OSError, aioerrors.KafkaError):
            continue  # not a refusal: the usual TransportError says the broker is unreachable
        conn.close()
