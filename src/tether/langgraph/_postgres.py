"""TetherSaver's Postgres rows: how each operation is said in Postgres (sql/postgres.sql).

A few autocommit connections (_Conns) for the saver's event loop, and as many blocking ones
(_BlockingConns) for sync callers, whose calls run in their own thread (_rows.INLINE); a put
and a task's writes are one statement each (one round trip, atomic by themselves); prune and
delete_for_runs are one transaction under per-thread advisory locks. `synchronous_commit=on`
on every connection: a checkpoint put is in the WAL on disk when it returns.
"""

from __future__ import annotations

import asyncio
import struct
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from functools import cache
from importlib import resources
from typing import Any, cast

import psycopg
from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow

from ..config import redact
from ..errors import ConfigError, SchemaError, StoreError, StoreUnavailable
from ..store.migrate import parse_queries
from ..store.pg_conn import pool_options
from ..store.pg_pooler import pooler_options
from ._blobs import Blob
from ._rows import INLINE, BlobRow, CheckpointRow, Collect, WriteRow

_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg")
Conn = AsyncConnection[TupleRow]


@cache
def _queries() -> dict[str, bytes]:
    text = (resources.files("tether.langgraph") / "sql" / "postgres.sql").read_text("utf-8")
    return {k: v.encode() for k, v in
            parse_queries(text, "tether/langgraph/sql/postgres.sql").items()}


class _Conns:
    """Up to `size` autocommit connections, opened on demand and kept. No background task
    (unlike psycopg_pool's pools): closing works at any moment, even while the event loop shuts
    down and has cancelled its tasks, which is when tether.langgraph.agent's savers close."""

    def __init__(self, conninfo: str, size: int, timeout: float) -> None:
        self._conninfo, self._timeout = conninfo, timeout
        self.prepare_threshold: int | None = 5  # None through transaction pooling
        self._slots = asyncio.Semaphore(size)
        self._idle: list[Conn] = []
        self.closed = False

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Conn]:
        async with asyncio.timeout(self._timeout):
            await self._slots.acquire()
        try:
            if self.closed:
                raise StoreError("the saver is not open")
            conn = self._idle.pop() if self._idle else await AsyncConnection.connect(
                self._conninfo, autocommit=True, prepare_threshold=self.prepare_threshold)
            try:
                yield conn
            finally:
                if (self.closed or conn.closed
                        or conn.info.transaction_status != TransactionStatus.IDLE):
                    await conn.close()  # broken, or left mid-transaction by a cancellation
                else:
                    self._idle.append(conn)
        finally:
            self._slots.release()

    async def close(self) -> None:
        self.closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close()


# One pending write as packed in an lg_writes row (migration 0009): (idx, channel, type, blob).
Write = tuple[int, str, str, "bytes | None"]
_INT = struct.Struct(">i")
_MAX_WRITE_ROUNDS = 5


def pack_writes(writes: dict[int, Write]) -> bytes:
    """A task's writes as lg_writes.writes: for each, in idx order, int4 idx, int4 length +
    channel, int4 length + type, int4 length (-1: NULL) + blob (big-endian, UTF-8)."""
    out = bytearray()
    for idx in sorted(writes):
        _, channel, type_, blob = writes[idx]
        ch, ty = channel.encode(), type_.encode()
        out += _INT.pack(idx) + _INT.pack(len(ch)) + ch + _INT.pack(len(ty)) + ty
        out += _INT.pack(-1) if blob is None else _INT.pack(len(blob)) + blob
    return bytes(out)


def unpack_writes(data: bytes) -> list[Write]:
    out: list[Write] = []
    pos, end = 0, len(data)
    try:
        while pos < end:
            (idx,), (n,) = _INT.unpack_from(data, pos), _INT.unpack_from(data, pos + 4)
            pos += 8
            channel = data[pos:pos + n].decode()
            pos += n
            (n,) = _INT.unpack_from(data, pos)
            type_ = data[pos + 4:pos + 4 + n].decode()
            pos += 4 + n
            (n,) = _INT.unpack_from(data, pos)
            pos += 4
            blob = None if n < 0 else data[pos:pos + n]
            pos += max(n, 0)
            if pos > end:
                raise ValueError("truncated")
            out.append((idx, channel, type_, blob))
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
        raise StoreError(f"malformed LangGraph pending writes row: {exc}") from exc
    return out


def merge_writes(stored: Sequence[Write], new: Sequence[Write], replace: bool
                 ) -> dict[int, Write]:
    """A task's writes after storing `new` beside `stored`: by idx, a stored write stays,
    unless `replace` (special writes: ERROR, INTERRUPT, ...) puts the new one instead."""
    incoming: dict[int, Write] = {}
    for w in new:
        if replace:
            incoming[w[0]] = w
        else:
            incoming.setdefault(w[0], w)
    old = {w[0]: w for w in stored}
    return {**old, **incoming} if replace else {**incoming, **old}


