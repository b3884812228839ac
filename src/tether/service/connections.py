"""Slow and surplus clients, dealt with where uvicorn reads bytes: each connection must
deliver the request it has begun (headers and body; a new connection, its first request)
within `request_timeout` seconds, and at most `max_connections` are open at once.

This cannot be an ASGI middleware: the app is only called once uvicorn has parsed a
request's headers, so a client that never finishes them (slowloris) would never reach it.
uvicorn has no such bound of its own (`timeout_keep_alive` starts after a response, and is
cancelled by the first byte of the next request), so `http_protocol` returns uvicorn's
HTTP/1.1 protocol (httptools' when installed, as uvicorn would pick it, else h11's) with
one timer per connection: started when a request begins, stopped when its last byte
arrives, never pushed back by a byte that trickles in.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable


def _plain(status: bytes, text: bytes, extra: bytes = b"") -> bytes:
    """A whole response written straight to the socket, the connection closed after it."""
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: text/plain; charset=utf-8\r\n"
            + b"content-length: " + str(len(text)).encode() + b"\r\n" + extra
            + b"connection: close\r\n\r\n" + text)


_TIMED_OUT = _plain(b"408 Request Timeout", b"the request did not arrive in time")
_TOO_MANY = _plain(b"503 Service Unavailable", b"too many connections: try again soon",
                   b"retry-after: 1\r\n")


class RequestDeadline:
    """The time a connection has left to deliver the request it is sending. On expiry the
    connection is closed, with a 408 first when no request of it has reached the app (after
    that, the app's request sees a disconnect)."""

    __slots__ = ("_loop", "_timeout", "_timer", "_transport", "_unanswered")

    def __init__(self, loop: asyncio.AbstractEventLoop, transport: asyncio.Transport,
                 timeout: float, unanswered: Callable[[], bool]) -> None:
        self._loop = loop
        self._transport = transport
        self._timeout = timeout
        self._timer: asyncio.TimerHandle | None = None
        self._unanswered = unanswered

    def start(self) -> None:
        """Start the clock unless it runs already: later bytes of the same request must not
        push the deadline back."""
        if self._timer is None:
            self._timer = self._loop.call_later(self._timeout, self._expire)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        transport = self._transport
        if transport.is_closing():
            return
        if self._unanswered():
            transport.write(_TIMED_OUT)
        transport.close()


def _over(open_now: int, limit: int | None, transport: asyncio.Transport) -> bool:
    """Refuse a connection past the limit at once, before reading a byte of it."""
    if limit is None or open_now <= limit:
        return False
    transport.write(_TOO_MANY)
    transport.close()
    return True


def http_protocol(request_timeout: float, max_connections: int | None
                  ) -> type[asyncio.Protocol]:
    """The protocol class for `uvicorn.Config(http=...)`."""
    if importlib.util.find_spec("httptools") is None:
        return _h11(request_timeout, max_connections)
    return _httptools(request_timeout, max_connections)


def _h11(request_timeout: float, max_connections: int | None) -> type[asyncio.Protocol]:
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Protocol(H11Protocol):
        deadline: RequestDeadline

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            # Before any request, h11 is IDLE: a 408 is still a well-formed answer.
            self.deadline = RequestDeadline(self.loop, transport, request_timeout,
                                            lambda: self.conn.their_state is h11.IDLE)
            if not _over(len(self.connections), max_connections, transport):
                self.deadline.start()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            state = self.conn.their_state
            if state is h11.SEND_BODY or (state is h11.IDLE and self.conn.trailing_data[0]):
                self.deadline.start()  # headers or body still to come
            else:
                self.deadline.stop()

        def connection_lost(self, exc: Exception | None) -> None:
            self.deadline.stop()
            super().connection_lost(exc)

    return Protocol


def _httptools(request_timeout: float, max_connections: int | None) -> type[asyncio.Protocol]:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class Protocol(HttpToolsProtocol):
        deadline: RequestDeadline
        headers_done = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.deadline = RequestDeadline(self.loop, transport, request_timeout,
                                            lambda: not self.headers_done)
            if not _over(len(self.connections), max_connections, transport):
                self.deadline.start()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self.headers_done = False
            self.deadline.start()

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            self.headers_done = True

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self.deadline.stop()

        def connection_lost(self, exc: Exception | None) -> None:
            self.deadline.stop()
            super().connection_lost(exc)

    return Protocol
