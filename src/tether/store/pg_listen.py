"""Postgres wake-ups (Listener): a dedicated connection LISTENing on `tether_work` and
`tether_effects`, given the connections part (pg_conn.py) and owned by PostgresStore.

A write that makes a run claimable (or an effect due) calls pg_notify in the same
transaction; the listener turns notifications into `work_available` / `effects_available`,
at most one wake-up per debounce window, and reconnects with backoff when its connection
dies (workers poll as well, so a missed wake-up only costs latency).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

import psycopg

from ..errors import StoreUnavailable
from .pg_conn import Conn, PgConnections

log = logging.getLogger("tether.store.postgres")

CHANNEL: Final = "tether_work"
EFFECTS_CHANNEL: Final = "tether_effects"
_BACKOFF_MIN, _BACKOFF_MAX = 0.1, 1.0  # (see FastBackoff in pg_conn.py)


class Listener:
    """The LISTEN/NOTIFY part. Interface: open() makes its connection (the store's first,
    so a refused connection fails fast with the server's reason); start() runs the listening
    task; close() stops it and closes the connection (idempotent)."""

    def __init__(self, conns: PgConnections, work_available: asyncio.Event,
                 effects_available: asyncio.Event, debounce: float) -> None:
        self._conns = conns
        self._events = {CHANNEL: work_available, EFFECTS_CHANNEL: effects_available}
        self.debounce = debounce
        self._conn: Conn | None = None
        self._task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        """Connect and LISTEN. Raises StoreUnavailable with the server's reason (refused, no
        such database, bad password) or a timeout."""
        conns = self._conns
        try:
            async with asyncio.timeout(conns.connect_timeout + 1.0):
                self._conn = await self._connect()
        except (psycopg.Error, OSError, TimeoutError) as exc:
            reason = (f"no answer within {conns.connect_timeout:g} s"
                      if isinstance(exc, TimeoutError) else conns.message(exc))
            raise StoreUnavailable(
                f"cannot connect to Postgres at {conns.safe_url}: {reason}"
            ) from exc

    def start(self) -> None:
        self._task = asyncio.create_task(self._listen_loop(), name="tether-pg-listener")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
        conn, self._conn = self._conn, None  # if the task never started
        if conn is not None:
            with contextlib.suppress(psycopg.Error, OSError):
                await conn.close()

    async def _connect(self) -> Conn:
        conn = await self._conns.connect()
        try:
            await conn.execute(f"LISTEN {CHANNEL}; LISTEN {EFFECTS_CHANNEL}".encode())
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _listen_loop(self) -> None:
        backoff = _BACKOFF_MIN
        conn, self._conn = self._conn, None
        safe_url = self._conns.safe_url
        while True:
            try:
                if conn is None:
                    conn = await self._connect()
                    # Notifications sent while we were away are lost: assume work is waiting.
                    self._events[CHANNEL].set()
                    self._events[EFFECTS_CHANNEL].set()
                    backoff = _BACKOFF_MIN
                    self._conns.reconnects.back("listener", conn)
                await self._pump(conn)
            except Exception as exc:  # the listener must outlive any single failure
                self._conns.reconnects.lost("listener")
                log.warning("LISTEN connection to %s failed (%s); reconnecting in %.1f s",
                            safe_url, self._conns.message(exc), backoff)
            finally:
                if conn is not None:
                    with contextlib.suppress(psycopg.Error, OSError):
                        await conn.close()
                    conn = None
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _BACKOFF_MAX)

    async def _pump(self, conn: Conn) -> None:
        """Turn notifications into wake-ups, at most one per event per debounce window: the
        first notification of a burst sets its event at once, and the rest of the burst
        (whatever arrives within the window) sets it once more at the end."""
        events = self._events
        while True:
            async for n in conn.notifies(stop_after=1):
                events[n.channel].set()
            seen = True
            while seen:
                channels = set()
                async for n in conn.notifies(timeout=self.debounce):
                    channels.add(n.channel)
                for channel in channels:
                    events[channel].set()
                seen = bool(channels)
