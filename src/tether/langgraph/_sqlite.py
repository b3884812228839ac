"""TetherSaver's SQLite rows: how each operation is said in SQLite (sql/sqlite.sql).

Two connections, as tether's SQLite store: writes run on one commit thread, and those submitted
while a commit is in flight are committed together in the next IMMEDIATE transaction (one
fsync for many checkpoints); reads run on the event loop's thread and see the last committed
WAL snapshot. WAL with `synchronous=FULL` unless the URL says otherwise (`?synchronous=NORMAL`):
a checkpoint put is on disk when it returns. An in-memory database is one connection, used on
the loop's thread, and so are commits on the saver's private loop. Calls of sync callers
(_rows.INLINE) run in their own thread: a write is its own transaction there, one at a time
with the group commits (a lock per connection).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from importlib import resources
from typing import Any

import orjson

from ..errors import ConfigError, SchemaError, StoreError, StoreUnavailable
from ..store.migrate import parse_queries
from ..store.sqlite import apply_migrations, parse_sqlite_url
from ..store.sqlite_jobs import finished
from ._blobs import Blob
from ._rows import INLINE, BlobRow, CheckpointRow, Collect, Ready, WriteRow

Job = Callable[[sqlite3.Connection], Any]
_Fut = asyncio.Future[Any] | None  # None: an inline write's (no future: it returns)
_SYNC_MODES = frozenset({"OFF", "NORMAL", "FULL", "EXTRA"})


@cache
def _queries() -> dict[str, str]:
    text = (resources.files("tether.langgraph") / "sql" / "sqlite.sql").read_text("utf-8")
    return parse_queries(text, "tether/langgraph/sql/sqlite.sql")


def _error(exc: sqlite3.Error, url: str) -> StoreError:
    text = str(exc)
    if "no such table: lg_" in text:
        err: StoreError = SchemaError(
            f"the database at {url} has no LangGraph tables: call `await saver.setup()` "
            f"(or run `tether migrate --db {url}`) first")
    else:
        err = StoreError(f"SQLite error: {text}")
    err.__cause__ = exc
    return err


class SQLiteRows:
    dialect = "sqlite"
    inline = True

    def __init__(self, url: str, *, busy_timeout: float = 30.0) -> None:
        self.url = url
        self.path, opts = parse_sqlite_url(url)
        sync = opts.get("synchronous", "FULL").upper()
        if sync not in _SYNC_MODES:
            raise ConfigError(f"synchronous must be one of {sorted(_SYNC_MODES)}, got {sync!r}")
        self._sync = sync
        self._busy = busy_timeout
        self._memory = self.path == ":memory:"
        # One thread at a time on each connection (one for both when in memory).
        self._wlock = threading.Lock()
        self._rlock = self._wlock if self._memory else threading.Lock()
        self._q = _queries()
        self._read: sqlite3.Connection | None = None
        self._write: sqlite3.Connection | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[tuple[Job, _Fut, bool]] = []
        self._synchronous = sync  # the write connection's setting now
        self._committing = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        if not self._memory:
            parent = os.path.dirname(os.path.abspath(self.path))
            if not os.path.isdir(parent):
                raise StoreUnavailable(f"cannot open {self.url}: directory {parent!r} does not exist")
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=self._busy,
                                   check_same_thread=False)
            if not self._memory:
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self._sync}")
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot open {self.url}: {exc}") from exc
        return conn

    async def open(self, *, private_loop: bool) -> None:
        self._loop = asyncio.get_running_loop()
        self._write = self._connect()
        self._read = self._write if self._memory else self._connect()
        if not self._memory and not private_loop:
            # Commits (and their fsync) off a loop that others' coroutines run on. On the
            # saver's private loop they run inline: a hand-over to another thread costs more
            # than it frees there.
            self._pool = ThreadPoolExecutor(1, "tether-langgraph-sqlite")

    async def close(self) -> None:
        await self._idle.wait()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        read, write, self._read, self._write = self._read, self._write, None, None
        if read is not None and read is not write:
            read.close()
        if write is not None:
            write.close()

    async def migrate(self) -> None:
        await self._w(apply_migrations)

    # -- plumbing --------------------------------------------------------------------------

    def _r(self, job: Job) -> Any:
        if self._read is None:
            raise StoreError("the saver is not open")
        try:
            with self._rlock:
                return job(self._read)
        except sqlite3.Error as exc:
            raise _error(exc, self.url) from exc

    def _w(self, job: Job, flush: bool = True) -> Awaitable[Any]:
        """Run `job` in the next group commit. `flush` False: the commit need not wait for the
        disk (synchronous=NORMAL in WAL mode: it survives a crash of this process, and the
        next FULL commit, a checkpoint's, syncs the WAL with it); a batch with any flushed job
        is committed with the URL's setting."""
        if self._write is None or self._loop is None:
            raise StoreError("the saver is not open")
        if INLINE.get():  # a sync caller's thread: its own transaction, now
            [(_, ok, value)] = self._transaction([(job, None, flush)])
            if not ok:
                raise value
            return Ready(value)
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._pending.append((job, fut, flush))
        if not self._committing:
            self._committing = True
            self._idle.clear()
            self._loop.call_soon(self._commit_next)
        return fut

    def _commit_next(self) -> None:
        """Commit every write submitted so far in one transaction: on the commit thread, or
        inline (an in-memory database, the saver's private loop)."""
        assert self._loop is not None
        batch, self._pending = self._pending, []
        if not batch:
            self._committing = False
            self._idle.set()
            return
        if self._pool is None:
            self._deliver(self._transaction(batch))
            return
        cf = self._pool.submit(self._transaction, batch)
        loop = self._loop
        cf.add_done_callback(lambda f: loop.call_soon_threadsafe(self._deliver, f.result()))

    def _deliver(self, results: list[tuple[_Fut, bool, Any]]) -> None:
        """Hand each job's result to its caller, then start the next group commit."""
        for fut, ok, value in results:
            if fut is None or fut.done():  # the caller was cancelled; the write happened or not, atomically
                continue
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)
        self._commit_next()

    def _transaction(self, batch: list[tuple[Job, _Fut, bool]]) -> list[tuple[_Fut, bool, Any]]:
        """Each job in a savepoint of one IMMEDIATE transaction: a job that fails is undone
        alone and gets its error; the others commit. If the transaction itself fails, every
        job gets that error (nothing of the batch is stored)."""
        with self._wlock:
            return self._transaction_locked(batch)

    def _transaction_locked(self, batch: list[tuple[Job, _Fut, bool]]
                            ) -> list[tuple[_Fut, bool, Any]]:
        conn = self._write
        if conn is None:
            closed = StoreError("the saver is not open")
            return [(fut, False, closed) for _, fut, _ in batch]
        done: list[tuple[_Fut, bool, Any]] = []
        sync = self._sync
        if sync in ("FULL", "EXTRA") and not any(flush for _, _, flush in batch):
            sync = "NORMAL"
        try:
            if sync != self._synchronous:
                conn.execute(f"PRAGMA synchronous={sync}")
                self._synchronous = sync
            conn.execute("BEGIN IMMEDIATE")
            for job, fut, _ in batch:
                conn.execute("SAVEPOINT job")
                try:
                    done.append((fut, True, finished(job(conn))))
                except Exception as exc:
                    conn.execute("ROLLBACK TO job")
                    done.append((fut, False, _error(exc, self.url)
                                 if isinstance(exc, sqlite3.Error) else exc))
                conn.execute("RELEASE job")
            conn.execute("COMMIT")
        except Exception as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            err = _error(exc, self.url) if isinstance(exc, sqlite3.Error) else exc
            return [(fut, False, err) for _, fut, _ in batch]
        return done

    # -- writes ----------------------------------------------------------------------------

    async def put(self, row: tuple[Any, ...], thread_id: str, ns: str,
                  blobs: Sequence[Blob]) -> bool:
        q = self._q

        def job(conn: sqlite3.Connection) -> bool:
            for b in blobs:
                if b.base is not None and conn.execute(
                        q["blob_exists"], (thread_id, ns, b.channel, b.base)).fetchone() is None:
                    b = b.whole()
                conn.execute(q["insert_blob"],
                             (thread_id, ns, b.channel, b.version, b.type, b.blob, b.base))
            conn.execute(q["insert_checkpoint"], row)
            return True

        return bool(await self._w(job))

    async def put_writes(self, rows: Sequence[tuple[Any, ...]], replace: bool,
                         flush: bool) -> None:
        sql = self._q["upsert_write" if replace else "insert_write"]
        await self._w(lambda conn: conn.executemany(sql, rows).close(), flush=flush)

    async def delete_thread(self, thread_id: str) -> None:
        q = self._q

        def job(conn: sqlite3.Connection) -> None:
            for name in ("delete_thread_checkpoints", "delete_thread_writes",
                         "delete_thread_blobs"):
                conn.execute(q[name], (thread_id,))

        await self._w(job)

    def _collect(self, conn: sqlite3.Connection, thread_id: str, ns: str,
                 collect: Collect) -> None:
        q = self._q
        bodies = conn.execute(q["namespace_checkpoints"], (thread_id, ns)).fetchall()
        keys = conn.execute(q["namespace_blob_keys"], (thread_id, ns)).fetchall()
        dead = collect(bodies, keys)
        conn.executemany(q["delete_blob"], [(thread_id, ns, ch, v) for ch, v in dead])

    async def delete_for_runs(self, run_ids: Sequence[str], collect: Collect) -> list[str]:
        q = self._q
        ids = orjson.dumps(list(run_ids)).decode()

        def job(conn: sqlite3.Connection) -> list[str]:
            spaces = conn.execute(q["run_namespaces"], {"run_ids": ids}).fetchall()
            conn.execute(q["delete_run_writes"], {"run_ids": ids})
            conn.execute(q["delete_run_checkpoints"], {"run_ids": ids})
            for thread_id, ns in spaces:
                self._collect(conn, thread_id, ns, collect)
            return sorted({t for t, _ in spaces})

        threads: list[str] = await self._w(job)
        return threads

    async def prune(self, thread_ids: Sequence[str], keep_latest: bool,
                    collect: Collect) -> None:
        q = self._q

        def job(conn: sqlite3.Connection) -> None:
            for thread_id in dict.fromkeys(thread_ids):
                if not keep_latest:
                    for name in ("delete_thread_checkpoints", "delete_thread_writes",
                                 "delete_thread_blobs"):
                        conn.execute(q[name], (thread_id,))
                    continue
                conn.execute(q["delete_older_checkpoints"], {"thread_id": thread_id})
                conn.execute(q["delete_orphan_writes"], {"thread_id": thread_id})
                for ns, in conn.execute(q["blob_namespaces"], (thread_id,)).fetchall():
                    self._collect(conn, thread_id, ns, collect)

        await self._w(job)

    async def copy_thread(self, source: str, target: str) -> None:
        q = self._q
        params = {"source": source, "target": target}

        def job(conn: sqlite3.Connection) -> None:
            for name in ("copy_checkpoints", "copy_blobs", "copy_writes"):
                conn.execute(q[name], params)

        await self._w(job)

    # -- reads -----------------------------------------------------------------------------

    async def get(self, thread_id: str, ns: str, checkpoint_id: str | None
                  ) -> CheckpointRow | None:
        if checkpoint_id is None:
            sql, params = self._q["latest_checkpoint"], {"thread_id": thread_id, "ns": ns}
        else:
            sql = self._q["get_checkpoint"]
            params = {"thread_id": thread_id, "ns": ns, "checkpoint_id": checkpoint_id}
        row: CheckpointRow | None = self._r(lambda c: c.execute(sql, params).fetchone())
        return row

    async def find(self, thread_id: str | None, ns: str | None, checkpoint_id: str | None,
                   before: str | None, filter_json: str | None, limit: int | None
                   ) -> list[CheckpointRow]:
        params = {"thread_id": thread_id, "ns": ns, "checkpoint_id": checkpoint_id,
                  "before": before, "filter": filter_json,
                  "limit": -1 if limit is None else limit}
        if thread_id is None:
            sql = self._q["list_all"]
            del params["thread_id"], params["ns"], params["checkpoint_id"]
        elif ns is None:
            sql = self._q["list_in_thread"]
            del params["ns"]
        else:
            sql = self._q["list_in_namespace"]
        rows: list[CheckpointRow] = self._r(lambda c: c.execute(sql, params).fetchall())
        return rows

    async def writes_of(self, keys: Sequence[tuple[str, str, str]]) -> list[WriteRow]:
        sql, arg = self._q["writes_of"], {"keys": orjson.dumps(keys).decode()}
        rows: list[WriteRow] = self._r(lambda c: c.execute(sql, arg).fetchall())
        return rows

    async def blobs_of(self, keys: Sequence[tuple[str, str, str, str]]) -> list[BlobRow]:
        sql, arg = self._q["blobs_of"], {"keys": orjson.dumps(keys).decode()}
        rows: list[BlobRow] = self._r(lambda c: c.execute(sql, arg).fetchall())
        return rows
