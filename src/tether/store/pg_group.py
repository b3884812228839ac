"""The group commit the Postgres batchers share (pg_full.py: FULL steps; pg_send.py:
`runtime.send`): a caller queues a job and awaits its future; while fewer than `flushers`
of their transactions are at the server, the queue's head is taken as a batch (`_take`) and
sent: a batch of one alone (`_alone_job`), more in one transaction (`_together`). A batch
whose transaction fails is sent again job by job, so only the culprit fails; if its
connection is lost, each caller gets StoreUnavailable and reads back what landed."""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import psycopg

from ..errors import StoreUnavailable
from .pg_conn import MAX_BATCH, PgConnections, rollback

log = logging.getLogger("tether.store.postgres")

J = TypeVar("J")
T = TypeVar("T")


class GroupCommit(ABC, Generic[J]):
    """Jobs of one kind (`what`, for the log) group-committed on `conns`."""

    def __init__(self, conns: PgConnections, flushers: int, what: str, task_name: str) -> None:
        self._conns = conns
        self._flushers = flushers
        self._what = what
        self._task_name = task_name
        self._queue: deque[J] = deque()
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.transactions = 0
        """Transactions sent, alone or together (for tests and benches)."""

    @abstractmethod
    def _future(self, job: J) -> asyncio.Future[Any]:
        """The future the job's caller awaits."""

    @abstractmethod
    async def _alone_job(self, job: J) -> Any:
        """The job in a transaction of its own; its caller's result."""

    @abstractmethod
    async def _together(self, batch: list[J]) -> None:
        """The batch in one transaction, each job's future settled; a psycopg.Error when
        the transaction failed (nothing settled then)."""

    def _submit(self, job: J) -> None:
        self._queue.append(job)
        self._kick()

    def _take(self) -> list[J]:
        """The next batch off the queue (which is not empty)."""
        return [self._queue.popleft() for _ in range(min(len(self._queue), MAX_BATCH))]

    def _kick(self) -> None:
        while self._queue and self._in_flight < self._flushers:
            batch = self._take()
            self._in_flight += 1
            task = asyncio.create_task(self._flush(batch), name=self._task_name)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _flush(self, batch: list[J]) -> None:
        try:
            if len(batch) == 1:
                await self._one(batch[0])
            else:
                await self._batch(batch)
        except Exception as exc:  # a bug, not a database error: each caller gets it
            log.exception("group commit of %d %s failed", len(batch), self._what)
            for job in batch:
                fail(self._future(job), exc)
        finally:
            self._in_flight -= 1
            self._kick()

    async def _one(self, job: J) -> None:
        fut = self._future(job)
        try:
            result = await self._alone_job(job)
        except Exception as exc:
            fail(fut, exc)
        else:
            if not fut.done():
                fut.set_result(result)

    async def _batch(self, batch: list[J]) -> None:
        conns = self._conns
        self.transactions += 1
        try:
            await self._together(batch)
        except psycopg.Error as exc:
            err = conns.error(exc)
            if isinstance(err, StoreUnavailable):  # committed or not: each caller reads back
                conns.heal()
                for job in batch:
                    fail(self._future(job), err)
                return
            log.debug("group commit of %d %s rolled back (%s); one by one", len(batch),
                      self._what, conns.message(exc))
            await asyncio.gather(*(self._one(job) for job in batch))

    async def close(self) -> None:
        """Wait for the transactions in flight (their callers are told)."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))


def fail(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


async def pipelined(conn: psycopg.AsyncConnection[Any],
                    statements: Callable[[], Awaitable[T]]) -> T:
    """What `statements` returns, sent in one pipeline on `conn`; the first error raised as
    itself (the pipeline's exit only says "pipeline aborted"), the transaction rolled back
    on any."""
    failure: psycopg.Error | None = None
    try:
        try:
            async with conn.pipeline():
                try:
                    result = await statements()
                except psycopg.Error as exc:  # caught in here, or psycopg logs it
                    failure = exc
        except psycopg.Error:
            if failure is None:
                raise
        if failure is not None:
            raise failure
    except BaseException:
        await rollback(conn)
        raise
    return result