class _BlockingConns:
    """Up to `size` blocking autocommit connections, opened on demand and kept, for the calls
    of sync callers (each in its own thread)."""

    def __init__(self, conninfo: str, size: int, timeout: float) -> None:
        self._conninfo, self._timeout = conninfo, timeout
        self.prepare_threshold: int | None = 5  # None through transaction pooling
        self._slots = threading.BoundedSemaphore(size)
        self._lock = threading.Lock()
        self._idle: list[psycopg.Connection[TupleRow]] = []
        self.closed = False

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[TupleRow]]:
        if not self._slots.acquire(timeout=self._timeout):
            raise TimeoutError(f"no Postgres connection free within {self._timeout:g} s")
        try:
            if self.closed:
                raise StoreError("the saver is not open")
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                conn = psycopg.Connection.connect(self._conninfo, autocommit=True,
                                                  prepare_threshold=self.prepare_threshold)
            try:
                yield conn
            finally:
                if (self.closed or conn.closed
                        or conn.info.transaction_status != TransactionStatus.IDLE):
                    conn.close()
                else:
                    with self._lock:
                        self._idle.append(conn)
        finally:
            self._slots.release()

    def close(self) -> None:
        self.closed = True
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class _Now:
    """A blocking cursor seen as an async one, for the steps written once for both."""

    def __init__(self, conn: psycopg.Connection[TupleRow]) -> None:
        self._conn = conn
        self._cur: psycopg.Cursor[TupleRow] | None = None

    async def execute(self, query: bytes, params: dict[str, Any]) -> _Now:
        self._cur = self._conn.execute(query, params)
        return self

    async def fetchall(self) -> list[TupleRow]:
        return [] if self._cur is None else self._cur.fetchall()


