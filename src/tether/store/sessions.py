"""Dashboard sessions kept by the store (migration 0013's ui_sessions), so that signing out of
the dashboard ends a session on the server: the UiSessions protocol's SQLite part (on
SQLiteStore's reader and writer) and its Postgres part (on PostgresStore's connections), each
mixed into its store as the `sessions` attribute.

A session is named by the SHA-256 (hex) of its random id, never by the id itself: the id is
only in the operator's cookie. Times are the database clock, so that several `tether serve`
processes on one database agree on them.
"""

from __future__ import annotations

import sqlite3
from functools import cached_property
from typing import TYPE_CHECKING

from .migrate import queries
from .session_types import UiSessions

if TYPE_CHECKING:  # not imported at run time: a SQLite user loads no psycopg for this
    from .pg_conn import PgConnections
    from .sqlite_io import SQLiteConnections


class SQLiteSessions:
    def __init__(self, conns: SQLiteConnections) -> None:
        self._q = queries("sqlite")
        self._r = conns.read
        self._w = conns.write

    async def open_session(self, id_hash: str, ttl: float) -> int:
        q = self._q

        def job(conn: sqlite3.Connection) -> int:
            gone = conn.execute(q["prune_sessions"]).rowcount
            conn.execute(q["insert_session"], {"id_hash": id_hash, "ttl": float(ttl)})
            return max(0, gone)

        gone: int = await self._w(job)
        return gone

    async def session_alive(self, id_hash: str, touch_after: float = 60.0) -> bool:
        q = self._q["live_session"]
        row = await self._r(lambda c: c.execute(q, {"id_hash": id_hash}).fetchone())
        if row is None:
            return False
        last_seen, now = row
        if now - last_seen >= touch_after:
            touch = self._q["touch_session"]
            await self._w(lambda c: c.execute(touch, {"id_hash": id_hash}))
        return True

    async def revoke_session(self, id_hash: str) -> bool:
        q = self._q["revoke_session"]
        n: int = await self._w(lambda c: c.execute(q, {"id_hash": id_hash}).rowcount)
        return n > 0


class PgSessions:
    def __init__(self, conns: PgConnections) -> None:
        self._conns = conns
        self._q = conns.q

    async def open_session(self, id_hash: str, ttl: float) -> int:
        [(gone, _)] = await self._conns.fetchall(
            self._q["open_session"], {"id_hash": id_hash, "ttl": float(ttl)}, idempotent=True)
        return int(gone)

    async def session_alive(self, id_hash: str, touch_after: float = 60.0) -> bool:
        row = await self._conns.read_one(self._q["live_session"], {"id_hash": id_hash})
        if row is None:
            return False
        last_seen, now = row
        if now - last_seen >= touch_after:
            await self._conns.fetchall(self._q["touch_session"], {"id_hash": id_hash},
                                       idempotent=True)
        return True

    async def revoke_session(self, id_hash: str) -> bool:
        rows = await self._conns.fetchall(self._q["revoke_session"], {"id_hash": id_hash},
                                          idempotent=True)
        return bool(rows)


class SQLiteSessionsPart:
    """Mixed into SQLiteStore: its `sessions`, on its connections."""

    _conns: SQLiteConnections

    @cached_property
    def sessions(self) -> UiSessions:
        return SQLiteSessions(self._conns)


class PgSessionsPart:
    """Mixed into PostgresStore: its `sessions`, on its connections."""

    _conns: PgConnections

    @cached_property
    def sessions(self) -> UiSessions:
        return PgSessions(self._conns)
