"""TetherSaver's Postgres rows: how each operation is said in Postgres (sql/postgres.sql).

A few autocommit connections (_Conns); a put and a task's writes are one statement each
(one round trip, atomic by themselves); prune and delete_for_runs are one transaction under
per-thread advisory locks. `synchronous_commit=on` on every connection: a checkpoint put is in
the WAL on disk when it returns.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
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
from ._blobs import Blob
from ._rows import BlobRow, CheckpointRow, Collect, WriteRow

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
                self._conninfo, autocommit=True)
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


class PostgresRows:
    dialect = "postgres"

    def __init__(self, url: str, *, pool_size: int = 4, connect_timeout: float = 5.0) -> None:
        self.url = url
        self.safe_url = redact(url)
        scheme, sep, rest = url.partition("://")
        if scheme.lower() not in _SCHEMES or not sep:
            raise ConfigError(f"malformed Postgres URL {self.safe_url!r}: expected "
                              "postgresql://user@host:port/db")
        if pool_size < 1:
            raise ConfigError(f"pool_size must be at least 1, got {pool_size}")
        try:
            params = conninfo_to_dict("postgresql://" + rest)
        except psycopg.Error as exc:
            raise ConfigError(f"malformed Postgres URL {self.safe_url!r}") from exc
        self._password = str(params.get("password") or "")
        options = str(params.get("options") or "")
        params["options"] = f"{options} -c synchronous_commit=on".strip()
        params.setdefault("application_name", "tether-langgraph")
        params.setdefault("connect_timeout", max(2, round(connect_timeout)))
        self._conninfo = make_conninfo("", **params)
        self._pool_size = pool_size
        self._timeout = connect_timeout
        self._pool: _Conns | None = None
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
        try:  # one connection now: a wrong URL or a server down is an error here
            async with pool.connection():
                pass
        except (TimeoutError, psycopg.Error) as exc:
            await pool.close()
            raise self._error(exc) from exc
        self._pool = pool

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def migrate(self) -> None:
        from ..store.postgres import PostgresStore

        store = PostgresStore(self.url, min_size=1, max_size=2)
        await store.open(check_schema=False)
        try:
            await store.migrate()
        finally:
            await store.close()

    # -- plumbing --------------------------------------------------------------------------

    def _need(self) -> _Conns:
        if self._pool is None:
            raise StoreError("the saver is not open")
        return self._pool

    async def _exec(self, name: str, params: dict[str, Any]) -> list[TupleRow]:
        try:
            async with self._need().connection() as conn:
                cur = await conn.execute(self._q[name], params)
                return await cur.fetchall() if cur.description else []
        except (TimeoutError, psycopg.Error) as exc:
            raise self._error(exc) from exc

    async def _locked(self, thread_ids: Sequence[str], steps: Any) -> Any:
        """Run `steps(conn)` in one transaction holding the threads' advisory locks."""
        try:
            async with self._need().connection() as conn, conn.transaction():
                await conn.execute(self._q["lock_threads"], {"thread_ids": list(thread_ids)})
                return await steps(conn)
        except (TimeoutError, psycopg.Error) as exc:
            raise self._error(exc) from exc

    async def _collect(self, conn: Conn, thread_id: str, ns: str, collect: Collect) -> None:
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
        thread_id, ns, checkpoint_id, task_id = rows[0][:4]
        await self._exec("upsert_writes" if replace else "insert_writes", {
            "thread_id": thread_id, "ns": ns, "checkpoint_id": checkpoint_id,
            "task_id": task_id, "task_path": rows[0][8], "commit": "on" if flush else "off",
            "idxs": [r[4] for r in rows], "channels": [r[5] for r in rows],
            "types": [r[6] for r in rows], "blobs": [r[7] for r in rows]})

    async def delete_thread(self, thread_id: str) -> None:
        await self._exec("delete_thread", {"thread_id": thread_id})

    async def delete_for_runs(self, run_ids: Sequence[str], collect: Collect) -> list[str]:
        q, ids = self._q, {"run_ids": list(run_ids)}
        spaces = await self._exec("run_namespaces", ids)
        threads = sorted({t for t, _ in spaces})
        if not threads:
            return []

        async def steps(conn: Conn) -> list[str]:
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

        async def steps(conn: Conn) -> None:
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
        return cast(list[WriteRow], rows)

    async def blobs_of(self, keys: Sequence[tuple[str, str, str, str]]) -> list[BlobRow]:
        rows = await self._exec("blobs_of", {"threads": [k[0] for k in keys],
                                             "nss": [k[1] for k in keys],
                                             "channels": [k[2] for k in keys],
                                             "versions": [k[3] for k in keys]})
        return cast(list[BlobRow], rows)
