"""A TCP proxy in front of a Postgres server, for tests of lost connections: every
connection through it can be cut at once (`cut()`), or at the next reply the server sends to
a statement sent from then on, on any of them (`cut_at_next_reply()`: the statement ran, and
committed if it was autocommit, but the client never hears of it: a commit whose outcome is
unknown). A notification to a LISTEN connection that sent nothing since is not such a reply:
it passes."""

from __future__ import annotations

import asyncio
import contextlib


class PgProxy:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.listen_port = 0
        self._server: asyncio.Server | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._armed = False
        self._asked: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        """The connections whose client sent something since the cut was armed."""
        self.cut_replies = 0
        self.down = False
        """Refuse connections (closed as soon as accepted): the server is gone."""

    async def __aenter__(self) -> PgProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.listen_port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self.cut()
        await self._server.wait_closed()

    def url(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.listen_port}/{dbname}?sslmode=disable"

    def cut(self) -> None:
        """Close every connection through the proxy, both ways."""
        for client, server in list(self._pairs):
            for w in (client, server):
                with contextlib.suppress(Exception):
                    w.transport.abort()
        self._pairs.clear()

    def cut_at_next_reply(self) -> None:
        self._armed = True
        self._asked.clear()

    async def _serve(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter
                     ) -> None:
        if self.down:
            c_writer.transport.abort()
            return
        try:
            s_reader, s_writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            c_writer.transport.abort()
            return
        pair = (c_writer, s_writer)
        self._pairs.add(pair)

        async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       replies: bool) -> None:
            try:
                while data := await reader.read(65536):
                    if not replies and self._armed:
                        self._asked.add(pair)
                    if replies and self._armed and pair in self._asked:
                        self._armed = False
                        self.cut_replies += 1
                        self._pairs.discard(pair)
                        c_writer.transport.abort()
                        s_writer.transport.abort()
                        return
                    writer.write(data)
                    await writer.drain()
            except (OSError, ConnectionError):
                pass
            finally:
                writer.transport.abort()

        await asyncio.gather(pump(c_reader, s_writer, False), pump(s_reader, c_writer, True))
        self._pairs.discard(pair)
