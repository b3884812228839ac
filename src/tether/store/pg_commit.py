"""Postgres group commit: the writer behind commit_step, record_call and create_run.

Group commit: the writer's statements are fenced single statements. One that finds the writer
idle runs at once, in the caller's task, on the writer's pooled connection (the sequential case
pays nothing for batching). Writes arriving while it is busy queue up; a commit thread with a
connection of its own sends each queue-full as one transaction in one pipeline, one round trip
and one WAL flush for the lot: BEGIN; lock_batch (every run row involved, in thread_id order);
all step commits as one multi-row statement, all journal writes as another, the rest as
executemany; COMMIT. Each write is fenced on its own (a stale epoch matches no row; it does not
raise), so a lost lease never affects its batch-mates; if the transaction raises, its writes are
retried one by one so only the culprit fails.

The thread takes the next batch as soon as one commits, whatever the event loop is doing: run
on the loop, each batch's round trips waited behind thousands of step callbacks (a 1,000-write
batch took 40-50 ms instead of about 20 at 10,000 concurrent runs) and the writer was the
limit. psycopg releases the GIL while it waits on the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

import orjson
import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow

from ..errors import StoreError, StoreUnavailable
from .pg_io import (
    _BEGIN,
    _MAX_BATCH,
    _TX_ATTEMPTS,
    Params,
    PgIO,
    SyncConn,
    _is_disconnect,
    _Job,
    _Key,
    _retryable,
)

log = logging.getLogger("tether.store.postgres")


class PgCommitter(PgIO):
    """The writer: a pooled connection for the write that finds it idle; the group commits of
    the writes that queue meanwhile on a commit thread with a connection of its own."""

    def _lost(self, exc: psycopg.Error) -> StoreError:
        """_error() for the committer: a lost connection is replaced before the next write
        (after some errors, e.g. an admin shutdown, it does not look closed yet)."""
        if _is_disconnect(exc):
            self._writer_lost = True
            self._cursor = None
            self._heal()
        return self._error(exc)

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
            return await self._execute_one(query, params)
        except psycopg.Error as exc:
            raise self._lost(exc) from exc
        finally:
            self._busy = False
            if self._queue or not self._accepting:
                self._wake.set()

    async def _commit_loop(self) -> None:
        queue, wake = self._queue, self._wake
        loop = asyncio.get_running_loop()
        try:
            while True:
                await wake.wait()
                wake.clear()
                while queue and not self._busy:
                    self._busy = True
                    try:
                        await loop.run_in_executor(self._commit_thread, self._drain, loop)
                    except Exception as exc:  # a bug, not a database error: keep serving
                        log.exception("group commit failed")
                        for job in list(queue):
                            _fail(job[3], StoreError(f"group commit failed: {exc!r}"))
                        queue.clear()
                    finally:
                        self._busy = False
                if not self._accepting and not queue and not self._busy:
                    return
        finally:
            # Jobs are left only if we were cancelled (close timed out) or hit a bug: never
            # leave a caller waiting forever.
            for job in queue:
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

    async def _execute_one(self, query: bytes, params: Params) -> TupleRow | None:
        """One statement on the writer's connection (autocommit); its first row. A deadlock
        victim wrote nothing, so it runs again (a few times)."""
        for attempt in range(1, _TX_ATTEMPTS + 1):
            try:
                cur = self._cursor
                if cur is None or cur.closed or cur.connection.closed:
                    cur = await self._new_cursor()
                await cur.execute(query, params)
                return await cur.fetchone()
            except psycopg.Error as exc:
                if not _retryable(exc) or attempt == _TX_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    # -- the commit thread ----------------------------------------------------------------

    def _drain(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the commit thread: commit queue-fulls until the queue is empty, handing each
        batch's outcomes to the loop as it commits. (Only this thread takes from the queue;
        the loop only appends.)"""
        queue = self._queue
        while queue:
            batch = [queue.popleft() for _ in range(min(len(queue), _MAX_BATCH))]
            try:
                outcomes = self._commit_batch(batch)
            except Exception as exc:  # a bug, not a database error
                log.exception("group commit of %d writes failed", len(batch))
                outcomes = [(job[3], StoreError(f"group commit failed: {exc!r}"))
                            for job in batch]
            loop.call_soon_threadsafe(self._settle, outcomes)

    def _settle(self, outcomes: list[_Outcome]) -> None:
        lost = False
        for fut, value in outcomes:
            if isinstance(value, StoreError):
                lost = lost or isinstance(value, StoreUnavailable)
                _fail(fut, value)
            else:
                _done(fut, value)
        if lost:
            self._heal()  # what killed the thread's connection likely killed pooled ones too

    def _thread_conn(self) -> SyncConn:
        conn = self._sync_conn
        if conn is None or conn.closed:
            self._sync_conn = None
            conn = psycopg.Connection.connect(self._commit_conninfo, autocommit=True)
            self._sync_conn = conn
        return conn

    def _thread_lost(self, exc: psycopg.Error) -> StoreError:
        """_error() on the commit thread: a lost connection is replaced at the next batch."""
        if _is_disconnect(exc) and self._sync_conn is not None:
            with contextlib.suppress(psycopg.Error, OSError):
                self._sync_conn.close()
        return self._error(exc)

    def _commit_batch(self, batch: list[_Job]) -> list[_Outcome]:
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
        try:
            conn = self._thread_conn()
            try:
                plan = self._send_batch(conn, batch, groups)
            except BaseException:
                _rollback_sync(conn)
                raise
        except psycopg.Error as exc:
            if _is_disconnect(exc):
                # The outcome is unknown: re-running could commit twice. Report it to all.
                err = self._thread_lost(exc)
                return [(job[3], err) for job in batch]
            stats["batch_retries"] += 1
            log.debug("group commit of %d writes failed (%s); retrying them one by one",
                      len(batch), self._message(exc))
            return [self._commit_one(job) for job in batch]
        # Committed. (Anything raised from here fails the batch's callers; nothing retries.)
        firsts: list[TupleRow | None] = [None] * len(batch)
        for cur, members, key in plan:
            if key is not None:
                done = {tuple(row) for row in cur.fetchall()}
                for i in members:
                    firsts[i] = _OK if key(batch[i][1]) in done else None
                continue
            results = [cur.fetchone()]
            while cur.nextset():
                results.append(cur.fetchone())
            if len(results) != len(members):  # cannot happen; never guess which is which
                raise StoreError(f"group commit: {len(results)} results for {len(members)}")
            for i, row in zip(members, results, strict=True):
                firsts[i] = row
        return [(job[3], first) for job, first in zip(batch, firsts, strict=True)]

    def _commit_one(self, job: _Job) -> _Outcome:
        """One write alone (autocommit); its first row. A deadlock victim wrote nothing, so
        it runs again (a few times)."""
        query, params, _, fut = job
        for attempt in range(1, _TX_ATTEMPTS + 1):
            try:
                cur = self._thread_conn().execute(query, params)
                return fut, cur.fetchone()
            except psycopg.Error as exc:
                if not _retryable(exc) or attempt == _TX_ATTEMPTS:
                    return fut, self._thread_lost(exc)
        raise AssertionError("unreachable")

    def _send_batch(
        self, conn: SyncConn, batch: list[_Job], groups: dict[bytes, list[int]]
    ) -> list[tuple[psycopg.Cursor[TupleRow], list[int], _Key | None]]:
        """Send the batch's transaction in one pipeline; (cursor, its jobs, row key) per
        statement. Raises the first statement's error, if any."""
        plan: list[tuple[psycopg.Cursor[TupleRow], list[int], _Key | None]] = []
        failure: psycopg.Error | None = None
        try:
            with conn.pipeline():
                try:
                    conn.execute(_BEGIN)
                    conn.execute(self._q["lock_batch"], {"ids": sorted({job[2] for job in batch})})
                    for query, members in groups.items():
                        cur = conn.cursor()
                        seq = [batch[i][1] for i in members]
                        bulk = self._bulk.get(query)
                        rows = (_json_rows(seq) if bulk is not None and len(seq) > 1
                                and bulk[2](seq) else None)
                        if bulk is not None and rows is not None:
                            cur.execute(bulk[0], {"rows": rows})
                            plan.append((cur, members, bulk[1]))
                        else:
                            cur.executemany(query, seq, returning=True)
                            plan.append((cur, members, None))
                    conn.execute(b"COMMIT")
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


