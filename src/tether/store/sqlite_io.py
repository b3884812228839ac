"""SQLite connections: the URL, the two connections and their group commit, beneath SQLiteStore
(sqlite.py).

Writes submitted during one event-loop iteration are committed together in one IMMEDIATE
transaction (group commit: one fsync for many steps); reads use a second connection and see
the last committed WAL snapshot. WAL mode with `synchronous=FULL` by default: a committed
checkpoint survives power loss, not just a process crash.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ..errors import ConfigError, LeaseLost, StoreError, StoreUnavailable
from .migrate import queries

Job = Callable[[sqlite3.Connection], Any]


class Fenced:
    """A write of the hot path (a journaled call, a step that only advances the run), batched
    with the others of its kind into one executemany per group commit. `sql` must change
    exactly one row, or the lease was lost; `then_sql` runs only where it did. When the fence
    fails, the caller's future gets LeaseLost(`lost`)."""

    __slots__ = ("lost", "params", "sql", "then_params", "then_sql")

    def __init__(self, sql: str, params: tuple[Any, ...], lost: str,
                 then_sql: str | None = None, then_params: tuple[Any, ...] = ()) -> None:
        self.sql, self.params, self.lost = sql, params, lost
        self.then_sql, self.then_params = then_sql, then_params

    def run(self, conn: sqlite3.Connection) -> bool:
        if conn.execute(self.sql, self.params).rowcount != 1:
            return False
        if self.then_sql is not None:
            conn.execute(self.then_sql, self.then_params)
        return True


Item = tuple["Job | Fenced", "asyncio.Future[Any]"]
_SYNC_MODES = {"OFF", "NORMAL", "FULL", "EXTRA"}
_MAX_BATCH = 1024


