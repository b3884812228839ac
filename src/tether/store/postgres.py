"""Postgres store: any number of workers on any number of machines share one database.

Connections: a psycopg 3 async pool (autocommit) for everything but step writes; one pooled
connection kept by the writer for commit_step, record_call and create_run; one dedicated
connection LISTENing on `tether_work` and `tether_effects`. Most operations are one statement.

Group commit: the writer's statements are fenced single statements. One that finds the writer
idle runs at once, in the caller's task (the sequential case pays nothing for batching).
Writes arriving while it is busy queue up; the committer task sends each queue-full as one
transaction in one pipeline, one round trip and one WAL flush for the lot: BEGIN; lock_batch
(every run row involved, in thread_id order); all step commits as one multi-row statement, all
journal writes as another, the rest as executemany; COMMIT. Each write is fenced on its own
(a stale epoch matches no row; it does not raise), so a lost lease never affects its
batch-mates; if the transaction raises, its writes are retried one by one so only the culprit
fails. get_run is coalesced the same way: calls made while one is in flight share a statement.

Multi-statement writes (steps that send mail or record effects, parks into join, cancels,
final failures) run in a transaction on a pooled connection that first locks every run row
it will touch (lock_runs, lock_tree), and only then reads them for a decision: in READ
COMMITTED a conditional UPDATE skips a row whose change it cannot see yet, so without the
lock a park and the wake-up meant for it could miss each other. Every multi-row lock is taken
in thread_id order, so none can deadlock with another; a deadlock with anything else rolls
the transaction back whole and it is retried.

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
from collections.abc import Awaitable, Callable, Sequence
from functools import cache
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit

import orjson
import psycopg
from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.errors import PipelineAborted, TransactionRollback
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from ..errors import (
    ConfigError,
    DuplicateEffectKey,
    EffectError,
    LeaseLost,
    RunConflict,
    RunNotFound,
    SchemaError,
    StoreError,
    StoreUnavailable,
)
from .base import (
    COMPENSATION_STEP,
    INTERRUPT_CALL,
    SLEEP_CALL,
    TERMINAL,
    CheckpointRecord,
    EffectRecord,
    InterruptRecord,
    JournalRecord,
    Lease,
    MessageRecord,
    NewRun,
    Park,
    RunRecord,
    StepCommit,
)
from .migrate import behind_message, latest, migrations, queries

__all__ = ["CHANNEL", "EFFECTS_CHANNEL", "PostgresStore", "redact_url"]

log = logging.getLogger("tether.store.postgres")

CHANNEL: Final = "tether_work"
EFFECTS_CHANNEL: Final = "tether_effects"
_SCHEMES: Final = ("postgresql", "postgres", "postgresql+psycopg")
_SYNC_MODES: Final = frozenset({"on", "off", "local", "remote_write", "remote_apply"})
_MIGRATE_LOCK: Final = 0x7465746865720001  # b"tether\0\1": one key for every tether database
_MAX_BATCH: Final = 1000
_NO_LIMIT: Final = 2**62
_BACKOFF_MIN, _BACKOFF_MAX = 0.2, 10.0
_NEW_RUN_FIELDS: Final = tuple(NewRun.__dataclass_fields__)  # the create_run parameters

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


def _run(row: TupleRow) -> RunRecord:
    return RunRecord(*row)


def _checkpoint(row: TupleRow) -> CheckpointRecord:
    return CheckpointRecord(*row)


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


class PostgresStore:
    dialect = "postgres"

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
        if max_size < 2:
            raise ConfigError("max_size must be at least 2 (the committer holds one connection)")
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
        # query -> (its multi-row form, the key of a row it returns, whether a group fits it)
        self._bulk: dict[bytes, tuple[bytes, _Key, Callable[[list[Params]], bool]]] = {
            q["commit_step"]: (q["commit_steps"], _thread_key, _distinct_runs),
            q["insert_journal"]: (q["insert_journals"], _journal_key, _always),
        }
        self._pool: AsyncConnectionPool[Conn] | None = None
        self._accepting = False  # writes are taken (the committer runs)
        self._busy = False  # the writer connection is in use
        self._queue: deque[_Job] = deque()
        self._wake = asyncio.Event()
        self._committer: asyncio.Task[None] | None = None
        self._commit_conn: Conn | None = None
        self._cursor: psycopg.AsyncCursor[TupleRow] | None = None
        self._writer_lost = False
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

    def __repr__(self) -> str:
        return f"PostgresStore({self.safe_url!r})"

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

    async def open(self, *, check_schema: bool = True) -> None:
        if self._pool is not None:
            return
        # A direct connection first: it fails fast, with the server's reason (refused, no such
        # database, bad password); a pool would only report a timeout.
        try:
            async with asyncio.timeout(self.connect_timeout + 1.0):
                self._listen_conn = await self._connect_listener()
        except (psycopg.Error, OSError, TimeoutError) as exc:
            reason = (f"no answer within {self.connect_timeout:g} s"
                      if isinstance(exc, TimeoutError) else self._message(exc))
            raise StoreUnavailable(
                f"cannot connect to Postgres at {self.safe_url}: {reason}"
            ) from exc
        pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
            self._conninfo,
            kwargs={"autocommit": True},
            min_size=self.min_size,
            max_size=self.max_size,
            timeout=self.pool_timeout,
            name="tether",
            open=False,
        )
        try:
            await pool.open(wait=True, timeout=self.connect_timeout + 1.0)
        except (psycopg.Error, OSError) as exc:
            await pool.close()
            await self._listen_conn.close()
            self._listen_conn = None
            raise StoreUnavailable(
                f"cannot open a connection pool to Postgres at {self.safe_url}: "
                f"{self._message(exc)}"
            ) from exc
        self._pool = pool
        if check_schema:
            try:
                current, target = await self.schema_version()
            except BaseException:
                await self.close()
                raise
            if current < target:
                await self.close()
                raise SchemaError(behind_message(current, target, self.safe_url))
        self._accepting, self._writer_lost = True, False
        self._wake.clear()
        self._committer = asyncio.create_task(self._commit_loop(), name="tether-pg-committer")
        self._listener = asyncio.create_task(self._listen_loop(), name="tether-pg-listener")

    async def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.cancel()
            await asyncio.wait([listener])
        committer, self._committer = self._committer, None
        self._accepting = False
        if committer is not None:
            self._wake.set()  # the committer finishes what was submitted, then stops
            done, _ = await asyncio.wait([committer], timeout=self.pool_timeout)
            if not done:
                committer.cancel()
                await asyncio.wait([committer])
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
            commit_conn, self._commit_conn, self._cursor = self._commit_conn, None, None
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

    def _lost(self, exc: psycopg.Error) -> StoreError:
        """_error() for the committer: a lost connection is replaced before the next write
        (after some errors, e.g. an admin shutdown, it does not look closed yet)."""
        if _is_disconnect(exc):
            self._writer_lost = True
            self._cursor = None
            self._heal()
        return self._error(exc)

    def _heal(self) -> None:
        """After a lost connection, test the pooled idle ones in the background (check()
        takes them all out of the pool at once, so no later caller gets a dead one)."""
        pool, healer = self._pool, self._healer
        if pool is not None and (healer is None or healer.done()):
            self._healer = asyncio.create_task(pool.check(), name="tether-pg-pool-check")

    async def _transaction(self, body: _TxBody[T]) -> T:
        """body(conn) in one transaction on a pooled connection: body sends BEGIN first, in
        its first pipeline (conn.transaction() would cost two more round trips); this commits
        after it. A deadlock or serialization failure undoes it whole, so it runs again (a few
        times); a TetherError it raises (LeaseLost, RunNotFound...) rolls it back."""
        pool = self._need_pool()
        for attempt in range(1, _TX_ATTEMPTS + 1):
            try:
                async with pool.connection() as conn:
                    try:
                        result = await body(conn)
                        await conn.execute(b"COMMIT")
                    except BaseException:
                        await _rollback(conn)
                        raise
                    return result
            except TransactionRollback as exc:
                if attempt == _TX_ATTEMPTS:
                    raise self._error(exc) from exc
                log.debug("transaction rolled back (%s); retrying", self._message(exc))
            except psycopg.Error as exc:
                if _is_disconnect(exc):
                    self._heal()
                raise self._error(exc) from exc
        raise AssertionError("unreachable")

    # -- schema ----------------------------------------------------------------------------

    async def schema_version(self) -> tuple[int, int]:
        pool, q = self._need_pool(), self._q
        try:
            async with pool.connection() as conn:
                row = await (await conn.execute(q["schema_table"])).fetchone()
                current = 0
                if row is not None and row[0]:
                    row = await (await conn.execute(q["schema_applied"])).fetchone()
                    current = int(row[0]) if row is not None else 0
        except psycopg.Error as exc:
            raise self._error(exc) from exc
        return current, latest("postgres")

    async def migrate(self) -> list[int]:
        pool, q = self._need_pool(), self._q
        done: list[int] = []
        try:
            async with pool.connection() as conn, conn.transaction():
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
            err = self._error(exc)
            raise type(err)(f"migrating {self.safe_url} failed: {err}") from exc
        return done

    async def now(self) -> float:
        row = await self._read_one(self._q["now"])
        assert row is not None
        return float(row[0])

    # -- runs ------------------------------------------------------------------------------

    async def create_run(self, new: NewRun) -> tuple[RunRecord, bool]:
        # Through the writer: concurrent starts are group-committed like steps.
        row = await self._write(self._q["create_run"], _new_run_params(new), new.thread_id)
        if row is not None:
            run, created = _run(row[1:23]), bool(row[0])
            if created:
                self.work_available.set()
                return run, True
            by = "idempotency key" if (
                new.idempotency_key is not None and run.idempotency_key == new.idempotency_key
            ) else "thread_id"
            return _same_run(run, new, by), False
        # The row we collided with was committed after our statement's snapshot was taken.
        if new.idempotency_key is not None:
            found = await self._read_one(self._q["get_run_by_key"], {"key": new.idempotency_key})
            if found is not None:
                return _same_run(_run(found), new, "idempotency key"), False
        found = await self._read_one(self._q["get_run"], {"thread_id": new.thread_id})
        if found is None:
            raise RunConflict(f"thread_id {new.thread_id!r} or idempotency key "
                              f"{new.idempotency_key!r} is being used by a concurrent start")
        return _same_run(_run(found), new, "thread_id"), False

    async def get_run(self, thread_id: str) -> RunRecord | None:
        row = await self._hot_read_one(self._q["get_run"], {"thread_id": thread_id})
        return None if row is None else _run(row)

    async def list_runs(
        self,
        *,
        status: str | None = None,
        agent: str | None = None,
        limit: int = 100,
        before: tuple[float, str] | None = None,
    ) -> list[RunRecord]:
        params = {
            "status": status,
            "agent": agent,
            "limit": limit,
            "before_ts": before[0] if before else None,
            "before_id": before[1] if before else None,
        }
        return [_run(r) for r in await self._read(self._q["list_runs"], params)]

    # -- leases ----------------------------------------------------------------------------

    async def claim_runs(
        self, worker: str, version: str, agents: Sequence[str], limit: int, lease_ttl: float
    ) -> list[RunRecord]:
        params = {
            "worker": worker,
            "version": version,
            "agents": list(agents),
            "limit": limit,
            "ttl": float(lease_ttl),
        }
        return [_run(r) for r in await self._fetchall(self._q["claim_runs"], params)]

    async def renew_leases(self, worker: str, lease_ttl: float) -> set[str]:
        params = {"worker": worker, "ttl": float(lease_ttl)}
        rows = await self._fetchall(self._q["renew_leases"], params, idempotent=True)
        return {r[0] for r in rows}

    async def release_runs(self, leases: Sequence[Lease]) -> None:
        if not leases:
            return
        params = {
            "thread_ids": [le.thread_id for le in leases],
            "epochs": [le.epoch for le in leases],
        }
        await self._fetchall(self._q["release_runs"], params, idempotent=True)
        self.work_available.set()

    # -- steps (through the committer) -----------------------------------------------------

    async def record_call(
        self, lease: Lease, step: int, idx: int, name: str, result: bytes
    ) -> None:
        params = {
            "thread_id": lease.thread_id,
            "epoch": lease.epoch,
            "step": step,
            "idx": idx,
            "name": name,
            "result": result,
        }
        if not await self._write(self._q["insert_journal"], params, lease.thread_id):
            raise LeaseLost(f"run {lease.thread_id!r}: lease lost before journaling call {idx}")

    async def load_journal(self, thread_id: str, step: int) -> list[JournalRecord]:
        rows = await self._hot_read(
            self._q["load_journal"], {"thread_id": thread_id, "step": step})
        return [JournalRecord(r[0], r[1], r[2]) for r in rows]

    async def commit_step(self, commit: StepCommit) -> None:
        lease, terminal = commit.lease, commit.status in TERMINAL
        if (commit.effects or commit.messages or commit.consumed or commit.groups
                or commit.waiting_for == "mail"):
            await self._transaction(self._commit_tx(commit, terminal))
        else:
            params = _step_params(commit)
            if commit.children:
                _add_children(params, commit.children)
                query = self._q["commit_step_notify"]
            elif commit.status == "queued" or terminal:
                query = self._q["commit_step_wake"]
            else:
                query = self._q["commit_step"]  # the hot path: one statement, group-committed
            if not await self._write(query, params, lease.thread_id):
                raise LeaseLost(
                    f"run {lease.thread_id!r}: lease lost; step {commit.step} not committed"
                )
        if commit.children or commit.messages or commit.status == "queued" or terminal:
            self.work_available.set()
        if commit.effects:
            self.effects_available.set()

    def _commit_tx(self, commit: StepCommit, terminal: bool) -> _TxBody[None]:
        """A step carrying mail, effects, groups, or waking another run: one transaction that
        locks every run row it touches first (lock_runs), then writes (commit_step_tx), then
        wakes (wake_after_commit), in three statements and as few round trips."""
        q, tid = self._q, commit.lease.thread_id
        params = _step_params(commit)
        _add_children(params, commit.children)
        roles = dict(commit.groups)  # the last role given for a group wins
        params["g_names"], params["g_roles"] = list(roles), list(roles.values())
        params["consumed"] = list(commit.consumed)
        effects = commit.effects
        params["e_keys"] = [e.key for e in effects]
        params["e_idxs"] = [e.idx for e in effects]
        params["e_names"] = [e.name for e in effects]
        params["e_payloads"] = [e.payload for e in effects]
        params["e_statuses"] = ["pending" if e.apply is None else "done" for e in effects]
        params["e_compensables"] = [e.compensable for e in effects]
        applied = [e for e in effects if e.apply is not None]
        if len(set(params["e_keys"])) < len(effects):
            raise DuplicateEffectKey(f"run {tid!r}: an effect key is used twice in one step")
        direct = sorted({m.recipient for m in commit.messages if m.recipient is not None})
        groups = sorted({m.group for m in commit.messages
                         if m.recipient is None and m.group is not None})

        async def body(conn: Conn) -> None:
            members: dict[str, list[str]] = {}
            if groups:
                async with conn.pipeline():
                    await conn.execute(_BEGIN)
                    cur = await conn.execute(q["group_recipients"],
                                             {"groups": groups, "thread_id": tid})
                for group, member in await cur.fetchall():
                    members.setdefault(group, []).append(member)
            sent = [(rcpt, m.message) for m in commit.messages
                    for rcpt in ([m.recipient] if m.recipient is not None
                                 else members.get(m.group or "", []))]
            params["m_recipients"] = [rcpt for rcpt, _ in sent]
            params["m_messages"] = [message for _, message in sent]
            recipients = sorted({rcpt for rcpt, _ in sent})
            wake = {"recipients": recipients, "thread_id": tid, "parent": terminal,
                    "mail": commit.waiting_for == "mail",
                    "notify": bool(commit.children or sent or commit.status == "queued"),
                    "effects": len(applied) < len(effects)}
            async with conn.pipeline():
                if not groups:
                    await conn.execute(_BEGIN)
                c_lock = await conn.execute(q["lock_runs"], {
                    "ids": [tid, *recipients], "thread_id": tid, "parent": terminal})
                c_taken = (await conn.execute(q["effect_keys_taken"], {
                    "thread_id": tid, "keys": params["e_keys"]}) if effects else None)
                c_step = await conn.execute(q["commit_step_tx"], params)
                if not applied:
                    await conn.execute(q["wake_after_commit"], wake)
            if c_taken is not None and (taken := await c_taken.fetchall()):
                raise DuplicateEffectKey(
                    f"run {tid!r}: effect key {taken[0][0]!r} was already used "
                    "in this run; explicit effect keys must be unique within a run")
            if c_step.rowcount < 1:
                raise LeaseLost(f"run {tid!r}: lease lost; step {commit.step} not committed")
            found = {r[0] for r in await c_lock.fetchall()}
            if missing := [r for r in direct if r not in found]:
                raise RunNotFound(f"run {tid!r} sent a message to unknown thread_id "
                                  f"{missing[0]!r}")
            for e in applied:
                assert e.apply is not None
                try:
                    await e.apply(conn, e.payload, e.key)
                except Exception as exc:
                    raise EffectError(f"transactional effect {e.name!r} failed: {exc!r}") from exc
            if applied:
                await conn.execute(q["wake_after_commit"], wake)

        return body

    async def fail_step(
        self,
        lease: Lease,
        *,
        failures: int,
        wake_at: float | None,
        error: bytes | None,
        final: bool,
        compensate: Sequence[str] = (),
    ) -> None:
        params = {
            "thread_id": lease.thread_id,
            "epoch": lease.epoch,
            "failures": failures,
            "wake_at": wake_at,
            "error": error,
            "final": final,
        }
        lost = f"run {lease.thread_id!r}: lease lost; failure not recorded"
        if not final:
            if not await self._fetchall(self._q["fail_step"], params):
                raise LeaseLost(lost)
            self.work_available.set()
            return
        q = self._q
        params.update(names=list(compensate), comp_step=COMPENSATION_STEP)

        async def body(conn: Conn) -> None:
            async with conn.pipeline():
                await conn.execute(_BEGIN)
                await conn.execute(q["lock_runs"], {  # the run and its parent, in order
                    "ids": [lease.thread_id], "thread_id": lease.thread_id, "parent": True})
                cur = await conn.execute(q["fail_step_final"], params)
            if not await cur.fetchall():
                raise LeaseLost(lost)

        await self._transaction(body)
        if compensate:
            self.effects_available.set()

    async def park_run(self, lease: Lease, park: Park) -> None:
        waiting = park.kind != "sleep"
        params: Params = {
            "thread_id": lease.thread_id,
            "epoch": lease.epoch,
            "status": "waiting" if waiting else "sleeping",
            "waiting_for": park.kind if waiting else None,
            "seconds": None if waiting else park.seconds,
            "kind": park.kind,
            "step": park.step,
            "idx": park.idx,
            "interrupt_id": park.interrupt_id,
            "payload": park.payload,
            "sleep_name": SLEEP_CALL,
            "timer": None if waiting else orjson.dumps(park.seconds),
        }
        _add_children(params, park.spawn)
        lost = f"run {lease.thread_id!r}: lease lost; not parked"
        if park.kind != "join":
            if not await self._fetchall(self._q["park_run"], params):
                raise LeaseLost(lost)
        else:
            q, joined = self._q, {"thread_id": lease.thread_id, "children": list(park.children)}

            async def body(conn: Conn) -> None:
                async with conn.pipeline():
                    await conn.execute(_BEGIN)
                    cur = await conn.execute(q["park_run"], params)
                    # A later statement: children finished by now are seen (see the query).
                    await conn.execute(q["requeue_if_joined"], joined)
                if not await cur.fetchall():
                    raise LeaseLost(lost)

            await self._transaction(body)
        self.work_available.set()

    async def cancel_run(
        self, thread_id: str, compensate: Sequence[str] = ()
    ) -> RunRecord | None:
        q = self._q
        params = {"thread_id": thread_id, "names": list(compensate),
                  "comp_step": COMPENSATION_STEP}

        async def body(conn: Conn) -> RunRecord | None:
            async with conn.pipeline():
                await conn.execute(_BEGIN)
                await conn.execute(q["lock_tree"], {"thread_id": thread_id})
                await conn.execute(q["cancel_tree"], params)
                cur = await conn.execute(q["get_run"], {"thread_id": thread_id})
            row = await cur.fetchone()
            return None if row is None else _run(row)

        run = await self._transaction(body)
        self.work_available.set()
        if compensate:
            self.effects_available.set()
        return run

    # -- mail ------------------------------------------------------------------------------

    async def send_message(
        self, thread_id: str, message: bytes, sender: str | None = None
    ) -> int:
        q = self._q

        async def body(conn: Conn) -> int:
            async with conn.pipeline():
                await conn.execute(_BEGIN)
                await conn.execute(q["lock_runs"], {
                    "ids": [thread_id], "thread_id": thread_id, "parent": False})
                cur = await conn.execute(q["send_message"], {
                    "thread_id": thread_id, "sender": sender, "message": message})
            row = await cur.fetchone()
            if row is None:
                raise RunNotFound(f"no run with thread_id {thread_id!r}")
            return int(row[0])

        mid = await self._transaction(body)
        self.work_available.set()
        return mid

    async def load_inbox(self, thread_id: str, limit: int = 1000) -> list[MessageRecord]:
        rows = await self._hot_read(
            self._q["load_inbox"], {"thread_id": thread_id, "limit": limit})
        return [MessageRecord(*r) for r in rows]

    async def inbox_depth(self, thread_id: str) -> int:
        row = await self._hot_read_one(self._q["inbox_depth"], {"thread_id": thread_id})
        return int(row[0]) if row is not None else 0

    async def group_members(self, group: str) -> list[str]:
        rows = await self._read(self._q["group_members"], {"group_name": group})
        return [r[0] for r in rows]

    # -- interrupts ------------------------------------------------------------------------

    async def resume_interrupt(
        self, thread_id: str, value: bytes, interrupt_id: str | None = None
    ) -> InterruptRecord | None:
        params = {"thread_id": thread_id, "value": value, "id": interrupt_id,
                  "name": INTERRUPT_CALL}
        row = await self._fetchone(self._q["resume_interrupt"], params)
        if row is None:
            return None
        self.work_available.set()
        return InterruptRecord(*row[:9])

    async def get_interrupt(self, interrupt_id: str) -> InterruptRecord | None:
        row = await self._hot_read_one(self._q["get_interrupt"], {"id": interrupt_id})
        return None if row is None else InterruptRecord(*row)

    async def list_interrupts(
        self, *, thread_id: str | None = None, status: str | None = "pending", limit: int = 100
    ) -> list[InterruptRecord]:
        params = {"thread_id": thread_id, "status": status, "limit": limit}
        return [InterruptRecord(*r) for r in await self._read(self._q["list_interrupts"], params)]

    # -- outbox ----------------------------------------------------------------------------

    async def claim_effects(
        self, worker: str, names: Sequence[str], limit: int, lease_ttl: float
    ) -> list[EffectRecord]:
        params = {"worker": worker, "names": list(names), "limit": limit,
                  "ttl": float(lease_ttl)}
        return [EffectRecord(*r) for r in await self._fetchall(self._q["claim_effects"], params)]

    async def complete_effect(self, effect: EffectRecord, result: bytes) -> bool:
        params = {"thread_id": effect.thread_id, "key": effect.key, "epoch": effect.epoch,
                  "result": result}
        return bool(await self._fetchall(self._q["complete_effect"], params))

    async def renew_effect_leases(self, worker: str, lease_ttl: float) -> None:
        params = {"worker": worker, "ttl": float(lease_ttl)}
        await self._fetchall(self._q["renew_effect_leases"], params, idempotent=True)

    async def run_statuses(self, thread_ids: Sequence[str]) -> dict[str, str]:
        rows = await self._read(self._q["run_statuses"], {"ids": list(thread_ids)})
        return {r[0]: r[1] for r in rows}

    async def fail_effect(self, effect: EffectRecord, error: str, delay: float | None) -> bool:
        params = {"thread_id": effect.thread_id, "key": effect.key, "epoch": effect.epoch,
                  "error": error, "delay": delay}
        ok = bool(await self._fetchall(self._q["fail_effect"], params))
        if ok and delay is not None:
            self.effects_available.set()
        return ok

    async def get_effect(self, thread_id: str, key: str) -> EffectRecord | None:
        row = await self._hot_read_one(
            self._q["get_effect"], {"thread_id": thread_id, "key": key})
        return None if row is None else EffectRecord(*row)

    async def list_effects(
        self, *, thread_id: str | None = None, status: str | None = None, limit: int = 100
    ) -> list[EffectRecord]:
        params = {"thread_id": thread_id, "status": status, "limit": limit}
        return [EffectRecord(*r) for r in await self._read(self._q["list_effects"], params)]

    async def retry_effect(self, key: str, thread_id: str | None = None) -> list[EffectRecord]:
        rows = await self._fetchall(self._q["retry_effect"], {"key": key, "thread_id": thread_id})
        if rows:
            self.effects_available.set()
        return [EffectRecord(*r[:15]) for r in rows]

    # -- checkpoints -----------------------------------------------------------------------

    async def load_checkpoints(
        self, thread_id: str, upto: int | None = None
    ) -> list[CheckpointRecord]:
        params = {"thread_id": thread_id, "upto": _NO_LIMIT if upto is None else upto}
        return [_checkpoint(r) for r in await self._hot_read(self._q["load_checkpoints"], params)]

    async def checkpoints(self, thread_id: str) -> list[CheckpointRecord]:
        rows = await self._read(self._q["checkpoints"], {"thread_id": thread_id})
        return [_checkpoint(r) for r in rows]

    # -- the committer ---------------------------------------------------------------------

    async def _write(self, query: bytes, params: Params, thread_id: str) -> TupleRow | None:
        """Run one write statement on the writer; its first row (None: it returned none,
        e.g. a fenced write whose epoch moved)."""
        if not self._accepting:
            raise StoreError("store is not open")
        if self._busy or self._queue:
            # The writer is taken: join the next group commit.
            fut: asyncio.Future[TupleRow | None] = asyncio.get_running_loop().create_future()
            self._queue.append((query, params, thread_id, fut))
            self._wake.set()
            return await fut
        # The writer is idle: run it here, with no hop through the committer task. If we are
        # cancelled meanwhile, psycopg cancels the statement: its outcome is unknown to us, as
        # for any cancelled write.
        self._busy = True
        try:
            for attempt in range(1, _TX_ATTEMPTS + 1):
                try:
                    cur = self._cursor
                    if cur is None or cur.closed or cur.connection.closed:
                        cur = await self._new_cursor()
                    await cur.execute(query, params)
                    return await cur.fetchone()
                except TransactionRollback as exc:  # a deadlock victim: nothing was written
                    if attempt == _TX_ATTEMPTS:
                        raise self._error(exc) from exc
            raise AssertionError("unreachable")
        except psycopg.Error as exc:
            raise self._lost(exc) from exc
        finally:
            self._busy = False
            if self._queue or not self._accepting:
                self._wake.set()

    async def _commit_loop(self) -> None:
        queue, wake = self._queue, self._wake
        batch: list[_Job] = []
        try:
            while True:
                await wake.wait()
                wake.clear()
                while queue and not self._busy:
                    batch = [queue.popleft() for _ in range(min(len(queue), _MAX_BATCH))]
                    self._busy = True
                    try:
                        if len(batch) == 1:
                            await self._commit_one(batch[0])
                        else:
                            await self._commit_batch(batch)
                    except Exception as exc:  # a bug, not a database error: keep serving
                        log.exception("group commit of %d writes failed", len(batch))
                        for job in batch:
                            _fail(job[3], StoreError(f"group commit failed: {exc!r}"))
                    finally:
                        self._busy = False
                    batch = []
                if not self._accepting and not queue and not self._busy:
                    return
        finally:
            # Jobs are left only if we were cancelled (close timed out) or hit a bug: never
            # leave a caller waiting forever.
            for job in [*batch, *queue]:
                _fail(job[3], StoreError("store closed before the write was confirmed"))
            queue.clear()

    async def _new_cursor(self) -> psycopg.AsyncCursor[TupleRow]:
        pool = self._need_pool()
        conn, self._commit_conn, self._cursor = self._commit_conn, None, None
        if conn is not None and (conn.closed or self._writer_lost):
            self._writer_lost = False
            with contextlib.suppress(psycopg.Error, OSError):
                await conn.close()
            await pool.putconn(conn)  # closed: the pool discards it and opens another
            conn = None
            await pool.check()  # see _fetchall
        if conn is None:
            conn = await pool.getconn()
        self._commit_conn = conn
        self._cursor = cur = conn.cursor()
        return cur

    async def _commit_one(self, job: _Job) -> None:
        query, params, _, fut = job
        for attempt in range(1, _TX_ATTEMPTS + 1):
            try:
                cur = self._cursor
                if cur is None or cur.closed or cur.connection.closed:
                    cur = await self._new_cursor()
                await cur.execute(query, params)
            except TransactionRollback as exc:  # a deadlock victim: nothing was written
                if attempt == _TX_ATTEMPTS:
                    _fail(fut, self._error(exc))
            except psycopg.Error as exc:
                _fail(fut, self._lost(exc))
                return
            else:
                _done(fut, await cur.fetchone())
                return

    async def _commit_batch(self, batch: list[_Job]) -> None:
        """One transaction, one pipeline, one round trip: BEGIN; lock_batch (every run row
        the batch writes, in thread_id order); per statement kind, one multi-row statement
        (step commits, journal writes) or one executemany (the rest); COMMIT."""
        batch.sort(key=_thread_of)
        groups: dict[bytes, list[int]] = {}
        for i, job in enumerate(batch):
            groups.setdefault(job[0], []).append(i)
        stats = self._stats
        stats["batches"] += 1
        stats["batched_writes"] += len(batch)
        stats["largest_batch"] = max(stats["largest_batch"], len(batch))
        firsts: list[TupleRow | None] = [None] * len(batch)
        try:
            if self._cursor is None or self._cursor.connection.closed:
                await self._new_cursor()
            conn = self._commit_conn
            assert conn is not None
            try:
                plan = await self._send_batch(conn, batch, groups)
            except BaseException:
                await _rollback(conn)
                raise
        except psycopg.Error as exc:
            if _is_disconnect(exc):
                # The outcome is unknown: re-running could commit twice. Report it to all.
                for job in batch:
                    _fail(job[3], self._lost(exc))
                return
            stats["batch_retries"] += 1
            log.debug("group commit of %d writes failed (%s); retrying them one by one",
                      len(batch), self._message(exc))
            for job in batch:
                await self._commit_one(job)
            return
        # Committed. (Anything raised from here fails the batch's callers; nothing retries.)
        for cur, members, key in plan:
            if key is not None:
                done = {tuple(row) for row in await cur.fetchall()}
                for i in members:
                    firsts[i] = _OK if key(batch[i][1]) in done else None
                continue
            results = [await cur.fetchone()]
            while cur.nextset():
                results.append(await cur.fetchone())
            if len(results) != len(members):  # cannot happen; never guess which is which
                raise StoreError(f"group commit: {len(results)} results for {len(members)}")
            for i, row in zip(members, results, strict=True):
                firsts[i] = row
        for job, first in zip(batch, firsts, strict=True):
            _done(job[3], first)

    async def _send_batch(
        self, conn: Conn, batch: list[_Job], groups: dict[bytes, list[int]]
    ) -> list[tuple[psycopg.AsyncCursor[TupleRow], list[int], _Key | None]]:
        """Send the batch's transaction in one pipeline; (cursor, its jobs, row key) per
        statement. Raises the first statement's error, if any."""
        plan: list[tuple[psycopg.AsyncCursor[TupleRow], list[int], _Key | None]] = []
        failure: psycopg.Error | None = None
        try:
            async with conn.pipeline():
                try:
                    await conn.execute(_BEGIN)
                    await conn.execute(self._q["lock_batch"],
                                       {"ids": sorted({job[2] for job in batch})})
                    for query, members in groups.items():
                        cur = conn.cursor()
                        seq = [batch[i][1] for i in members]
                        bulk = self._bulk.get(query)
                        if bulk is not None and len(seq) > 1 and bulk[2](seq):
                            await cur.execute(bulk[0], {k: [p[k] for p in seq] for k in seq[0]})
                            plan.append((cur, members, bulk[1]))
                        else:
                            await cur.executemany(query, seq, returning=True)
                            plan.append((cur, members, None))
                    await conn.execute(b"COMMIT")
                except psycopg.Error as exc:  # caught in here, or psycopg logs it as ignored
                    failure = exc
        except psycopg.Error:
            if failure is None:
                raise
        if failure is not None:  # (the pipeline's exit then only says "pipeline aborted")
            raise failure
        return plan

    def statistics(self) -> dict[str, int]:
        """Group commit counters: batches, batched_writes, largest_batch, batch_retries."""
        return dict(self._stats)

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
    """End a failed explicit transaction so the connection is clean (autocommit) again."""
    if conn.closed or conn.info.transaction_status == TransactionStatus.IDLE:
        return
    with contextlib.suppress(psycopg.Error):
        await conn.execute(b"ROLLBACK")


