"""Postgres group commit: the writers behind commit_step, record_call and create_run.

Group commit: the writers' statements are fenced single statements. One that finds a writer
idle runs at once, in the caller's task (the sequential case pays nothing for batching).
Writes arriving while both are busy queue up; a writer's committer task sends each queue-full
as one transaction in one pipeline, one round trip and one WAL flush for the lot: BEGIN; lock_batch
(every run row involved, in thread_id order); all step commits as one multi-row statement, all
journal writes as another, the rest as executemany; COMMIT. Each write is fenced on its own
(a stale epoch matches no row; it does not raise), so a lost lease never affects its
batch-mates; if the transaction raises, its writes are retried one by one so only the culprit
fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from operator import itemgetter
from typing import Final

import orjson
import psycopg
from psycopg.rows import TupleRow

from ..errors import StoreError
from .pg_io import (
    _BEGIN,
    _MAX_BATCH,
    _TX_ATTEMPTS,
    Bulk,
    Conn,
    Params,
    PgIO,
    _is_disconnect,
    _Job,
    _retryable,
    _rollback,
    _Writer,
)

log = logging.getLogger("tether.store.postgres")


class PgCommitter(PgIO):
    """The writers: pooled connections, their statements group-committed by committer tasks
    (one per writer connection), so one group commit can be built and sent while another is
    at the server. Batches in flight together touch different runs: a run's writes are
    awaited one after another."""

    def _lost(self, writer: _Writer, exc: psycopg.Error) -> StoreError:
        """_error() for a writer: a lost connection is replaced before its next write (after
        some errors, e.g. an admin shutdown, it does not look closed yet)."""
        if _is_disconnect(exc):
            writer.lost = True
            writer.cursor = None
            self._heal()
        return self._error(exc)

    # -- the committers --------------------------------------------------------------------

    def _idle_writer(self) -> _Writer | None:
        for writer in self._writers:
            if not writer.busy:
                return writer
        return None

    async def _write(self, query: bytes, params: Params, thread_id: str) -> TupleRow | None:
        """Run one write statement on a writer; its first row (None: it returned none,
        e.g. a fenced write whose epoch moved)."""
        if not self._accepting:
            raise StoreError("store is not open")
        writer = None if self._queue else self._idle_writer()
        if writer is None:
            # The writers are taken: join the next group commit.
            fut: asyncio.Future[TupleRow | None] = asyncio.get_running_loop().create_future()
            self._queue.append((query, params, thread_id, fut))
            self._wake.set()
            return await fut
        # A writer is idle: run it here, with no hop through a committer task. If we are
        # cancelled meanwhile, psycopg cancels the statement: its outcome is unknown to us, as
        # for any cancelled write.
        writer.busy = True
        try:
            return await self._execute_one(writer, query, params)
        except psycopg.Error as exc:
            raise self._lost(writer, exc) from exc
        finally:
            writer.busy = False
            if self._queue or not self._accepting:
                self._wake.set()

    async def _commit_loop(self, writer: _Writer) -> None:
        queue, wake = self._queue, self._wake
        batch: list[_Job] = []
        try:
            while True:
                await wake.wait()
                while queue and not writer.busy:
                    batch = [queue.popleft() for _ in range(min(len(queue), _MAX_BATCH))]
                    writer.busy = True
                    try:
                        if len(batch) == 1:
                            await self._commit_one(writer, batch[0])
                        else:
                            await self._commit_batch(writer, batch)
                    except Exception as exc:  # a bug, not a database error: keep serving
                        log.exception("group commit of %d writes failed", len(batch))
                        for job in batch:
                            _fail(job[3], StoreError(f"group commit failed: {exc!r}"))
                    finally:
                        writer.busy = False
                    batch = []
                if not self._accepting and not queue:
                    return
                if not queue or writer.busy:  # (busy: a caller's write, which wakes us after)
                    wake.clear()
        finally:
            # Jobs are left only if we were cancelled (close timed out) or hit a bug: never
            # leave a caller waiting forever.
            for job in [*batch, *queue]:
                _fail(job[3], StoreError("store closed before the write was confirmed"))
            queue.clear()

    async def _new_cursor(self, writer: _Writer) -> psycopg.AsyncCursor[TupleRow]:
        pool = self._need_pool()
        conn, writer.conn, writer.cursor = writer.conn, None, None
        if conn is not None and (conn.closed or writer.lost):
            writer.lost = False
            with contextlib.suppress(psycopg.Error, OSError):
                await conn.close()
            await pool.putconn(conn)  # closed: the pool discards it and opens another
            conn = None
            await pool.check()  # see _fetchall
        if conn is None:
            conn = await pool.getconn()
        writer.conn = conn
        writer.cursor = cur = conn.cursor()
        return cur

    async def _execute_one(self, writer: _Writer, query: bytes, params: Params
                           ) -> TupleRow | None:
        """One statement on a writer's connection (autocommit); its first row. A deadlock
        victim wrote nothing, so it runs again (a few times)."""
        for attempt in range(1, _TX_ATTEMPTS + 1):
            try:
                cur = writer.cursor
                if cur is None or cur.closed or cur.connection.closed:
                    cur = await self._new_cursor(writer)
                await cur.execute(query, params)
                return await cur.fetchone()
            except psycopg.Error as exc:
                if not _retryable(exc) or attempt == _TX_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    async def _commit_one(self, writer: _Writer, job: _Job) -> None:
        query, params, _, fut = job
        try:
            row = await self._execute_one(writer, query, params)
        except psycopg.Error as exc:
            _fail(fut, self._lost(writer, exc))
        else:
            _done(fut, row)

    async def _commit_batch(self, writer: _Writer, batch: list[_Job]) -> None:
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
            if writer.cursor is None or writer.cursor.connection.closed:
                await self._new_cursor(writer)
            conn = writer.conn
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
                    _fail(job[3], self._lost(writer, exc))
                return
            stats["batch_retries"] += 1
            log.debug("group commit of %d writes failed (%s); retrying them one by one",
                      len(batch), self._message(exc))
            for job in batch:
                await self._commit_one(writer, job)
            return
        # Committed. (Anything raised from here fails the batch's callers; nothing retries.)
        for cur, members, bulk in plan:
            if bulk is not None:
                got = await cur.fetchall()
                if bulk.row_key is None:
                    done = {tuple(row) for row in got}
                    for i in members:
                        firsts[i] = _OK if bulk.key(batch[i][1]) in done else None
                else:
                    by_key = {bulk.row_key(row): row for row in got}
                    for i in members:
                        firsts[i] = by_key.get(bulk.key(batch[i][1]))
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
    ) -> list[tuple[psycopg.AsyncCursor[TupleRow], list[int], Bulk | None]]:
        """Send the batch's transaction in one pipeline; (cursor, its jobs, row key) per
        statement. Raises the first statement's error, if any."""
        plan: list[tuple[psycopg.AsyncCursor[TupleRow], list[int], Bulk | None]] = []
        failure: psycopg.Error | None = None
        try:
            async with conn.pipeline():
                try:
                    await conn.execute(_BEGIN)
                    ids = orjson.dumps(sorted({job[2] for job in batch})).decode()
                    await conn.execute(self._q["lock_batch"], {"ids": ids})
                    for query, members in groups.items():
                        cur = conn.cursor()
                        seq = [batch[i][1] for i in members]
                        bulk = self._bulk.get(query)
                        rows = (_json_rows(seq) if bulk is not None and len(seq) > 1
                                and bulk.fits(seq) else None)
                        if bulk is not None and rows is not None:
                            await cur.execute(bulk.query, {"rows": rows})
                            plan.append((cur, members, bulk))
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


_thread_of: Final[Callable[[_Job], str]] = itemgetter(2)  # a job's thread_id


_OK: Final[TupleRow] = (True,)  # the result a multi-row group commit gives a committed job


def _done(fut: asyncio.Future[TupleRow | None], value: TupleRow | None) -> None:
    if not fut.done():  # a cancelled caller: the write happened (or not) all the same
        fut.set_result(value)


def _fail(fut: asyncio.Future[TupleRow | None], error: StoreError) -> None:
    if not fut.done():
        fut.set_exception(error)
