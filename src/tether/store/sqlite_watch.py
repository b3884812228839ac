"""Wake-ups between processes on one SQLite file (OthersWatch), the part SQLiteStore owns.

Postgres tells a worker of a run queued by another process (NOTIFY); SQLite has no such
signal, so a worker would only find such a run at its next poll (`poll_interval`, 0.25 s by
default): a run started through `tether serve`, or resumed from the CLI, waited that long. So
while a worker of the store claims, the store looks every few milliseconds whether another
connection has committed (PRAGMA data_version, a read of shared memory), and only then whether
a run is due for one of its claimers (`any_due`, one index range, read only), and wakes them.

Why not wake on every commit: another busy process commits every few milliseconds, and each
claim is a write transaction, which would take the file's one write lock from it that often.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .sqlite_io import SQLiteConnections

log = logging.getLogger("tether.store.sqlite")

EVERY = 0.005
"""Seconds between two looks at data_version while a worker claims."""
IDLE = 60.0
"""A claimer that has not claimed for this long is gone (a worker claims at least once per
`poll_interval`): the watch stops when none is left, and starts again at the next claim."""


class OthersWatch:
    """Sets `wake` when another connection has committed to `conns`' file and a run is due
    for one of the (version, agents) pairs claimed through this store lately: `any_due` is
    the query that says so, run with `read`. An in-memory database has no other connection."""

    def __init__(self, conns: SQLiteConnections,
                 read: Callable[[Callable[[sqlite3.Connection], Any]], Awaitable[Any]],
                 any_due: str, wake: asyncio.Event) -> None:
        self._version, self._read, self._any_due, self._wake = (
            conns.others_version, read, any_due, wake)
        self._off = conns.memory
        self._claimers: dict[tuple[str, str], float] = {}  # (version, agents) -> last claim
        self._task: asyncio.Task[None] | None = None

    def claimed(self, version: str, agents: str) -> None:
        """A worker claimed for `version` and `agents` (JSON): watch for it from now on."""
        if self._off:
            return
        self._claimers[(version, agents)] = time.monotonic()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._watch())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _watch(self) -> None:
        seen = self._version()
        try:
            while True:
                await asyncio.sleep(EVERY)
                now = time.monotonic()
                for key in [k for k, t in self._claimers.items() if now - t > IDLE]:
                    del self._claimers[key]
                if not self._claimers:
                    return
                current = self._version()
                if current is None or current == seen:
                    continue
                seen = current
                if not self._wake.is_set() and await self._due():
                    self._wake.set()
        except Exception as exc:  # a read failing (the store closing): the workers still poll
            log.debug("cross-process watch stopped: %s", exc)
        finally:
            if self._task is asyncio.current_task():
                self._task = None

    async def _due(self) -> bool:
        q, claimers = self._any_due, list(self._claimers)

        def job(conn: sqlite3.Connection) -> bool:
            return any(conn.execute(q, {"version": v, "agents": a}).fetchone()[0]
                       for v, a in claimers)

        return bool(await self._read(job))
