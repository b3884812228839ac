"""Postgres connection plumbing: the pool, error translation, coalesced reads, transactions and
the LISTEN/NOTIFY listener, beneath PostgresStore (postgres.py); the group-commit writer is in
pg_commit.py.

Connections: a psycopg 3 async pool (autocommit) for everything but step writes; two pooled
connections kept by the writers for commit_step, record_call and create_run; one dedicated
connection LISTENing on `tether_work` and `tether_effects`. Most operations are one statement.

Coalesced reads: get_run is coalesced the same way as the writer's group commit (pg_commit.py):
calls made while one is in flight share a statement.

Wake-ups: a write that makes a run claimable (or an effect due) calls pg_notify in the same
transaction; the listener turns notifications into `work_available` / `effects_available`, at
most one wake-up per debounce window, and reconnects with backoff when its connection dies
(workers poll as well).

Durability: `synchronous_commit=on` is set on every connection: a commit acknowledged to a
worker has been flushed to the WAL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from functools import cache
from operator import itemgetter
from typing import Any, Final, NamedTuple, TypeVar
from urllib.parse import urlsplit

import psycopg
from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.errors import PipelineAborted, TransactionRollback
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from ..errors import ConfigError, StoreError, StoreUnavailable
from .migrate import queries

log = logging.getLogger("tether.store.postgres")

CHANNEL: Final = "tether_work"
EFFECTS_CHANNEL: Final = "tether_effects"
_SCHEMES: Final = ("postgresql", "postgres", "postgresql+psycopg")
_SYNC_MODES: Final = frozenset({"on", "off", "local", "remote_write", "remote_apply"})
_MAX_BATCH: Final = 1000
_WRITERS: Final = 2  # writer connections: a group commit is sent while another is at the server
_BACKOFF_MIN, _BACKOFF_MAX = 0.2, 10.0

T = TypeVar("T")
Conn = AsyncConnection[TupleRow]
Params = dict[str, Any]
_TxBody = Callable[[Conn], Awaitable[T]]
_TX_ATTEMPTS: Final = 3
_BEGIN: Final = b"BEGIN"
# (query, params, thread_id, future of the statement's first row: None = the fence failed)
_Job = tuple[bytes, Params, str, "asyncio.Future[TupleRow | None]"]
_ReadJob = tuple[bytes, Params, "asyncio.Future[list[TupleRow]]"]


def redact_url(url: str) -> str:
    """The URL with its password (in the userinfo or a `password=` parameter) masked."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<malformed database URL>"
    netloc = parts.netloc
    userinfo, at, hostinfo = netloc.rpartition("@")
    if at and ":" in userinfo:
        netloc = f"{userinfo.split(':', 1)[0]}:***@{hostinfo}"
    query = "&".join(
        "password=***" if item.split("=", 1)[0].lower() == "password" else item
        for item in parts.query.split("&")
    ) if parts.query else ""
    return parts._replace(netloc=netloc, query=query).geturl()


@cache
def _queries() -> dict[str, bytes]:
    # bytes: psycopg takes them as they are, with no per-call encoding.
    return {name: sql.encode() for name, sql in queries("postgres").items()}


def _is_disconnect(exc: BaseException) -> bool:
    """The connection failed, as opposed to the server refusing a statement."""
    if isinstance(exc, PoolTimeout):
        return True
    if not isinstance(exc, psycopg.OperationalError):
        return False
    if isinstance(exc, PipelineAborted):
        return False
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in {"57P01", "57P02", "57P03"}


_POOL_OPTIONS: Final = ("pool_min", "pool_max", "pool_timeout")


def _pool_options(rest: str, safe_url: str) -> tuple[str, dict[str, float]]:
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


class _Writer:
    """One writer connection of the group commit (pg_commit.py) and its state."""

    __slots__ = ("busy", "conn", "cursor", "lost")

    def __init__(self) -> None:
        self.conn: Conn | None = None
        self.cursor: psycopg.AsyncCursor[TupleRow] | None = None
        self.lost = False  # its connection failed: replace it before the next write
        self.busy = False  # a write or a group commit is on it