class PostgresRows:
    dialect = "postgres"
    inline = True

    def __init__(self, url: str, *, pool_size: int = 4, connect_timeout: float = 5.0) -> None:
        self.url = url
        self.safe_url = redact(url)
        scheme, sep, rest = url.partition("://")
        if scheme.lower() not in _SCHEMES or not sep:
            raise ConfigError(f"malformed Postgres URL {self.safe_url!r}: expected "
                              "postgresql://user@host:port/db")
        if pool_size < 1:
            raise ConfigError(f"pool_size must be at least 1, got {pool_size}")
        rest, _ = pool_options(rest, self.safe_url)  # the store's own options, not libpq's
        rest, pool_mode, _ = pooler_options(rest, self.safe_url)
        # Through PgBouncer's transaction pooling: no prepared statements, no options
        # parameter (store/pg_pooler.py).
        self._transaction_pooling = pool_mode == "transaction"
        try:
            params = conninfo_to_dict("postgresql://" + rest)
        except psycopg.Error as exc:
            raise ConfigError(f"malformed Postgres URL {self.safe_url!r}") from exc
        self._password = str(params.get("password") or "")
        if not self._transaction_pooling:
            options = str(params.get("options") or "")
            params["options"] = f"{options} -c synchronous_commit=on".strip()
        params.setdefault("application_name", "tether-langgraph")
        params.setdefault("connect_timeout", max(2, round(connect_timeout)))
        self._conninfo = make_conninfo("", **params)
        self._pool_size = pool_size
        self._timeout = connect_timeout
        self._pool: _Conns | None = None
        self._blocking: _BlockingConns | None = None
        self._q = _queries()

    def _error(self, exc: BaseException) -> StoreError:
        text = str(exc).strip() or type(exc).__name__
        if self._password:
            text = text.replace(self._password, "***")
        err: StoreError
        if isinstance(exc, psycopg.errors.UndefinedTable) and "lg_" in text:
            err = SchemaError(f"the database at {self.safe_url} has no LangGraph tables: call "
                              f"`await saver.setup()` (or run `tether migrate`) first")
        elif isinstance(exc, TimeoutError | psycopg.OperationalError):
            err = StoreUnavailable(f"Postgres at {self.safe_url} is unavailable: {text}")
        else:
            err = StoreError(f"Postgres error: {text}")
        err.__cause__ = exc
        return err

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self, *, private_loop: bool) -> None:
        pool = _Conns(self._conninfo, self._pool_size, self._timeout * 3)
        prepare = None if self._transaction_pooling else 5
        pool.prepare_threshold = prepare
        try:  # one connection now: a wrong URL or a server down is an error here
            async with pool.connection():
                pass
        except (TimeoutError, psycopg.Error) as exc:
            await pool.close()
            raise self._error(exc) from exc
        self._pool = pool
        self._blocking = _BlockingConns(self._conninfo, self._pool_size, self._timeout * 3)
        self._blocking.prepare_threshold = prepare

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        blocking, self._blocking = self._blocking, None
        if blocking is not None:
            blocking.close()
        if pool is not None:
            await pool.close()

    async def migrate(self) -> None:
        from ..store.migrate import latest
        from ..store.postgres import PostgresStore

        if await self._applied() >= latest("postgres"):
            return  # up to date: no second connection, no migration lock (a saver per request)

        store = PostgresStore(self.url, min_size=1, max_size=2)
        await store.open(check_schema=False)
        try:
            await store.migrate()
        finally:
            await store.close()

    async def _applied(self) -> int:
        """The last tether migration applied to the database (0: none)."""
        found = await self._exec("schema_table", {})
        if not (found and found[0][0]):
            return 0
        rows = await self._exec("schema_applied", {})
        return int(rows[0][0]) if rows else 0

    # -- plumbing --------------------------------------------------------------------------

    def _need(self) -> _Conns:
        if self._pool is None:
            raise StoreError("the saver is not open")
        return self._pool

    def _inline(self) -> _BlockingConns:
        if self._blocking is None:
            raise StoreError("the saver is not open")
        return self._blocking

    async def _exec(self, name: str, params: dict[str, Any]) -> list[TupleRow]:
        if INLINE.get():
            try:
                with self._inline().connection() as bconn:
                    bcur = bconn.execute(self._q[name], params)
                    return bcur.fetchall() if bcur.description else []
            except (TimeoutError, psycopg.Error) as exc:
                raise self._error(exc) from exc
        try:
            async with self._need().connection() as conn:
                cur = await conn.execute(self._q[name], params)
                return await cur.fetchall() if cur.description else []
        except (TimeoutError, psycopg.Error) as exc:
            raise self._error(exc) from exc

    async def _transaction(self, steps: Any) -> Any:
        """Run `steps(conn)` in one transaction."""
        if INLINE.get():
            try:
                with self._inline().connection() as bconn, bconn.transaction():
                    return await steps(_Now(bconn))
            except (TimeoutError, psycopg.Error) as exc:
                raise self._error(exc) from exc
        try:
            async with self._need().connection() as conn, conn.transaction():
                return await steps(conn)
        except (TimeoutError, psycopg.Error) as exc:
            raise self._error(exc) from exc

    async def _locked(self, thread_ids: Sequence[str], steps: Any) -> Any:
        """Run `steps(conn)` in one transaction holding the threads' advisory locks."""

        async def locked(conn: Conn | _Now) -> Any:
            await conn.execute(self._q["lock_threads"], {"thread_ids": list(thread_ids)})
            return await steps(conn)

        return await self._transaction(locked)

    async def _collect(self, conn: Conn | _Now, thread_id: str, ns: str, collect: Collect) -> None:
        q, key = self._q, {"thread_id": thread_id, "ns": ns}
        bodies = await (await conn.execute(q["namespace_checkpoints"], key)).fetchall()
        keys = await (await conn.execute(q["namespace_blob_keys"], key)).fetchall()
        dead = collect(cast(list[tuple[str, bytes]], bodies),
                       cast(list[tuple[str, str, "str | None"]], keys))
        if dead:
            await conn.execute(q["delete_blobs"], {**key, "channels": [c for c, _ in dead],
                                                   "versions": [v for _, v in dead]})

    # -- writes ----------------------------------------------------------------------------

    async def put(self, row: tuple[Any, ...], thread_id: str, ns: str,
                  blobs: Sequence[Blob]) -> bool:
        checkpoint_id, parent_id, run_id, type_, body, metadata = row[2:]
        rows = await self._exec("put_checkpoint", {
            "thread_id": thread_id, "ns": ns, "checkpoint_id": checkpoint_id,
            "parent_id": parent_id, "run_id": run_id, "type": type_, "checkpoint": body,
            "metadata": metadata,
            "channels": [b.channel for b in blobs], "versions": [b.version for b in blobs],
            "types": [b.type for b in blobs], "blobs": [b.blob for b in blobs],
            "bases": [b.base for b in blobs]})
        return bool(rows[0][0] == 0)

    async def put_writes(self, rows: Sequence[tuple[Any, ...]], replace: bool,
                         flush: bool) -> None:
        if not rows:
            return
        q = self._q
        thread_id, ns, checkpoint_id, task_id = rows[0][:4]
        new: list[Write] = [(r[4], r[5], r[6], r[7]) for r in rows]
        key = {"thread_id": thread_id, "ns": ns, "checkpoint_id": checkpoint_id,
               "task_id": task_id}
        commit = {"commit": "on" if flush else "off"}
        first = {**key, **commit, "task_path": rows[0][8],
                 "writes": pack_writes(merge_writes((), new, replace))}
        if await self._exec("insert_writes", first):
            return  # the task's first writes: one statement

        async def merge(conn: Conn | _Now) -> bool:
            await conn.execute(q["set_commit_mode"], commit)
            found = await (await conn.execute(q["lock_task_writes"], key)).fetchall()
            if not found:  # deleted meanwhile: insert again
                return bool(await (await conn.execute(q["insert_writes"], first)).fetchall())
            task_path, data = found[0]
            stored = unpack_writes(data)
            merged = merge_writes(stored, new, replace)
            if merged != {w[0]: w for w in stored}:
                await conn.execute(q["update_task_writes"], {
                    **key, "task_path": rows[0][8] if replace else task_path,
                    "writes": pack_writes(merged)})
            return True

        for _ in range(_MAX_WRITE_ROUNDS):
            if await self._transaction(merge):
                return
        raise StoreError(f"LangGraph writes of task {task_id!r} could not be stored: its row "
                         "was inserted and deleted concurrently again and again")

    async def delete_thread(self, thread_id: str) -> None:
        await self._exec("delete_thread", {"thread_id": thread_id})

    async def delete_for_runs(self, run_ids: Sequence[str], collect: Collect) -> list[str]:
        q, ids = self._q, {"run_ids": list(run_ids)}
        spaces = await self._exec("run_namespaces", ids)
        threads = sorted({t for t, _ in spaces})
        if not threads:
            return []

        async def steps(conn: Conn | _Now) -> list[str]:
            # Read again under the locks: the namespaces to collect are the ones deleted from.
            found = await (await conn.execute(q["run_namespaces"], ids)).fetchall()
            await conn.execute(q["delete_run_writes"], ids)
            await conn.execute(q["delete_run_checkpoints"], ids)
            for thread_id, ns in found:
                await self._collect(conn, thread_id, ns, collect)
            return sorted({t for t, _ in found})

        touched: list[str] = await self._locked(threads, steps)
        return touched

    async def prune(self, thread_ids: Sequence[str], keep_latest: bool,
                    collect: Collect) -> None:
        q = self._q
        threads = list(dict.fromkeys(thread_ids))

        async def steps(conn: Conn | _Now) -> None:
            for thread_id in threads:
                key = {"thread_id": thread_id}
                if not keep_latest:
                    await conn.execute(q["delete_thread"], key)
                    continue
                await conn.execute(q["delete_older_checkpoints"], key)
                await conn.execute(q["delete_orphan_writes"], key)
                spaces = await (await conn.execute(q["blob_namespaces"], key)).fetchall()
                for (ns,) in spaces:
                    await self._collect(conn, thread_id, ns, collect)

        if threads:
            await self._locked(threads, steps)

    async def copy_thread(self, source: str, target: str) -> None:
        await self._exec("copy_thread", {"source": source, "target": target})

    # -- reads -----------------------------------------------------------------------------

    async def get(self, thread_id: str, ns: str, checkpoint_id: str | None
                  ) -> CheckpointRow | None:
        if checkpoint_id is None:
            rows = await self._exec("latest_checkpoint", {"thread_id": thread_id, "ns": ns})
        else:
            rows = await self._exec("get_checkpoint", {
                "thread_id": thread_id, "ns": ns, "checkpoint_id": checkpoint_id})
        return cast(CheckpointRow, rows[0]) if rows else None

    async def find(self, thread_id: str | None, ns: str | None, checkpoint_id: str | None,
                   before: str | None, filter_json: str | None, limit: int | None
                   ) -> list[CheckpointRow]:
        params: dict[str, Any] = {"thread_id": thread_id, "ns": ns,
                                  "checkpoint_id": checkpoint_id, "before": before,
                                  "filter": filter_json, "limit": limit}
        if thread_id is None:
            name = "list_all"
            del params["thread_id"], params["ns"], params["checkpoint_id"]
        elif ns is None:
            name = "list_in_thread"
            del params["ns"]
        else:
            name = "list_in_namespace"
        return cast(list[CheckpointRow], await self._exec(name, params))

    async def writes_of(self, keys: Sequence[tuple[str, str, str]]) -> list[WriteRow]:
        rows = await self._exec("writes_of", {"threads": [k[0] for k in keys],
                                              "nss": [k[1] for k in keys],
                                              "ids": [k[2] for k in keys]})
        return [(t, n, c, task_id, channel, type_, blob)
                for t, n, c, task_id, data in rows
                for _, channel, type_, blob in unpack_writes(data)]

    async def blobs_of(self, keys: Sequence[tuple[str, str, str, str]]) -> list[BlobRow]:
        rows = await self._exec("blobs_of", {"threads": [k[0] for k in keys],
                                             "nss": [k[1] for k in keys],
                                             "channels": [k[2] for k in keys],
                                             "versions": [k[3] for k in keys]})
        return cast(list[BlobRow], rows)