def _thread_of(job: _Job) -> str:
    return job[2]


_OK: Final[TupleRow] = (True,)  # the result a multi-row group commit gives a committed job
_Key = Callable[[Params], tuple[Any, ...]]


def _thread_key(params: Params) -> tuple[Any, ...]:
    return (params["thread_id"],)


def _journal_key(params: Params) -> tuple[Any, ...]:
    return (params["thread_id"], params["step"], params["idx"])


def _distinct_runs(seq: list[Params]) -> bool:
    """commit_steps moves each run once: two commits of one run go one by one instead."""
    return len({p["thread_id"] for p in seq}) == len(seq)


def _always(seq: list[Params]) -> bool:
    return True


def _done(fut: asyncio.Future[TupleRow | None], value: TupleRow | None) -> None:
    if not fut.done():  # a cancelled caller: the write happened (or not) all the same
        fut.set_result(value)


def _fail(fut: asyncio.Future[TupleRow | None], error: StoreError) -> None:
    if not fut.done():
        fut.set_exception(error)


def _step_params(commit: StepCommit) -> Params:
    lease = commit.lease
    return {
        "thread_id": lease.thread_id,
        "epoch": lease.epoch,
        "step": commit.step,
        "node": commit.node,
        "next_node": commit.next_node,
        "kind": commit.kind,
        "data": commit.data,
        "worker": lease.worker,
        "attempt": commit.attempt,
        "started_at": commit.started_at,
        "finished_at": commit.finished_at,
        "status": commit.status,
        "wake_at": commit.wake_at,
        "waiting_for": commit.waiting_for,
    }


def _new_run_params(new: NewRun) -> Params:
    return {name: getattr(new, name) for name in _NEW_RUN_FIELDS}


def _add_children(params: Params, children: Sequence[NewRun]) -> None:
    """The children as one array per field: commit_step_notify unnests them."""
    for name in _NEW_RUN_FIELDS:
        params["c_" + name] = [getattr(child, name) for child in children]


def _same_run(existing: RunRecord, new: NewRun, by: str) -> RunRecord:
    """An existing run matches a start request only with the same agent and input."""
    if existing.agent != new.agent or existing.input_hash != new.input_hash:
        what = (f"thread_id {new.thread_id!r}" if by == "thread_id"
                else f"idempotency key {new.idempotency_key!r}")
        raise RunConflict(
            f"{what} already belongs to a run of agent {existing.agent!r} with different input; "
            f"use another {by} or the same input"
        )
    return existing
