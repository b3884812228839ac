"""The checks in front of every HTTP request, before any route runs (`Guard`, an ASGI
middleware), in this order:

1. Host: the `Host` header must name this server (loopback names, the address the connection
   came in on, `allowed_hosts`), else 421. A DNS-rebinding page reaches the server under its
   own name, so a foreign Host is how such a request shows. /healthz is exempt (a probe may
   use any name) and shows details only to a request that passes this check (see 3).
2. Origin: a request that can change something (any method but GET, HEAD, OPTIONS) must not
   come from another site's page: a foreign or opaque `Origin`, or `Sec-Fetch-Site`
   cross-site / same-site, is refused with 403, token or not. Another port of localhost is
   another origin (and, for browsers, the same site).
3. Token: with a token, every path but /healthz and the dashboard (which has its own session)
   needs `Authorization: Bearer <token>`. Failed tries are counted per client (`Throttle`);
   past a few, that client gets 429 until its delay has passed, checked or not.
4. Read-only, then JSON: an API write must say `Content-Type: application/json` or carry a
   header no HTML form can send (`X-Tether-Client`, `Authorization`), else 415: so a form or a
   no-cors fetch cannot reach it even if a browser left `Origin` out.
5. The body limit: Content-Length and the bytes actually received.

Every check is a few comparisons on headers the server already parsed: no I/O, no allocation
beyond the error response, so the hot path (a worker's steps never pass here) is unchanged.
"""

from __future__ import annotations

import hmac
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from html import escape
from typing import Any

from fastapi.responses import HTMLResponse, JSONResponse
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
"""Host names every server answers to, whatever `allowed_hosts` adds."""

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_API_WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
"""The methods the API's routes take a write by; any other (TRACE, ...) is the router's 405."""
CLIENT_HEADER = "X-Tether-Client"
"""A header an API client may send instead of `Content-Type: application/json` on a write
without a body; its value is not checked (a browser cannot add it without CORS, which tether
never grants)."""

_FOREIGN_FETCH = (b"cross-site", b"same-site")
_DEFAULT_PORT = {"http": "80", "https": "443"}


