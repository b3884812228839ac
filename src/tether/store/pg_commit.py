"""Postgres group commit (GroupCommitter): the writers behind PostgresStore's one-statement
writes (commit_step, record_call, create_run, park_run, resume_interrupt), given the
connections part (pg_conn.py) and owned by the store; and DoneMarks, the effects' done marks
coalesced into one statement the same way.

Group commit: the writers' statements are fenced single statements. One that finds a writer
idle runs at once, in the caller's task (the sequential case pays nothing for batching).
Writes arriving while both are busy queue up; a writer's committer task sends each queue-full
as one transaction in one pipeline, one round trip and one WAL flush for the lot: BEGIN;
lock_batch (every run row involved, in thread_id order); all step commits as one multi-row
statement, all journal writes as another (and so on for starts, parks and interrupt answers),
the rest as executemany; COMMIT. Each write is fenced on its own (a stale epoch matches no
row; it does not raise), so a lost lease never affects its batch-mates; if the transaction
raises, its writes are retried one by one so only the culprit fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from operator import itemgetter
from typing import Any, Final, NamedTuple

import orjson
import psycopg
from psycopg.rows import TupleRow

from ..errors import StoreError
from .base import CommitObserver, EffectRecord
from .pg_conn import (
    BEGIN,
    MAX_BATCH,
    TX_ATTEMPTS,
    Conn,
    Params,
    PgConnections,
    is_disconnect,
    retryable,
    rollback,
)

log = logging.getLogger("tether.store.postgres")

SPLIT_MIN: Final = 100
"""A committer that finds at least twice this many writes queued while another writer is idle
takes half of them and leaves that writer the rest: a burst's two group commits run at once,
on two of the server's cores, where one writer would take it all to one."""
WRITERS: Final = 2  # writer connections: a group commit is sent while another is at the server
# (query, params, thread_id, future of the statement's first row: None = the fence failed)
_Job = tuple[bytes, Params, str, "asyncio.Future[TupleRow | None]"]


class _Writer:
    """One writer connection of the group commit and its state."""

    __slots__ = ("busy", "conn", "cursor", "lost")

    def __init__(self) -> None:
        self.conn: Conn | None = None
        self.cursor: psycopg.AsyncCursor[TupleRow] | None = None
        self.lost = False  # its connection failed: replace it before the next write
        self.busy = False  # a write or a group commit is on it