class PgIO:
    """PostgresStore's connections: its settings and state, and the plumbing its Store methods
    and the group-commit writer (PgCommitter) run on."""

    def __init__(
        self,
        url: str,
        *,
        min_size: int = 2,
        max_size: int = 10,
        connect_timeout: float = 5.0,
        pool_timeout: float = 15.0,
        synchronous_commit: str = "on",
        debounce: float = 0.01,
    ):
        self.url = url
        self.safe_url = redact_url(url)
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
        rest, pool = _pool_options(rest, self.safe_url)
        min_size = int(pool.get("pool_min", min_size))
        max_size = int(pool.get("pool_max", max_size))
        if max_size < 2:
            raise ConfigError("max_size (pool_max) must be at least 2 (a writer holds one "
                              "connection)")
        pool_timeout = pool.get("pool_timeout", pool_timeout)
        try:
            params = conninfo_to_dict("postgresql://" + rest)  # libpq knows no "+psycopg"
        except psycopg.Error as exc:
            raise ConfigError(f"malformed Postgres URL {self.safe_url!r}") from exc
        self._password = str(params.get("password") or "")
        options = str(params.get("options") or "")
        params["options"] = f"{options} -c synchronous_commit={synchronous_commit}".strip()
        params.setdefault("application_name", "tether")
        params.setdefault("connect_timeout", max(2, round(connect_timeout)))
        # Find a dead peer (no FIN, e.g. a failed-over host) in seconds, not hours.
        params.setdefault("keepalives", 1)
        params.setdefault("keepalives_idle", 10)
        params.setdefault("keepalives_interval", 5)
        params.setdefault("keepalives_count", 3)
        self._conninfo = make_conninfo("", **params)
        self.min_size = max(1, min(min_size, max_size))
        self.max_size = max_size
        self.connect_timeout = connect_timeout
        self.pool_timeout = pool_timeout
        self.synchronous_commit = synchronous_commit
        self.debounce = debounce
        self._q = q = _queries()
        # query -> its multi-row form: the statement, the key of a job's params, whether a
        # group fits it, and the key of a row it returns (None: rows are keys; each job whose
        # key came back gets _OK) or, given, each job gets the row with its key.
        self._bulk: dict[bytes, Bulk] = {
            q["commit_step"]: Bulk(q["commit_steps"], _thread_key, _distinct_runs,
                                   itemgetter(0)),  # commit_step's row: (thread_id, updated_at)
            q["insert_journal"]: Bulk(q["insert_journals"], _journal_key, _always),
            q["create_run"]: Bulk(q["create_runs"], _thread_key, _fresh_leased_runs,
                                  itemgetter(1)),  # create_run's row: (created, thread_id, ...)
        }
        self._pool: AsyncConnectionPool[Conn] | None = None
        self._accepting = False  # writes are taken (the committers run)
        # Keep one connection of the pool for everything else.
        self._writers = [_Writer() for _ in range(min(_WRITERS, max_size - 1))]
        self._queue: deque[_Job] = deque()
        self._wake = asyncio.Event()
        self._committers: list[asyncio.Task[None]] = []
        self._stats = dict.fromkeys(("batches", "batched_writes", "largest_batch",
                                     "batch_retries"), 0)
        self._listener: asyncio.Task[None] | None = None
        self._listen_conn: Conn | None = None
        self._healer: asyncio.Task[None] | None = None
        self._reads: deque[_ReadJob] = deque()
        self._reader: asyncio.Task[None] | None = None
        self._reading = False  # a hot read is in flight
        self.work_available = asyncio.Event()
        self.effects_available = asyncio.Event()

    # -- errors ----------------------------------------------------------------------------

    def _message(self, exc: BaseException) -> str:
        text = str(exc).strip() or type(exc).__name__
        if self._password:
            text = text.replace(self._password, "***")
        return text.replace("\n", " ").replace("\t", " ")

    def _error(self, exc: BaseException) -> StoreError:
        """The store-edge translation of a driver error, chained to it."""
        err: StoreError
        if _is_disconnect(exc):
            err = StoreUnavailable(
                f"Postgres at {self.safe_url} is unavailable: {self._message(exc)}"
            )
        else:
            err = StoreError(f"Postgres error: {self._message(exc)}")
        err.__cause__ = exc
        return err

    # -- lifecycle -------------------------------------------------------------------------

    async def _connect(self) -> Conn:
        return await AsyncConnection.connect(self._conninfo, autocommit=True)

    async def _connect_listener(self) -> Conn:
        conn = await self._connect()
        try:
            await conn.execute(f"LISTEN {CHANNEL}; LISTEN {EFFECTS_CHANNEL}".encode())
        except BaseException:
            await conn.close()
            raise
        return conn

    async def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.cancel()
            await asyncio.wait([listener])
        committers, self._committers = self._committers, []
        self._accepting = False
        if committers:
            self._wake.set()  # the committers finish what was submitted, then stop
            _, pending = await asyncio.wait(committers, timeout=self.pool_timeout)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        listen_conn, self._listen_conn = self._listen_conn, None  # if the task never started
        if listen_conn is not None:
            with contextlib.suppress(psycopg.Error, OSError):
                await listen_conn.close()
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
            for writer in self._writers:
                commit_conn, writer.conn, writer.cursor = writer.conn, None, None
                if commit_conn is not None:
                    with contextlib.suppress(psycopg.Error, OSError):
                        await pool.putconn(commit_conn)
            await pool.close()

    def _need_pool(self) -> AsyncConnectionPool[Conn]:
        if self._pool is None:
            raise StoreError("store is not open")
        return self._pool

    async def _fetchall(
        self, query: bytes, params: Params | None = None, *, idempotent: bool = False
    ) -> list[TupleRow]:
        """One statement on a pooled connection. An idempotent one is retried once if its
        connection turns out to be dead (a database restart kills every pooled one)."""
        pool = self._need_pool()
        retry = idempotent
        while True:
            try:
                async with pool.connection() as conn:
                    cur = await conn.execute(query, params)
                    return await cur.fetchall()
            except psycopg.Error as exc:
                if not _is_disconnect(exc):
                    raise self._error(exc) from exc
                if not retry or isinstance(exc, PoolTimeout):
                    self._heal()
                    raise self._error(exc) from exc
                retry = False
                # What killed this connection (a restart, a failover) likely killed its idle
                # peers too: test them before the retry takes one.
                await pool.check()

    async def _fetchone(
        self, query: bytes, params: Params | None = None, *, idempotent: bool = False
    ) -> TupleRow | None:
        rows = await self._fetchall(query, params, idempotent=idempotent)
        return rows[0] if rows else None

    async def _read(self, query: bytes, params: Params | None = None) -> list[TupleRow]:
        return await self._fetchall(query, params, idempotent=True)

    async def _read_one(self, query: bytes, params: Params | None = None) -> TupleRow | None:
        return await self._fetchone(query, params, idempotent=True)

    async def _hot_read(self, query: bytes, params: Params) -> list[TupleRow]:
        """A short per-run read (get_run, load_journal...). The first caller runs it at once;
        reads issued while one is in flight queue up and go together, in one pipeline, on one
        connection: a worker claiming a thousand runs, or a thousand runtime.wait calls, cost
        one round trip per batch, not a pool checkout each."""
        self._need_pool()
        if not self._reading:
            self._reading = True
            try:
                return await self._fetchall(query, params, idempotent=True)
            finally:
                self._reading = False
                if self._reads:
                    self._start_reader()
        fut: asyncio.Future[list[TupleRow]] = asyncio.get_running_loop().create_future()
        self._reads.append((query, params, fut))
        return await fut

    async def _hot_read_one(self, query: bytes, params: Params) -> TupleRow | None:
        rows = await self._hot_read(query, params)
        return rows[0] if rows else None

    def _start_reader(self) -> None:
        self._reading = True
        self._reader = asyncio.create_task(self._read_loop(), name="tether-pg-reader")

    async def _read_loop(self) -> None:
        try:
            while self._reads:
                batch = [self._reads.popleft() for _ in range(min(len(self._reads), _MAX_BATCH))]
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
            async with self._need_pool().connection() as conn:
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
                    rows = await self._fetchall(query, params, idempotent=True)
                except Exception as exc:
                    if not fut.done():
                        fut.set_exception(exc)
                else:
                    if not fut.done():
                        fut.set_result(rows)

    def _heal(self) -> None:
        """After a lost connection, test the pooled idle ones in the background (check()
        takes them all out of the pool at once, so no later caller gets a dead one)."""
        pool, healer = self._pool, self._healer
        if pool is not None and (healer is None or healer.done()):
            self._healer = asyncio.create_task(pool.check(), name="tether-pg-pool-check")

    async def _transaction(self, body: _TxBody[T], *, body_commits: bool = False) -> T:
        """body(conn) in one transaction on a pooled connection: body sends BEGIN first, in
        its first pipeline (conn.transaction() would cost two more round trips); this commits
        after it, unless `body_commits` (it sent COMMIT in its last pipeline). A deadlock or
        serialization failure undoes it whole, so it runs again (a few times); a TetherError
        it raises (LeaseLost, RunNotFound...) rolls it back."""
        pool = self._need_pool()
        for attempt in range(1, _TX_ATTEMPTS + 1):
            try:
                async with pool.connection() as conn:
                    try:
                        result = await body(conn)
                        if not body_commits:
                            await conn.execute(b"COMMIT")
                    except BaseException:
                        await _rollback(conn)
                        raise
                    return result
            except psycopg.Error as exc:
                if _retryable(exc) and attempt < _TX_ATTEMPTS:
                    log.debug("transaction rolled back (%s); retrying", self._message(exc))
                    continue
                if _is_disconnect(exc):
                    self._heal()
                raise self._error(exc) from exc
        raise AssertionError("unreachable")

    # -- the listener ----------------------------------------------------------------------

    async def _listen_loop(self) -> None:
        backoff = _BACKOFF_MIN
        conn, self._listen_conn = self._listen_conn, None
        while True:
            try:
                if conn is None:
                    conn = await self._connect_listener()
                    # Notifications sent while we were away are lost: assume work is waiting.
                    self.work_available.set()
                    backoff = _BACKOFF_MIN
                    log.info("listening on %s again", self.safe_url)
                await self._pump(conn)
            except Exception as exc:  # the listener must outlive any single failure
                log.warning("LISTEN connection to %s failed (%s); reconnecting in %.1f s",
                            self.safe_url, self._message(exc), backoff)
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
        events = {CHANNEL: self.work_available, EFFECTS_CHANNEL: self.effects_available}
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