def error_response(
    status: int,
    type: str,
    message: str,
    *,
    details: list[dict[str, Any]] | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """The API's one error shape: `{"error": {"type": ..., "message": ...}}`."""
    body: dict[str, Any] = {"type": type, "message": message}
    if details is not None:
        body["details"] = details
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def host_name(value: str) -> str:
    """The name part of a Host header or an --allowed-host entry: lower case, without the port,
    the brackets of an IPv6 address or a trailing dot ("[::1]:8000" -> "::1")."""
    value = value.strip().lower()
    if value.startswith("["):
        value = value[1:].partition("]")[0]
    elif value.count(":") == 1:  # name:port (a bare IPv6 address has several colons)
        value = value.partition(":")[0]
    return value.rstrip(".")


def allowed_host_names(names: Iterable[str]) -> frozenset[str]:
    """The loopback names plus `names` (each as `host_name` spells it); "*" allows any."""
    return LOOPBACK_HOSTS | {host_name(n) for n in names if n.strip()}


def same_origin(origin: str, host: str) -> bool:
    """Whether a browser's `Origin` ("http://127.0.0.1:8000") names the server the request was
    sent to (its `Host`, "127.0.0.1:8000"); the scheme's default port may be left out of
    either. "null" (a sandboxed or file: page) is no origin."""
    scheme, sep, netloc = origin.partition("://")
    if not sep or not netloc or "/" in netloc:
        return False
    default = _DEFAULT_PORT.get(scheme.lower())
    return _with_port(netloc.lower(), default) == _with_port(host.strip().lower(), default)


def _with_port(netloc: str, default: str | None) -> str:
    if netloc.rfind(":") > netloc.rfind("]"):  # a port is there ("[::1]" has none)
        return netloc
    return f"{netloc}:{default}" if default else netloc


class Throttle:
    """Failed credential checks per client address: the first FREE failures cost nothing,
    each one after that makes the client wait twice as long before its next try (1 s, 2 s,
    4 s ... up to MAX_DELAY). A success forgets the client's failures; so does FORGET seconds
    without one. At most MAX_CLIENTS addresses are remembered (the oldest go first), so a
    flood of addresses costs bounded memory."""

    FREE = 5
    MAX_DELAY = 60.0
    FORGET = 900.0
    MAX_CLIENTS = 10_000

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        # client -> (count, last failure), oldest first
        self._failures: OrderedDict[str, tuple[int, float]] = OrderedDict()

    def wait(self, client: str) -> float:
        """Seconds before `client` may try again (0: now)."""
        got = self._failures.get(client)
        if got is None:
            return 0.0
        count, last = got
        now = self.clock()
        if now - last > self.FORGET:
            del self._failures[client]
            return 0.0
        if count < self.FREE:
            return 0.0
        return max(0.0, last + min(self.MAX_DELAY, 2.0 ** (count - self.FREE)) - now)

    def failed(self, client: str) -> None:
        count, _ = self._failures.pop(client, (0, 0.0))  # re-inserted: newest last
        self._failures[client] = (count + 1, self.clock())
        if len(self._failures) > self.MAX_CLIENTS:
            self._failures.popitem(last=False)

    def succeeded(self, client: str) -> None:
        self._failures.pop(client, None)


class Guard:
    """The checks of the module docstring, in front of the API and the dashboard. The
    request's scope gets `state["tether_authorized"]`: whether it may see details a stranger
    may not (the token matched, or there is no token and the Host is this server's)."""

    def __init__(self, app: ASGIApp, token: str | None, max_body: int,
                 read_only: bool = False, allowed_hosts: Iterable[str] = (),
                 throttle: Throttle | None = None,
                 routes: Sequence[BaseRoute] | None = None) -> None:
        self.app = app
        self.routes = routes
        self.token = token.encode() if token else None
        self.max_body = max_body
        self.read_only = read_only
        self.hosts = allowed_host_names(allowed_hosts)
        self.any_host = "*" in self.hosts
        self.throttle = throttle or Throttle()

    def _declared(self, scope: Scope) -> bool:
        """Whether a route takes this method at this path (no routes given: assume so): a
        method the API does not declare is the router's 405, whatever its headers."""
        if self.routes is None:
            return True
        return any(route.matches(scope)[0] is Match.FULL for route in self.routes)

    def _host_ok(self, host: str, scope: Scope) -> bool:
        if self.any_host:
            return True
        name = host_name(host)
        if name in self.hosts:
            return True
        # The address the client connected to (the bound address, or the interface a
        # wildcard bind accepted on): an IP literal, never a name an attacker's DNS controls.
        server = scope.get("server")
        return bool(name) and server is not None and name == str(server[0]).lower()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = origin = fetch_site = auth = ctype = length = None
        custom = False
        for key, value in scope["headers"]:  # one pass; header names arrive lower-cased
            if key == b"host":
                host = value.decode("latin-1")
            elif key == b"origin":
                origin = value.decode("latin-1")
            elif key == b"sec-fetch-site":
                fetch_site = value.lower()
            elif key == b"authorization":
                auth = value
            elif key == b"content-type":
                ctype = value
            elif key == b"content-length":
                length = value
            elif key == b"x-tether-client":
                custom = bool(value.strip())
        path: str = scope["path"]
        method: str = scope["method"]
        ui = path == "/ui" or path.startswith("/ui/")
        health = path == "/healthz"
        host_ok = host is not None and self._host_ok(host, scope)
        if not host_ok and not health:
            await self._refuse(scope, receive, send, ui, 421, "MisdirectedRequest",
                               f"this server does not answer to the host {host!r}: start it "
                               "with --allowed-host NAME (or TETHER_ALLOWED_HOSTS) for each "
                               "name clients use")
            return
        writes = method not in SAFE_METHODS
        if writes and (fetch_site in _FOREIGN_FETCH or (
                origin is not None and not same_origin(origin, host or ""))):
            await self._refuse(scope, receive, send, ui, 403, "CrossOrigin",
                               "refused a request from another site's page: changes come "
                               "from this server's own pages or from clients that are not "
                               "browsers")
            return
        client = _client(scope)
        authorized = self.token is None and host_ok
        if self.token is not None and not ui:
            if auth is not None:
                wait = self.throttle.wait(client)
                if wait > 0:
                    await self._too_many(scope, receive, send, ui, wait)
                    return
                scheme, _, cred = auth.partition(b" ")
                if scheme.lower() == b"bearer" and hmac.compare_digest(cred.strip(),
                                                                       self.token):
                    self.throttle.succeeded(client)
                    authorized = True
                else:
                    self.throttle.failed(client)
            # /healthz answers without a token, but a wrong one is refused there too: else
            # its details would tell a guess right from wrong, unthrottled.
            if not authorized and (auth is not None or not health):
                await error_response(
                    401, "Unauthorized",
                    "missing or wrong bearer token (Authorization: Bearer ...)",
                    headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
                return
        scope.setdefault("state", {})["tether_authorized"] = authorized
        if ui:
            if self.token is not None and path == "/ui/login" and method == "POST":
                wait = self.throttle.wait(client)
                if wait > 0:
                    await self._too_many(scope, receive, send, ui, wait)
                    return
                send = self._watch_sign_in(send, client)
        elif writes:
            unmarked = method in _API_WRITES and not (custom or auth is not None or (
                ctype is not None and ctype.partition(b";")[0].strip().lower()
                == b"application/json"))
            # Matching the routes is the costly test: only for a request refused if declared.
            if (self.read_only or unmarked) and self._declared(scope):
                if self.read_only:
                    await error_response(
                        403, "ReadOnly", "this server is read-only (--read-only)")(
                        scope, receive, send)
                else:
                    await error_response(
                        415, "UnsupportedMediaType",
                        "send the body as Content-Type: application/json (a request without "
                        f"a body may send {CLIENT_HEADER}: <your client's name> instead)")(
                        scope, receive, send)
                return
        if length is not None:
            if not length.isdigit():
                await error_response(400, "BadRequest", "invalid Content-Length")(
                    scope, receive, send)
                return
            if int(length) > self.max_body:
                await error_response(413, "ContentTooLarge", self._message())(
                    scope, receive, send)
                return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max_body:
                    raise HTTPException(413, self._message())
            return msg

        await self.app(scope, limited, send)

    def _message(self) -> str:
        return f"request body is larger than {self.max_body} bytes"

    def _watch_sign_in(self, send: Send, client: str) -> Send:
        """`send`, counting the dashboard's answer to a sign-in: 401 is a wrong token."""

        async def watched(message: Message) -> None:
            if message["type"] == "http.response.start":
                if message["status"] == 401:
                    self.throttle.failed(client)
                elif message["status"] < 400:
                    self.throttle.succeeded(client)
            await send(message)

        return watched

    async def _too_many(self, scope: Scope, receive: Receive, send: Send, ui: bool,
                        wait: float) -> None:
        seconds = math.ceil(wait)
        await self._refuse(scope, receive, send, ui, 429, "TooManyRequests",
                           f"too many wrong tokens from this client: try again in {seconds} s",
                           headers={"Retry-After": str(seconds)})

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, ui: bool, status: int,
                      type: str, message: str, headers: Mapping[str, str] | None = None,
                      ) -> None:
        """The API's JSON error, or for the dashboard a plain page saying the same."""
        if ui:
            page = (f"<!doctype html><title>{status}</title><h1>Refused</h1>"
                    f"<p role=alert>{escape(message)}</p>")
            await HTMLResponse(page, status, headers=headers)(scope, receive, send)
            return
        await error_response(status, type, message, headers=headers)(scope, receive, send)


def _client(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else ""