class GroupCommitter:
    """The writers: pooled connections, their statements group-committed by committer tasks
    (one per writer connection), so one group commit can be built and sent while another is
    at the server. Batches in flight together touch different runs: a run's writes are
    awaited one after another.

    Interface: start() once the pool is open; write() from any task; close() before the
    pool closes (the writers' connections go back to it)."""

    def __init__(self, conns: PgConnections) -> None:
        self._conns = conns
        self._q = q = conns.q
        # query -> its multi-row form: the statement, the key of a job's params, whether a
        # group fits it, and the key of a row it returns (None: rows are keys; each job whose
        # key came back gets _OK) or, given, each job gets the row with its key.
        self._bulk: dict[bytes, Bulk] = {
            q["commit_step"]: Bulk(q["commit_steps"], _thread_key, _distinct_runs,
                                   itemgetter(0)),  # commit_step's row: (thread_id, updated_at)
            q["insert_journal"]: Bulk(q["insert_journals"], _journal_key, _always),
            q["create_run"]: Bulk(q["create_runs"], _thread_key, _fresh_runs,
                                  itemgetter(1)),  # create_run's row: (created, thread_id, ...)
            q["create_run_audited"]: Bulk(q["create_runs_audited"], _thread_key, _fresh_runs,
                                          itemgetter(1)),  # (the same row)
            q["resume_interrupt"]: Bulk(q["resume_interrupts"], _thread_key, _distinct_runs,
                                        itemgetter(0)),  # the interrupt's row: (thread_id, ...)
            q["resume_interrupt_audited"]: Bulk(q["resume_interrupts_audited"], _thread_key,
                                                _distinct_runs, itemgetter(0)),  # (the same)
            q["park_run"]: Bulk(q["park_runs"], _thread_key, _parks_alone,
                                itemgetter(0)),  # park_runs' row: (thread_id)
        }
        self._accepting = False  # writes are taken (the committers run)
        # Keep one connection of the pool for everything else.
        self.writers = [_Writer() for _ in range(min(WRITERS, conns.max_size - 1))]
        self._queue: deque[_Job] = deque()
        self._wake = asyncio.Event()
        self._committers: list[asyncio.Task[None]] = []
        self.observer: CommitObserver | None = None
        """Told of each group commit (its writes, sent to committed), when set."""

    def start(self) -> None:
        self._accepting = True
        self._wake.clear()
        for i, writer in enumerate(self.writers):
            writer.lost = False
            self._committers.append(asyncio.create_task(
                self._commit_loop(writer), name=f"tether-pg-committer-{i}"))

    async def close(self) -> None:
        """Finish what was submitted (or fail it, after the pool timeout), then give the
        writers' connections back to the pool."""
        committers, self._committers = self._committers, []
        self._accepting = False
        if committers:
            self._wake.set()  # the committers finish what was submitted, then stop
            _, pending = await asyncio.wait(committers, timeout=self._conns.pool_timeout)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        if not self._conns.is_open:
            return
        pool = self._conns.pool()
        for writer in self.writers:
            commit_conn, writer.conn, writer.cursor = writer.conn, None, None
            if commit_conn is not None:
                with contextlib.suppress(psycopg.Error, OSError):
                    await pool.putconn(commit_conn)

    def _lost(self, writer: _Writer, exc: psycopg.Error) -> StoreError:
        """error() for a writer: a lost connection is replaced before its next write (after
        some errors, e.g. an admin shutdown, it does not look closed yet)."""
        if is_disconnect(exc):
            writer.lost = True
            writer.cursor = None
            self._conns.reconnects.lost("committer")
            self._conns.heal()
        return self._conns.error(exc)

    # -- the committers --------------------------------------------------------------------

    def _idle_writer(self) -> _Writer | None:
        for writer in self.writers:
            if not writer.busy:
                return writer
        return None

    async def write(self, query: bytes, params: Params, thread_id: str) -> TupleRow | None:
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
        observer = self.observer
        t0 = time.perf_counter() if observer is not None else 0.0
        try:
            row = await self._execute_one(writer, query, params)
        except psycopg.Error as exc:
            raise self._lost(writer, exc) from exc
        finally:
            writer.busy = False
            if self._queue or not self._accepting:
                self._wake.set()
        if observer is not None:
            observer.committed(1, time.perf_counter() - t0)
        return row

    async def _commit_loop(self, writer: _Writer) -> None:
        queue, wake = self._queue, self._wake
        batch: list[_Job] = []
        try:
            while True:
                await wake.wait()
                while queue and not writer.busy:
                    n = min(len(queue), MAX_BATCH)
                    if n >= 2 * SPLIT_MIN and any(not w.busy for w in self.writers
                                                  if w is not writer):
                        n //= 2  # the other half: to the idle writer, at once
                    batch = [queue.popleft() for _ in range(n)]
                    writer.busy = True
                    observer = self.observer
                    t0 = time.perf_counter() if observer is not None else 0.0
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
                        if observer is not None:
                            observer.committed(len(batch), time.perf_counter() - t0)
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
        pool = self._conns.pool()
        conn, writer.conn, writer.cursor = writer.conn, None, None
        if conn is not None and (conn.closed or writer.lost):
            writer.lost = False
            with contextlib.suppress(psycopg.Error, OSError):
                await conn.close()
            await pool.putconn(conn)  # closed: the pool discards it and opens another
            conn = None
            await pool.check()  # see PgConnections.fetchall
        if conn is None:
            conn = await pool.getconn()
            self._conns.reconnects.back("committer", conn)
        writer.conn = conn
        writer.cursor = cur = conn.cursor()
        return cur

    async def _execute_one(self, writer: _Writer, query: bytes, params: Params
                           ) -> TupleRow | None:
        """One statement on a writer's connection (autocommit); its first row. A deadlock
        victim wrote nothing, so it runs again (a few times)."""
        for attempt in range(1, TX_ATTEMPTS + 1):
            try:
                cur = writer.cursor
                if cur is None or cur.closed or cur.connection.closed:
                    cur = await self._new_cursor(writer)
                await cur.execute(query, params)
                return await cur.fetchone()
            except psycopg.Error as exc:
                if not retryable(exc) or attempt == TX_ATTEMPTS:
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
        firsts: list[TupleRow | None] = [None] * len(batch)
        try:
            if writer.cursor is None or writer.cursor.connection.closed:
                await self._new_cursor(writer)
            conn = writer.conn
            assert conn is not None
            try:
                plan = await self._send_batch(conn, batch, groups)
            except BaseException:
                await rollback(conn)
                raise
        except psycopg.Error as exc:
            if is_disconnect(exc):
                # The outcome is unknown: re-running could commit twice. Report it to all.
                for job in batch:
                    _fail(job[3], self._lost(writer, exc))
                return
            log.debug("group commit of %d writes failed (%s); retrying them one by one",
                      len(batch), self._conns.message(exc))
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
                    await conn.execute(BEGIN)
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


