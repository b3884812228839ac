"""Postgres group commit of FULL steps (FullCommitter): the steps that send or consume mail,
join groups, request effects or park for mail, given the connections part (pg_conn.py) and
owned by the store.

Each such step is a transaction that locks the run rows it touches (pg_steps.py). Alone, it
costs a WAL flush for one step, and its recipients' row locks are held across that flush, so
a thousand actors woken by mail, or the workers of a group all answering their admin, were
committed one flush at a time (about 300 steps a second, with one process or two). Here steps
arriving while FLUSHERS transactions are at the server queue up and the next transaction
takes them all, in five statements whatever their number: BEGIN; lock_runs_many (every row
of every step, in thread_id order); effect_keys_taken_many (only if some request effects);
commit_steps_tx (every step, each fenced on its own, with what it carries); then
wake_after_commit_many (whom they wake, once for all); COMMIT: one pipeline, one round trip,
one flush for the lot. The wake-ups are read after every step of the batch is written, so a
run of the batch that parks for mail is woken by mail a batch-mate sent it, whichever came
first (as two transactions ordered by the row lock would).

That is safe because a step that must not commit writes nothing (its fence is checked on the
server, per step) and the results say which error it gets (full_outcome): a lost lease, an
unknown recipient or an effect key used before never affects its batch-mates. If the
transaction fails (a deadlock with another writer, an error in a statement), its steps are
committed one by one, so only the culprit fails; if its connection is lost, each step gets
StoreUnavailable and its caller reads back whether it landed (pg_settle.py). Steps that run
a transactional effect, message a group (whose members are read in the transaction first)
or write more than _ALONE_ABOVE rows (children, mail, effects) take their own transaction:
a big one shared would hold up the commit of its batch-mates.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Final

import orjson
from psycopg import AsyncCursor
from psycopg.rows import TupleRow

from .base import StepCommit
from .pg_conn import BEGIN, MAX_BATCH, Params, PgConnections
from .pg_group import GroupCommit, fail, pipelined
from .pg_steps import full_outcome, full_params, sent_mail, step_transaction
from .plan import StepWakes

_ALONE_ABOVE: Final = 50  # rows a step writes above which it commits alone
_BATCH_ROWS: Final = 2000  # rows a shared transaction writes at most (it takes steps until)
FLUSHERS: Final = 2  # FULL-step transactions at the server at once (one is built meanwhile)
_Job = tuple[StepCommit, StepWakes, "asyncio.Future[None]"]
Cursor = AsyncCursor[TupleRow]


def _size(commit: StepCommit) -> int:
    """The rows a step writes, roughly: its own, its children, its mail and its effects."""
    return 1 + len(commit.children) + len(commit.messages) + len(commit.effects)


def batchable(commit: StepCommit, wakes: StepWakes) -> bool:
    """Whether a FULL step may share its transaction: no transactional effect to run in it,
    no group message (its members are read in the transaction first), and small (a step
    that spawns or mails hundreds is a batch of its own; shared, it would hold up the
    commit of its batch-mates, e.g. the group memberships others are about to publish to)."""
    return (not wakes.groups and _size(commit) <= _ALONE_ABOVE
            and all(e.apply is None for e in commit.effects))


class FullCommitter(GroupCommit[_Job]):
    """commit(): one FULL step committed, alone or with others (see the module's text).
    Raises what the step's own transaction would: LeaseLost, DuplicateEffectKey,
    RunNotFound, StoreUnavailable (outcome unknown), StoreError."""

    def __init__(self, conns: PgConnections) -> None:
        super().__init__(conns, FLUSHERS, "steps", "tether-pg-full-commit")
        self.batches = 0
        """Transactions that committed more than one step (for tests and benches)."""

    async def commit(self, commit: StepCommit, wakes: StepWakes) -> None:
        if not batchable(commit, wakes):
            await self.alone(commit, wakes)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._submit((commit, wakes, fut))
        await fut

    async def alone(self, commit: StepCommit, wakes: StepWakes) -> None:
        self.transactions += 1
        body, commits = step_transaction(self._conns.q, commit, wakes)
        await self._conns.transaction(body, body_commits=commits)

    def _take(self) -> list[_Job]:
        queue = self._queue
        batch = [queue.popleft()]
        rows = _size(batch[0][0])
        while queue and len(batch) < MAX_BATCH and rows + _size(queue[0][0]) <= _BATCH_ROWS:
            rows += _size(queue[0][0])
            batch.append(queue.popleft())
        return batch

    def _future(self, job: _Job) -> asyncio.Future[None]:
        return job[2]

    async def _alone_job(self, job: _Job) -> None:
        await self.alone(job[0], job[1])

    async def _together(self, batch: list[_Job]) -> None:
        outcomes = await self._transaction(batch)
        self.batches += 1
        for (commit, wakes, fut), (locked, taken, committed) in zip(batch, outcomes,
                                                                    strict=True):
            try:
                full_outcome(commit, wakes, locked, taken, committed)
            except Exception as exc:
                fail(fut, exc)
            else:
                if not fut.done():
                    fut.set_result(None)

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
        many = _many([params for params, _ in plans])
        async with self._conns.pool().connection() as conn:
            async def statements() -> tuple[Cursor, Cursor | None, Cursor]:
                await conn.execute(BEGIN)
                c_lock = await conn.execute(q["lock_runs_many"], {
                    "ids": json_param(sorted(ids)), "terminal": json_param(terminal)})
                c_taken = (await conn.execute(q["effect_keys_taken_many"], {
                    "effects": many["effects"]})
                    if any(c.effects for c, _, _ in batch) else None)
                c_steps = await conn.execute(q["commit_steps_tx"], many)
                await conn.execute(q["wake_after_commit_many"], _wakes(plans))
                await conn.execute(b"COMMIT")
                return c_lock, c_taken, c_steps

            c_lock, c_taken, c_steps = await pipelined(conn, statements)
            locked = {r[0]: r for r in await c_lock.fetchall()}
            taken: dict[str, list[TupleRow]] = {}
            for row in await c_taken.fetchall() if c_taken is not None else []:
                taken.setdefault(row[0], []).append((row[1],))
            done = {r[0] for r in await c_steps.fetchall()}
        return [(locked, taken.get(tid, []), tid in done)
                for tid in (commit.lease.thread_id for commit, _, _ in batch)]


_STEP_FIELDS: Final = ("thread_id", "epoch", "step", "node", "next_node", "kind", "data",
                        "worker", "attempt", "started_at", "finished_at", "status", "wake_at",
                        "waiting_for", "ttl")
_CHILD_FIELDS: Final = ("thread_id", "agent", "version", "node", "input", "input_hash",
                        "idempotency_key", "parent_thread_id", "forked_from", "forked_step")
# commit_steps_tx's other parameters: (its name, its rows' fields and commit_step_tx's
# arrays each is taken from)
_CARRIED: Final = (
    ("children", tuple((f, "c_" + f) for f in _CHILD_FIELDS)),
    ("groups", (("group_name", "g_names"), ("role", "g_roles"))),
    ("consumed", (("id", "consumed"),)),
    ("mail", (("recipient", "m_recipients"), ("message", "m_messages"))),
    ("effects", (("key", "e_keys"), ("idx", "e_idxs"), ("name", "e_names"),
                 ("payload", "e_payloads"), ("compensable", "e_compensables"))),
    ("direct", (("recipient", "direct"),)),
)


def json_param(rows: object) -> str:
    """One JSON parameter (orjson: one C call, where psycopg would dump an array per column
    element by element), bytes as base64 (the statements decode them)."""
    return orjson.dumps(rows, default=_base64).decode()


def _base64(value: object) -> str:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _many(steps: list[Params]) -> dict[str, str]:
    """commit_steps_tx's parameters from each step's commit_step_tx's: the steps' rows, and
    what they carry, each row with its owner's thread_id."""
    out = {"steps": json_param([{f: p[f] for f in _STEP_FIELDS} for p in steps])}
    for name, fields in _CARRIED:
        rows: list[dict[str, object]] = []
        for p in steps:
            owner = p["thread_id"]
            columns = [p[key] for _, key in fields]
            rows.extend({"owner": owner, **{f: v for (f, _), v in zip(fields, values, strict=True)}}
                        for values in zip(*columns, strict=True))
        out[name] = json_param(rows)
    return out


def _wakes(plans: list[tuple[Params, Params]]) -> dict[str, str]:
    """wake_after_commit_many's parameters from each step's wake_after_commit's."""
    wakes = [wake for _, wake in plans]
    return {"steps": json_param([{f: w[f] for f in ("thread_id", "epoch", "step", "parent", "mail",
                                                "notify", "effects")} for w in wakes]),
            "mail": json_param([{"sender": w["thread_id"], "recipient": r}
                           for w in wakes for r in w["recipients"]])}

