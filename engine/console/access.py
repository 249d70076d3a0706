"""Who may use the console: the bind address, the token, and the web UI's guard.

The console runs arbitrary code in the application's process (aiomonitor's Python
REPL, ``cancel``, ``signal``), so it is treated like a shell:

* It listens on loopback unless ``monitor.host`` says otherwise; another address
  needs ``monitor.token`` (``ConfigError`` without one) and logs a WARNING.
* With a token set, the telnet console asks for it before the first command and
  closes the connection on a wrong one; the web UI wants it in an
  ``Authorization: Bearer`` header or in the cookie that ``?token=`` sets.
  Tokens are compared in constant time (``hmac.compare_digest``).
* Whatever the token, a request that changes something (any method but GET, HEAD,
  OPTIONS) is refused when a browser says it comes from another site (``Origin``,
  ``Sec-Fetch-Site``); on loopback without a token, a request whose ``Host`` is not
  a loopback name is refused too (DNS rebinding).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import web

from streamloop import config as cfg
from streamloop.config import StreamsConfig, is_loopback
from streamloop.errors import ConfigError

log = logging.getLogger(__name__)

COOKIE = "streamloop-monitor-token"
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_SAME_SITE = frozenset({"same-origin", "none"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def check_bind(config: StreamsConfig) -> None:
    """Allow the console on ``monitor.host``: loopback, or another address with ``monitor.token`` (warned).

    Raises ``ConfigError`` naming ``monitor.token`` for an address off loopback without a token.
    """
    host = config[cfg.MONITOR_HOST]
    if is_loopback(host):
        return
    if config[cfg.MONITOR_TOKEN] is None:
        raise ConfigError(cfg.MONITOR_TOKEN, f"must be set for the console to listen on {host} (monitor.host "
                          "is not a loopback address): the console runs arbitrary code in this process. Set "
                          "monitor.token, or keep monitor.host on 127.0.0.1 and reach it through SSH")
    log.warning("The console listens on %s (ports %d, web UI %d), off loopback: it runs arbitrary code in this "
                "process for whoever reaches it with monitor.token", host, config[cfg.MONITOR_PORT],
                config[cfg.MONITOR_WEBUI_PORT])


def token_matches(given: str | None, token: str) -> bool:
    """Constant-time comparison of a typed or sent token with ``monitor.token``."""
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def _bearer(request: web.Request) -> str | None:
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None


def _cross_site(request: web.Request) -> str | None:
    """Why a browser's request comes from another site, or None."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site not in _SAME_SITE:
        return f"Sec-Fetch-Site: {site}"
    origin = request.headers.get("Origin")
    if origin is not None and urlsplit(origin).netloc.lower() != request.host.lower():
        return f"Origin {origin} is not {request.host}"
    return None


def web_guard(host: str, token: str | None) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """An aiohttp middleware that guards aiomonitor's web UI bound to ``host`` with ``token``."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method not in _SAFE_METHODS and (why := _cross_site(request)) is not None:
            log.warning("Refused a cross-site %s %s to the console's web UI (%s)", request.method, request.path, why)
            raise web.HTTPForbidden(text="cross-site request refused\n")
        if token is None:
            if is_loopback(host) and not is_loopback(request.url.host or ""):
                raise web.HTTPMisdirectedRequest(text="the console answers only to a loopback Host\n")
            return await handler(request)
        if request.method == "GET" and "token" in request.query:
            if not token_matches(request.query["token"], token):
                raise web.HTTPUnauthorized(text="wrong token\n", headers={"WWW-Authenticate": "Bearer"})
            # Trade the token in the address (history, logs) for a cookie that stays on this site.
            rest = {name: value for name, value in request.query.items() if name != "token"}
            response = web.HTTPSeeOther(request.rel_url.with_query(rest))
            response.set_cookie(COOKIE, token, httponly=True, samesite="Strict", path="/")
            raise response
        if not (token_matches(_bearer(request), token) or token_matches(request.cookies.get(COOKIE), token)):
            raise web.HTTPUnauthorized(text="monitor.token needed: an Authorization: Bearer header, or open "
                                            "/?token=... once\n", headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    return guard