def parse_sqlite_url(url: str) -> tuple[str, dict[str, str]]:
    """sqlite:///relative.db, sqlite:////abs/path.db, sqlite:///:memory: -> (path, options)."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite" or parts.netloc:
        raise ConfigError(
            f"malformed SQLite URL {url!r}: expected sqlite:///path.db or sqlite:///:memory:"
        )
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not path:
        raise ConfigError(f"malformed SQLite URL {url!r}: no database path")
    opts = {k.lower(): v[-1] for k, v in parse_qs(parts.query).items()}
    return path, opts


class _Connections:
    """A write connection whose jobs are batched per event-loop iteration, and a read
    connection used directly. SQLite calls are short (microseconds, or one fsync per batch),
    so they run on the loop thread: a hand-off to a thread would cost more than it saves."""

    def __init__(self, connect: Callable[[], sqlite3.Connection], shared: bool) -> None:
        self.write = connect()
        self.read = self.write if shared else connect()
        self._pending: list[Item] = []
        self._loop = asyncio.get_running_loop()
        self._scheduled = False

    def close(self) -> None:
        if self._pending:
            self._flush()
        if self.read is not self.write:
            self.read.close()
        self.write.close()

    def submit(self, job: Job | Fenced) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._pending.append((job, fut))
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush)
        return fut

    def _flush(self) -> None:
        """Commit every write submitted since the last flush in one IMMEDIATE transaction
        (group commit: one fsync for all). If any job fails, the batch is rolled back and
        each job is retried in a transaction of its own, so a failing job is undone alone."""
        self._scheduled = False
        batch, self._pending = self._pending[:_MAX_BATCH], self._pending[_MAX_BATCH:]
        if self._pending:
            self._scheduled = True
            self._loop.call_soon(self._flush)
        results = self._transaction(batch)
        if results is None:
            results = []
            for item in batch:
                results.extend(self._transaction([item]) or [])
        _deliver(results)

    def _transaction(
        self, batch: list[Item]
    ) -> list[tuple[asyncio.Future[Any], bool, Any]] | None:
        """Run jobs in one transaction. None if a job of a multi-job batch failed (rolled
        back); a single job's failure is returned as its result.

        Fenced writes run last, one executemany per kind. The order of jobs within one batch
        is free: they were all submitted while none of them had committed."""
        conn = self.write
        results: list[tuple[asyncio.Future[Any], bool, Any]] = []
        fenced: dict[tuple[str, str | None], list[tuple[Fenced, asyncio.Future[Any]]]] = {}
        try:
            conn.execute("BEGIN IMMEDIATE")
            for job, fut in batch:
                if type(job) is Fenced:
                    fenced.setdefault((job.sql, job.then_sql), []).append((job, fut))
                else:
                    results.append((fut, True, job(conn)))  # type: ignore[operator]
            for (sql, then_sql), items in fenced.items():
                _run_fenced(conn, sql, then_sql, items, results)
            conn.execute("COMMIT")
        except Exception as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if len(batch) > 1:
                return None
            return [(batch[0][1], False, _wrap(exc))]
        return results

    def run_read(self, job: Job, snapshot: bool = False) -> Any:
        """Run a read job on the read connection. A single statement reads one consistent
        snapshot by itself (autocommit); `snapshot=True` wraps a multi-statement job in one
        read transaction."""
        conn = self.read
        try:
            if not snapshot or conn is self.write:
                return job(conn)
            conn.execute("BEGIN")
            try:
                return job(conn)
            finally:
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise _wrap(exc) from exc


def _run_fenced(
    conn: sqlite3.Connection, sql: str, then_sql: str | None,
    items: list[tuple[Fenced, asyncio.Future[Any]]],
    results: list[tuple[asyncio.Future[Any], bool, Any]],
) -> None:
    """One kind of fenced write for many runs: one executemany when every fence holds (the
    common case), else each on its own inside a savepoint-undone retry."""
    if len(items) > 1:
        conn.execute("SAVEPOINT fenced")
        if conn.executemany(sql, [job.params for job, _ in items]).rowcount == len(items):
            if then_sql is not None:
                conn.executemany(then_sql, [job.then_params for job, _ in items])
            conn.execute("RELEASE fenced")
            results.extend((fut, True, None) for _, fut in items)
            return
        conn.execute("ROLLBACK TO fenced")
        conn.execute("RELEASE fenced")
    for job, fut in items:
        if job.run(conn):
            results.append((fut, True, None))
        else:
            results.append((fut, False, LeaseLost(job.lost)))


def _deliver(results: list[tuple[asyncio.Future[Any], bool, Any]]) -> None:
    for fut, ok, value in results:
        if fut.done():  # the caller was cancelled; the write still happened or not, atomically
            continue
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)


def _wrap(exc: BaseException) -> BaseException:
    if isinstance(exc, sqlite3.Error):
        err = StoreError(f"SQLite error: {exc}")
        err.__cause__ = exc
        return err
    return exc


class SQLiteIO:
    """SQLiteStore's settings and connections, and the write/read entry points its Store
    methods run their jobs through."""

    def __init__(self, url: str, *, synchronous: str | None = None, busy_timeout: float = 30.0):
        self.url = url
        self.path, opts = parse_sqlite_url(url)
        sync = (synchronous or opts.get("synchronous", "FULL")).upper()
        if sync not in _SYNC_MODES:
            raise ConfigError(f"synchronous must be one of {sorted(_SYNC_MODES)}, got {sync!r}")
        self.synchronous = sync
        self.busy_timeout = busy_timeout
        self.memory = self.path == ":memory:"
        self._q = queries("sqlite")
        self._conns: _Connections | None = None
        self.work_available = asyncio.Event()
        self.effects_available = asyncio.Event()

    # -- lifecycle -------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        if not self.memory:
            parent = os.path.dirname(os.path.abspath(self.path))
            if not os.path.isdir(parent):
                raise StoreUnavailable(
                    f"cannot open {self.url}: directory {parent!r} does not exist"
                )
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=self.busy_timeout)
            if not self.memory:
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot open {self.url}: {exc}") from exc
        return conn

    async def close(self) -> None:
        conns, self._conns = self._conns, None
        if conns is not None:
            conns.close()

    def _w(self, job: Job | Fenced) -> asyncio.Future[Any]:
        if self._conns is None:
            raise StoreError("store is not open")
        return self._conns.submit(job)

    async def _r(self, job: Job, snapshot: bool = False) -> Any:
        if self._conns is None:
            raise StoreError("store is not open")
        return self._conns.run_read(job, snapshot)