def _json_rows(seq: list[Params]) -> str | None:
    """The rows of a multi-row statement as one JSON array (orjson: one C call, where psycopg
    would dump an array per column element by element), bytes as their UTF-8 text. None if
    some bytes are not text JSON can carry (then the statements go one by one)."""
    try:
        return orjson.dumps(seq, default=_bytes_as_text).decode()
    except (TypeError, orjson.JSONEncodeError):
        return None


def _bytes_as_text(value: object) -> str:
    if isinstance(value, bytes) and b"\x00" not in value:  # Postgres text holds no NUL
        try:
            return value.decode()
        except UnicodeDecodeError:
            pass
    raise TypeError(f"{type(value).__name__} is not JSON text")


def _thread_of(job: _Job) -> str:
    return job[2]


_Outcome = tuple["asyncio.Future[TupleRow | None]", "TupleRow | StoreError | None"]
_OK: Final[TupleRow] = (True,)  # the result a multi-row group commit gives a committed job


def _rollback_sync(conn: SyncConn) -> None:
    """_rollback() for the commit thread's connection: always ROLLBACK; close it if that
    fails (the next batch connects again)."""
    if conn.closed:
        return
    try:
        conn.execute(b"ROLLBACK")
        if conn.info.transaction_status == TransactionStatus.IDLE:
            return
    except (psycopg.Error, OSError):
        pass
    with contextlib.suppress(psycopg.Error, OSError):
        conn.close()


def _done(fut: asyncio.Future[TupleRow | None], value: TupleRow | None) -> None:
    if not fut.done():  # a cancelled caller: the write happened (or not) all the same
        fut.set_result(value)


def _fail(fut: asyncio.Future[TupleRow | None], error: StoreError) -> None:
    if not fut.done():
        fut.set_exception(error)