# A job's key and its row's key (C getters: they run once per write of every group commit).
_Key = Callable[[Params], Any]
_thread_key: Final[_Key] = itemgetter("thread_id")
_journal_key: Final[_Key] = itemgetter("thread_id", "step", "idx")  # = insert_journals' row


def _distinct_runs(seq: list[Params]) -> bool:
    """commit_steps moves each run once: two commits of one run go one by one instead."""
    return len({p["thread_id"] for p in seq}) == len(seq)


def _always(seq: list[Params]) -> bool:
    return True


def _fresh_runs(seq: list[Params]) -> bool:
    """create_runs takes runs without idempotency key (queued, or leased to a local worker),
    once each."""
    return all(p["idempotency_key"] is None for p in seq) and _distinct_runs(seq)


def _parks_alone(seq: list[Params]) -> bool:
    """park_runs takes parks that spawn no children, once per run."""
    return not any(p["c_thread_id"] for p in seq) and _distinct_runs(seq)


class Bulk(NamedTuple):
    query: bytes
    key: _Key
    fits: Callable[[list[Params]], bool]
    row_key: Callable[[TupleRow], Any] | None = None


_Mark = tuple[EffectRecord, bytes, "asyncio.Future[bool]"]
_MarkBatch = Callable[[Sequence[tuple[EffectRecord, bytes]]], Awaitable[list[bool]]]


class DoneMarks:
    """Done marks (complete_effect) coalesced: the marks of one event-loop iteration, or made
    while a batch of them is written, go together in the next call of `write_batch`
    (complete_effects: one statement for up to `batch` marks). Each caller gets its own
    row's answer, or the error of its batch."""

    def __init__(self, write_batch: _MarkBatch, batch: int) -> None:
        self._write_batch = write_batch
        self._batch = batch
        self._queue: deque[_Mark] = deque()
        self._flusher: asyncio.Task[None] | None = None

    async def mark(self, effect: EffectRecord, result: bytes) -> bool:
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._queue.append((effect, result, fut))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name="tether-pg-effects-done")
        return await fut

    async def _flush(self) -> None:
        queue = self._queue
        batch: list[_Mark] = []
        try:
            while queue:
                batch = [queue.popleft() for _ in range(min(len(queue), self._batch))]
                try:
                    done = await self._write_batch([(e, r) for e, r, _ in batch])
                except Exception as exc:
                    for _, _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                for (_, _, fut), ok in zip(batch, done, strict=True):
                    if not fut.done():
                        fut.set_result(ok)
            batch = []
        finally:  # cancelled: nobody is left waiting for an answer
            for _, _, fut in [*batch, *queue]:
                if not fut.done():
                    fut.set_exception(StoreError("the store stopped before the done mark"))
            queue.clear()
