"""Postgres connections, beneath PostgresStore (postgres.py): the settings a URL gives, the pool,
error translation, one-statement reads and writes, coalesced reads and transactions
(PgConnections). The group-commit writers are in pg_commit.py, the LISTEN/NOTIFY listener in
pg_listen.py; each is given this part.

Connections: a psycopg 3 async pool (autocommit) for everything but step writes; the writers
keep pooled connections of their own (pg_commit.py), the listener a dedicated one. Most
operations are one statement.

Coalesced reads: a short per-run read (get_run, load_journal...) made while another is in
flight waits for the next batch, which goes in one pipeline on one connection.

Durability: `synchronous_commit=on` is set on every connection: a commit acknowledged to a
worker has been flushed to the WAL.

Reconnects (a restart, a failover to a promoted standby, which a multi-host URL with
target_session_attrs=read-write finds): each part (the pool, the group committer's writers, the
listener) retries fast (0.1 s first, doubling, at most 1 s apart) and says once per outage
when it is connected again, and where (Reconnects: one log line, and the count read by
tether_store_reconnects_total).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from functools import cache
from typing import Any, Final, TypeVar

import psycopg
from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.errors import PipelineAborted, TransactionRollback
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from psycopg_pool.base import AttemptWithBackoff

from ..config import redact
from ..errors import ConfigError, StoreError, StoreUnavailable
from .audit import Audit
from .migrate import latest, migrations, queries
from .pg_pooler import pooler_options

log = logging.getLogger("tether.store.postgres")

_SCHEMES: Final = ("postgresql", "postgres", "postgresql+psycopg")
_MIGRATE_LOCK: Final = 0x7465746865720001  # b"tether\0\1": one key for every tether database
_SYNC_MODES: Final = frozenset({"on", "off", "local", "remote_write", "remote_apply"})
MAX_BATCH: Final = 1000
"""Statements per coalesced read batch or group commit, at most."""
TX_ATTEMPTS: Final = 3
"""Runs of a transaction (or a writer's statement) a deadlock or serialization failure may
undo before the error is raised."""
BEGIN: Final = b"BEGIN"

T = TypeVar("T")
Conn = AsyncConnection[TupleRow]
Params = dict[str, Any]
TxBody = Callable[[Conn], Awaitable[T]]
_ReadJob = tuple[bytes, Params, "asyncio.Future[list[TupleRow]]"]


@cache
def pg_queries() -> dict[str, bytes]:
    # bytes: psycopg takes them as they are, with no per-call encoding.
    return {name: sql.encode() for name, sql in queries("postgres").items()}


def is_disconnect(exc: BaseException) -> bool:
    """The connection failed, as opposed to the server refusing a statement."""
    if isinstance(exc, PoolTimeout):
        return True
    if not isinstance(exc, psycopg.OperationalError):
        return False
    if isinstance(exc, PipelineAborted):
        return False
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in {"57P01", "57P02", "57P03"}


class FastBackoff(AttemptWithBackoff):
    """The pool's reconnection attempts: the first after 0.1 s (psycopg_pool waits 1 s, then
    doubles: 3.4 s into an outage, every lease of a 5 s TTL had expired), at most 1 s apart."""

    INITIAL_DELAY = 0.1
    MAX_DELAY = 1.0

    def update_delay(self, now: float) -> None:
        super().update_delay(now)
        self.delay = min(self.delay, self.MAX_DELAY)


PARTS: Final = ("pool", "committer", "listener")
"""The parts of the store that hold connections, as reconnects name them."""


class Reconnects:
    """Per part of the store: whether it lost its connection, and how many times it got one
    back. `lost(part)` when a connection fails; `back(part, conn)` when one is made: the
    first after a loss logs where it connected and how long after, and counts."""

    def __init__(self, safe_url: str) -> None:
        self.safe_url = safe_url
        self.count = dict.fromkeys(PARTS, 0)
        self._since: dict[str, float] = {}

    def lost(self, part: str) -> None:
        self._since.setdefault(part, time.monotonic())

    def back(self, part: str, conn: Conn) -> None:
        since = self._since.pop(part, None)
        if since is None:
            return
        self.count[part] += 1
        try:
            where = f"{conn.info.host}:{conn.info.port}"
        except psycopg.Error:
            where = "?"
        log.warning("Postgres %s reconnected to %s (%s) %.2f s after its connection was lost",
                    part, where, self.safe_url, time.monotonic() - since)


class _Pool(AsyncConnectionPool[Conn]):
    """The pool, with FastBackoff and its reconnects counted (psycopg_pool's own hooks,
    _add_connection and _connect, with their signatures of psycopg_pool 3.2 and 3.3)."""

    reconnects: Reconnects | None = None

    async def _add_connection(self, attempt: AttemptWithBackoff | None,
                              growing: bool = False) -> None:
        await super()._add_connection(attempt or FastBackoff(timeout=self.reconnect_timeout),
                                      growing)

    async def _connect(self, timeout: float | None = None) -> Conn:
        conn = await super()._connect(timeout)
        if self.reconnects is not None:
            self.reconnects.back("pool", conn)
        return conn


_POOL_OPTIONS: Final = ("pool_min", "pool_max", "pool_timeout")


def pool_options(rest: str, safe_url: str) -> tuple[str, dict[str, float]]:
    """Take tether's own URL query options out (libpq refuses unknown ones): pool_min and
    pool_max (connections per process), pool_timeout (seconds to wait for a free one)."""
    base, sep, query = rest.partition("?")
    if not sep:
        return rest, {}
    kept, found = [], {}
    for item in query.split("&"):
        key, _, value = item.partition("=")
        if key not in _POOL_OPTIONS:
            kept.append(item)
            continue
        try:
            number = float(value)
        except ValueError:
            number = -1.0
        whole = key != "pool_timeout"
        if number <= 0 or (whole and not number.is_integer()):
            raise ConfigError(f"{key} in {safe_url!r} must be a positive "
                              f"{'integer' if whole else 'number'}, got {value!r}")
        found[key] = number
    return base + ("?" + "&".join(kept) if kept else ""), found


class PgConnections:
    """The connections part: the settings, the pool and the plumbing every statement runs on
    (one-statement reads and writes, coalesced reads, transactions, error translation)."""

    def __init__(
        self,
        url: str,
        *,
        min_size: int = 2,
        max_size: int = 10,
        connect_timeout: float = 5.0,
        pool_timeout: float = 15.0,
        synchronous_commit: str = "on",
    ):
        self.url = url
        self.safe_url = redact(url)
        scheme, sep, rest = url.partition("://")
        if scheme.lower() not in _SCHEMES or not sep:
            raise ConfigError(
                f"malformed Postgres URL {self.safe_url!r}: expected postgresql://user@host:port/db"
            )
        if synchronous_commit not in _SYNC_MODES:
            raise ConfigError(
                f"synchronous_commit must be one of {sorted(_SYNC_MODES)}, "
                f"got {synchronous_commit!r}"
            )
        rest, pool = pool_options(rest, self.safe_url)
        min_size = int(pool.get("pool_min", min_size))
        max_size = int(pool.get("pool_max", max_size))
        if max_size < 2:
            raise ConfigError("max_size (pool_max) must be at least 2 (a writer holds one "
                              "connection)")
        pool_timeout = pool.get("pool_timeout", pool_timeout)
        rest, pool_mode, listen_url = pooler_options(rest, self.safe_url)  # (pg_pooler.py)
        self.transaction_pooling = pool_mode == "transaction"
        if self.transaction_pooling and synchronous_commit != "on":
            raise ConfigError("through transaction pooling (pool_mode=transaction) "
                              "synchronous_commit is the server's: set it there (ALTER ROLE "
                              "... SET synchronous_commit), not in tether")
        self._passwords: list[str] = []  # masked in messages (the URL's, listen_url's)
        self._conninfo = self._conninfo_of(rest, None if self.transaction_pooling
                                           else synchronous_commit, connect_timeout)
        self._listen_conninfo = self._conninfo
        if listen_url is not None:
            scheme, sep, listen_rest = listen_url.partition("://")
            if scheme.lower() not in _SCHEMES or not sep:
                raise ConfigError(f"malformed listen_url {redact(listen_url)!r}: expected "
                                  "postgresql://user@host:port/db")
            self._listen_conninfo = self._conninfo_of(listen_rest, synchronous_commit,
                                                      connect_timeout)
        # No server-side prepared statements through transaction pooling: one prepared on
        # one server connection does not exist on the next.
        self._kwargs: dict[str, Any] = {"autocommit": True}
        if self.transaction_pooling:
            self._kwargs["prepare_threshold"] = None
        self.min_size = max(1, min(min_size, max_size))
        self.max_size = max_size
        self.connect_timeout = connect_timeout
        self.pool_timeout = pool_timeout
        self.synchronous_commit = synchronous_commit
        self.q = pg_queries()
        self._pool: AsyncConnectionPool[Conn] | None = None
        self._healer: asyncio.Task[None] | None = None
        self._reads: deque[_ReadJob] = deque()
        self._reader: asyncio.Task[None] | None = None
        self._reading = False  # a hot read is in flight
        self.reconnects = Reconnects(self.safe_url)

    def _conninfo_of(self, rest: str, synchronous_commit: str | None,
                     connect_timeout: float) -> str:
        try:
            params = conninfo_to_dict("postgresql://" + rest)  # libpq knows no "+psycopg"
        except psycopg.Error as exc:
            raise ConfigError(f"malformed Postgres URL {redact('postgresql://' + rest)!r}"
                              ) from exc
        if params.get("password"):
            self._passwords.append(str(params["password"]))
        if synchronous_commit is not None:  # (PgBouncer refuses the options parameter)
            options = str(params.get("options") or "")
            params["options"] = f"{options} -c synchronous_commit={synchronous_commit}".strip()
        params.setdefault("application_name", "tether")
        params.setdefault("connect_timeout", max(2, round(connect_timeout)))
        # Find a dead peer (no FIN, e.g. a failed-over host) in seconds, not hours.
        params.setdefault("keepalives", 1)
        params.setdefault("keepalives_idle", 10)
        params.setdefault("keepalives_interval", 5)
        params.setdefault("keepalives_count", 3)
        return make_conninfo("", **params)

    # -- errors ----------------------------------------------------------------------------

    def message(self, exc: BaseException) -> str:
        """The driver error's text, one line, the password masked."""
        text = str(exc).strip() or type(exc).__name__
        for password in self._passwords:
            text = text.replace(password, "***")
        return text.replace("\n", " ").replace("\t", " ")

    def error(self, exc: BaseException) -> StoreError:
        """The store-edge translation of a driver error, chained to it."""
        err: StoreError
        if is_disconnect(exc):
            self.reconnects.lost("pool")
            err = StoreUnavailable(
                f"Postgres at {self.safe_url} is unavailable: {self.message(exc)}"
            )
        else:
            err = StoreError(f"Postgres error: {self.message(exc)}")
        err.__cause__ = exc
        return err

    # -- lifecycle -------------------------------------------------------------------------

    async def connect(self) -> Conn:
        """The listener's connection, outside the pool (the caller closes it): on listen_url
        when one is given (pg_pooler.py)."""
        return await AsyncConnection.connect(self._listen_conninfo, autocommit=True)

    @property
    def is_open(self) -> bool:
        return self._pool is not None

    async def open(self) -> None:
        """Open the pool, its minimum of connections made. Raises StoreUnavailable."""
        pool = _Pool(
            self._conninfo,
            kwargs=self._kwargs,
            min_size=self.min_size,
            max_size=self.max_size,
            timeout=self.pool_timeout,
            name="tether",
            open=False,
        )
        pool.reconnects = self.reconnects
        try:
            await pool.open(wait=True, timeout=self.connect_timeout + 1.0)
        except (psycopg.Error, OSError) as exc:
            await pool.close()
            raise StoreUnavailable(
                f"cannot open a connection pool to Postgres at {self.safe_url}: "
                f"{self.message(exc)}"
            ) from exc
        self._pool = pool

    async def close(self) -> None:
        """Answer the reads in flight, then close the pool (its users have given back their
        connections: close the writers first)."""
        reader, self._reader = self._reader, None
        if reader is not None:
            await asyncio.wait([reader])  # answers the callers it has, from the open pool
        healer, self._healer = self._healer, None
        if healer is not None:  # cancelling pool.check() midway would leak the conns it holds
            done, _ = await asyncio.wait([healer], timeout=self.connect_timeout)
            if not done:
                healer.cancel()
                await asyncio.wait([healer])
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    def pool_statistics(self) -> dict[str, int]:
        """The pool now (see Store.pool_statistics); {} when it is not open."""
        pool = self._pool
        if pool is None:
            return {}
        try:
            stats = pool.get_stats()  # may be read from a scraping thread: a snapshot
        except RuntimeError:  # its counters changed size while copied: the next scrape
            return {}
        size, idle = stats.get("pool_size", 0), stats.get("pool_available", 0)
        out = {"in_use": max(0, size - idle), "idle": idle, "max": stats.get("pool_max", 0),
               "waiting": stats.get("requests_waiting", 0)}
        for part, n in self.reconnects.count.items():
            out[f"reconnects_{part}"] = n
        return out

    def pool(self) -> AsyncConnectionPool[Conn]:
        """The open pool; StoreError if the store is not open."""
        if self._pool is None:
            raise StoreError("store is not open")
        return self._pool

    async def fetchall(
        self, query: bytes, params: Params | None = None, *, idempotent: bool = False
    ) -> list[TupleRow]:
        """One statement on a pooled connection. An idempotent one is retried once if its
        connection turns out to be dead (a database restart kills every pooled one)."""
        pool = self.pool()
        retry = idempotent
        while True:
            try:
                async with pool.connection() as conn:
                    cur = await conn.execute(query, params)
                    return await cur.fetchall()
            except psycopg.Error as exc:
                if not is_disconnect(exc):
                    raise self.error(exc) from exc
                if not retry or isinstance(exc, PoolTimeout):
                    self.heal()
                    raise self.error(exc) from exc
                retry = False
                # What killed this connection (a restart, a failover) likely killed its idle
                # peers too: test them before the retry takes one.
                await pool.check()

    async def read(self, query: bytes, params: Params | None = None) -> list[TupleRow]:
        """fetchall of a read (retried once on a dead connection)."""
        return await self.fetchall(query, params, idempotent=True)

    async def read_one(self, query: bytes, params: Params | None = None) -> TupleRow | None:
        rows = await self.fetchall(query, params, idempotent=True)
        return rows[0] if rows else None

    async def read_by_index(self, query: bytes, params: Params) -> list[TupleRow]:
        """A bounded read meant to walk an index (a keyset page, a capped count, a chart's
        range), with sorting and sequential scans off for its plan, so that no statistics
        make the planner scan or sort every matching row instead (never analyzed, 200,000
        parked runs looked like 242 rows, sorted whole: 400 ms a page); and JIT off, as the
        disabled plans' cost passes its threshold (compiling took 350 ms). One round trip."""
        async def body(conn: Conn) -> list[TupleRow]:
            async with conn.pipeline():
                await conn.execute(BEGIN)
                await conn.execute(b"SELECT set_config('enable_sort', 'off', true), set_config("
                                   b"'enable_seqscan', 'off', true), set_config('jit', 'off', true)")
                cur = await conn.execute(query, params)
            return await cur.fetchall()

        return await self.transaction(body)

    async def hot_read(self, query: bytes, params: Params) -> list[TupleRow]:
        """A short per-run read (get_run, load_journal...). The first caller runs it at once;
        reads issued while one is in flight queue up and go together, in one pipeline, on one
        connection: a worker claiming a thousand runs, or a thousand runtime.wait calls, cost
        one round trip per batch, not a pool checkout each."""
        self.pool()
        if not self._reading:
            self._reading = True
            try:
                return await self.fetchall(query, params, idempotent=True)
            finally:
                self._reading = False
                if self._reads:
                    self._start_reader()
        fut: asyncio.Future[list[TupleRow]] = asyncio.get_running_loop().create_future()
        self._reads.append((query, params, fut))
        return await fut

    async def hot_read_one(self, query: bytes, params: Params) -> TupleRow | None:
        rows = await self.hot_read(query, params)
        return rows[0] if rows else None

    def _start_reader(self) -> None:
        self._reading = True
        self._reader = asyncio.create_task(self._read_loop(), name="tether-pg-reader")

    async def _read_loop(self) -> None:
        try:
            while self._reads:
                batch = [self._reads.popleft() for _ in range(min(len(self._reads), MAX_BATCH))]
                await self._read_batch(batch)
        finally:
            self._reading = False
            if self._reads:  # arrived as we finished, or we were cancelled
                self._start_reader()

    async def _read_batch(self, batch: list[_ReadJob]) -> None:
        groups: dict[bytes, list[_ReadJob]] = {}
        for job in batch:
            groups.setdefault(job[0], []).append(job)
        try:
            async with self.pool().connection() as conn:
                plan: list[tuple[psycopg.AsyncCursor[TupleRow], list[_ReadJob]]] = []
                failure: psycopg.Error | None = None
                try:
                    async with conn.pipeline():
                        try:
                            for query, jobs in groups.items():
                                cur = conn.cursor()
                                await cur.executemany(query, [j[1] for j in jobs],
                                                      returning=True)
                                plan.append((cur, jobs))
                        except psycopg.Error as exc:  # caught here, or psycopg logs it
                            failure = exc
                except psycopg.Error:
                    if failure is None:
                        raise
                if failure is not None:
                    raise failure
                for cur, jobs in plan:
                    results = [await cur.fetchall()]
                    while cur.nextset():
                        results.append(await cur.fetchall())
                    for (_, _, fut), rows in zip(jobs, results, strict=True):
                        if not fut.done():
                            fut.set_result(rows)
        except Exception:  # one bad read or a lost connection: each read on its own, retried
            for query, params, fut in batch:
                if fut.done():
                    continue
                try:
                    rows = await self.fetchall(query, params, idempotent=True)
                except Exception as exc:
                    if not fut.done():
                        fut.set_exception(exc)
                else:
                    if not fut.done():
                        fut.set_result(rows)

    def heal(self) -> None:
        """After a lost connection, test the pooled idle ones in the background (check()
        takes them all out of the pool at once, so no later caller gets a dead one)."""
        pool, healer = self._pool, self._healer
        self.reconnects.lost("pool")
        if pool is not None and (healer is None or healer.done()):
            self._healer = asyncio.create_task(pool.check(), name="tether-pg-pool-check")

    async def transaction(self, body: TxBody[T], *, body_commits: bool = False) -> T:
        """body(conn) in one transaction on a pooled connection: body sends BEGIN first, in
        its first pipeline (conn.transaction() would cost two more round trips); this commits
        after it, unless `body_commits` (it sent COMMIT in its last pipeline). A deadlock or
        serialization failure undoes it whole, so it runs again (a few times); a TetherError
        it raises (LeaseLost, RunNotFound...) rolls it back."""
        pool = self.pool()
        for attempt in range(1, TX_ATTEMPTS + 1):
            try:
                async with pool.connection() as conn:
                    try:
                        result = await body(conn)
                        if not body_commits:
                            await conn.execute(b"COMMIT")
                    except BaseException:
                        await rollback(conn)
                        raise
                    return result
            except psycopg.Error as exc:
                if retryable(exc) and attempt < TX_ATTEMPTS:
                    log.debug("transaction rolled back (%s); retrying", self.message(exc))
                    continue
                if is_disconnect(exc):
                    self.heal()
                raise self.error(exc) from exc
        raise AssertionError("unreachable")


    # -- schema ----------------------------------------------------------------------------

    async def schema_version(self) -> tuple[int, int]:
        """(migration applied, latest shipped)."""
        q = self.q
        try:
            async with self.pool().connection() as conn:
                row = await (await conn.execute(q["schema_table"])).fetchone()
                current = 0
                if row is not None and row[0]:
                    row = await (await conn.execute(q["schema_applied"])).fetchone()
                    current = int(row[0]) if row is not None else 0
        except psycopg.Error as exc:
            raise self.error(exc) from exc
        return current, latest("postgres")

    async def migrate(self) -> list[int]:
        """Apply the pending migrations in one transaction, under an advisory lock."""
        q = self.q
        done: list[int] = []
        try:
            async with self.pool().connection() as conn, conn.transaction():
                # Taken before anything else: a second migrator waits here, then sees our work.
                await conn.execute(q["migrate_lock"], {"key": _MIGRATE_LOCK})
                await conn.execute(q["create_schema_version"])
                row = await (await conn.execute(q["schema_applied"])).fetchone()
                current = int(row[0]) if row is not None else 0
                for mig in migrations("postgres"):
                    if mig.version <= current:
                        continue
                    await conn.execute(mig.sql.encode())  # no params: sent as one script
                    await conn.execute(
                        q["record_migration"], {"version": mig.version, "name": mig.name}
                    )
                    done.append(mig.version)
        except psycopg.Error as exc:
            err = self.error(exc)
            raise type(err)(f"migrating {self.safe_url} failed: {err}") from exc
        return done

    async def audited(self, query: bytes, params: Params, audit: Audit | None,
                      happened: Callable[[list[TupleRow]], bool]) -> list[TupleRow]:
        """One statement's rows, and (in its transaction) the audit row when `happened`."""
        if audit is None:
            return await self.fetchall(query, params)
        insert = self.q["insert_audit"]

        async def body(conn: Conn) -> list[TupleRow]:
            async with conn.pipeline():
                await conn.execute(BEGIN)
                cur = await conn.execute(query, params)
            rows = await cur.fetchall()
            if happened(rows):
                await conn.execute(insert, audit.params())
            return rows

        return await self.transaction(body)

async def rollback(conn: Conn) -> None:
    """End a failed explicit transaction so the connection goes back to the pool clean.
    Always send ROLLBACK, whatever libpq reports: after a cancellation or an error
    mid-pipeline it can read IDLE while the server still holds the transaction open, with its
    row locks, and the next user would run inside it. (ROLLBACK outside a transaction is only
    a warning, and psycopg drops its prepared-statement cache on it, so statements prepared in
    the aborted transaction are not reused.) If that fails, close the connection: the pool
    replaces it."""
    if conn.closed:
        return
    try:
        await conn.execute(b"ROLLBACK")
        if conn.info.transaction_status == TransactionStatus.IDLE:
            return
    except (psycopg.Error, OSError):
        pass
    with contextlib.suppress(psycopg.Error, OSError):
        await conn.close()


def retryable(exc: psycopg.Error) -> bool:
    """A deadlock victim or a serialization failure (SQLSTATE class 40): the transaction was
    undone whole, so it can run again. (psycopg's DeadlockDetected is not a subclass of its
    TransactionRollback.)"""
    return isinstance(exc, TransactionRollback) or (exc.sqlstate or "").startswith("40")