async def _rollback(conn: Conn) -> None:
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


def _retryable(exc: psycopg.Error) -> bool:
    """A deadlock victim or a serialization failure (SQLSTATE class 40): the transaction was
    undone whole, so it can run again. (psycopg's DeadlockDetected is not a subclass of its
    TransactionRollback.)"""
    return isinstance(exc, TransactionRollback) or (exc.sqlstate or "").startswith("40")


# A job's key and its row's key (C getters: they run once per write of every group commit).
_Key = Callable[[Params], Any]
_thread_key: Final[_Key] = itemgetter("thread_id")
_journal_key: Final[_Key] = itemgetter("thread_id", "step", "idx")  # = insert_journals' row


def _distinct_runs(seq: list[Params]) -> bool:
    """commit_steps moves each run once: two commits of one run go one by one instead."""
    return len({p["thread_id"] for p in seq}) == len(seq)


def _always(seq: list[Params]) -> bool:
    return True


def _fresh_leased_runs(seq: list[Params]) -> bool:
    """create_runs takes runs leased to a local worker without idempotency key, once each."""
    return (all(p["lease_owner"] is not None and p["idempotency_key"] is None for p in seq)
            and _distinct_runs(seq))


class Bulk(NamedTuple):
    query: bytes
    key: _Key
    fits: Callable[[list[Params]], bool]
    row_key: Callable[[TupleRow], Any] | None = None
