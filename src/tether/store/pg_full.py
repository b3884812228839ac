"""Postgres group commit of FULL steps (FullCommitter): the steps that send or consume mail,
join groups, request effects or park for mail, given the connections part (pg_conn.py) and
owned by the store.

Each such step is a transaction that locks the run rows it touches (pg_steps.py). Alone, it
costs a WAL flush for one step, and its recipients' row locks are held across that flush, so
a thousand actors woken by mail, or the workers of a group all answering their admin, are
committed one flush at a time. Here steps arriving while FLUSHERS transactions are at the
server queue up and the next transaction takes them all: BEGIN; lock_runs_many (every row of
every step of the batch, in thread_id order, in one statement); for each step its
effect_keys_taken, commit_step_tx and wake_after_commit; COMMIT; one pipeline, one round
trip, one flush for the lot, and wake_after_commit_many once for all. Statements of one
transaction see each other, so a step of the
batch that parks for mail sees the mail another step of the batch sent it, whichever comes
first (the same as two transactions ordered by the row lock).

That is safe because a step that must not commit writes nothing (its statements check it on
the server) and the results say which error it gets (full_outcome): a lost lease never
affects its batch-mates. If the transaction fails (a deadlock with another writer, an error
in a statement), its steps are committed one by one, so only the culprit fails; if its
connection is lost, each step gets StoreUnavailable and its caller reads back whether it
landed (pg_settle.py). Steps that run a transactional effect, or message a group (whose
members are read first), always take their own transaction.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Final

import psycopg
from psycopg.rows import TupleRow

from ..errors import StoreUnavailable
from .base import StepCommit
from .pg_conn import BEGIN, MAX_BATCH, Params, PgConnections, rollback
from .pg_steps import full_outcome, full_params, sent_mail, step_transaction
from .plan import StepWakes

log = logging.getLogger("tether.store.postgres")

FLUSHERS: Final = 2  # FULL-step transactions at the server at once (one is built meanwhile)
_Job = tuple[StepCommit, StepWakes, "asyncio.Future[None]"]


def batchable(commit: StepCommit, wakes: StepWakes) -> bool:
    """Whether a FULL step may share its transaction: no transactional effect to run in it,
    no group message (its members are read in the transaction first)."""
    return not wakes.groups and all(e.apply is None for e in commit.effects)


class FullCommitter:
    """commit(): one FULL step committed, alone or with others (see the module's text).
    Raises what the step's own transaction would: LeaseLost, DuplicateEffectKey,
    RunNotFound, StoreUnavailable (outcome unknown), StoreError."""

    def __init__(self, conns: PgConnections) -> None:
        self._conns = conns
        self._queue: deque[_Job] = deque()
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.batches = 0
        """Transactions that committed more than one step (for tests and benches)."""

    async def commit(self, commit: StepCommit, wakes: StepWakes) -> None:
        if not batchable(commit, wakes):
            await self.alone(commit, wakes)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((commit, wakes, fut))
        self._kick()
        await fut

    async def alone(self, commit: StepCommit, wakes: StepWakes) -> None:
        body, commits = step_transaction(self._conns.q, commit, wakes)
        await self._conns.transaction(body, body_commits=commits)

    def _kick(self) -> None:
        queue = self._queue
        while queue and self._in_flight < FLUSHERS:
            batch = [queue.popleft() for _ in range(min(len(queue), MAX_BATCH))]
            self._in_flight += 1
            task = asyncio.create_task(self._flush(batch), name="tether-pg-full-commit")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _flush(self, batch: list[_Job]) -> None:
        try:
            if len(batch) == 1:
                await self._one(batch[0])
            else:
                await self._batch(batch)
        except Exception as exc:  # a bug, not a database error: each step gets it
            log.exception("group commit of %d steps failed", len(batch))
            for job in batch:
                _fail(job[2], exc)
        finally:
            self._in_flight -= 1
            self._kick()

    async def _one(self, job: _Job) -> None:
        commit, wakes, fut = job
        try:
            await self.alone(commit, wakes)
        except Exception as exc:
            _fail(fut, exc)
        else:
            _done(fut)

    async def _batch(self, batch: list[_Job]) -> None:
        conns = self._conns
        try:
            outcomes = await self._transaction(batch)
        except psycopg.Error as exc:
            err = conns.error(exc)
            if isinstance(err, StoreUnavailable):  # committed or not: each caller reads back
                conns.heal()
                for job in batch:
                    _fail(job[2], err)
                return
            log.debug("group commit of %d steps rolled back (%s); one by one", len(batch),
                      conns.message(exc))
            await asyncio.gather(*(self._one(job) for job in batch))
            return
        self.batches += 1
        for (commit, wakes, fut), (locked, taken, committed) in zip(batch, outcomes,
                                                                    strict=True):
            try:
                full_outcome(commit, wakes, locked, taken, committed)
            except Exception as exc:
                _fail(fut, exc)
            else:
                _done(fut)

    async def _transaction(self, batch: list[_Job]
                           ) -> list[tuple[dict[str, TupleRow], list[TupleRow], bool]]:
        """The batch's transaction; for each step, what full_outcome needs."""
        q = self._conns.q
        plans: list[tuple[Params, Params]] = []
        ids: set[str] = set()
        terminal: list[str] = []
        for commit, wakes, _ in batch:
            params = full_params(commit, wakes)
            wake = sent_mail(commit, wakes, params, {})
            plans.append((params, wake))
            ids.add(commit.lease.thread_id)
            ids.update(wake["recipients"])
            if wakes.terminal:
                terminal.append(commit.lease.thread_id)
        async with self._conns.pool().connection() as conn:
            try:
                async with conn.pipeline():
                    await conn.execute(BEGIN)
                    c_lock = await conn.execute(q["lock_runs_many"], {
                        "ids": sorted(ids), "terminal": terminal})
                    cursors = []
                    for (commit, _, _), (params, _) in zip(batch, plans, strict=True):
                        c_taken = (await conn.execute(q["effect_keys_taken"], {
                            "thread_id": commit.lease.thread_id, "keys": params["e_keys"]})
                            if commit.effects else None)
                        c_step = await conn.execute(q["commit_step_tx"], params)
                        cursors.append((c_taken, c_step))
                    await conn.execute(q["wake_after_commit_many"], _wakes(plans))
                    await conn.execute(b"COMMIT")
            except BaseException:
                await rollback(conn)
                raise
            locked = {r[0]: r for r in await c_lock.fetchall()}
            return [(locked, await c_taken.fetchall() if c_taken is not None else [],
                     c_step.rowcount >= 1) for c_taken, c_step in cursors]

    async def close(self) -> None:
        """Wait for the transactions in flight (their callers are told)."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))


def _wakes(plans: list[tuple[Params, Params]]) -> Params:
    """wake_after_commit_many's parameters from each step's wake_after_commit's."""
    wakes = [wake for _, wake in plans]
    out: Params = {name: [w[key] for w in wakes] for name, key in (
        ("thread_ids", "thread_id"), ("epochs", "epoch"), ("steps", "step"),
        ("parent", "parent"), ("mail", "mail"), ("notify", "notify"), ("effects", "effects"))}
    out["senders"] = [w["thread_id"] for w in wakes for _ in w["recipients"]]
    out["recipients"] = [r for w in wakes for r in w["recipients"]]
    return out


def _done(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _fail(fut: asyncio.Future[None], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
