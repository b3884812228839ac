"""Writes whose outcome is unknown, settled by reading back (Postgres).

When the connection dies while a write is at the server (a primary killed mid-COMMIT, a
failover), the client cannot tell whether it committed. For the writes of the hot path, a
step commit and a journaled call, the store finds out once the database answers again (the
same one restarted, or the promoted standby a multi-host URL finds), instead of reporting a
failure that may have landed:

- a step commit landed iff the run still has the commit's epoch and is at its step or past
  it (only the lease's holder moves a run on that epoch, one step at a time);
- a journaled call landed iff the journal holds its (thread_id, step, idx) (a call is
  journaled once per step and index: a row there from an earlier holder would have been
  replayed, not called).

The same for a run's start (it landed iff the run exists with its input), an interrupt's
answer (iff the interrupt is resolved with that value) and a batch of effects' done marks
(one statement: it landed iff none of its effects is still running on the epoch it was
marked with; then each mark was made iff its effect is done on that epoch). A done mark not
read back would leave its effect running until its lease ran out, and then performed again.

Landed: the write's answer is made from what was read. Not landed: the write is sent again
(it is fenced by the epoch, and the checkpoint's and journal's primary keys refuse a second
copy, so a write that turns out to have committed late cannot be applied twice). The store
unreachable for longer than SETTLE_FOR: the original error is raised, as before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

from psycopg.rows import TupleRow

from ..errors import StoreUnavailable
from .base import RUN_COLUMNS, Lease, NewRun, RunRecord, StepCommit
from .pg_conn import PgConnections

log = logging.getLogger("tether.store.postgres")

SETTLE_FOR: Final = 30.0
"""Seconds to keep asking an unreachable database whether a write landed."""

T = TypeVar("T")


async def settle(conns: PgConnections, write: Callable[[], Awaitable[T]],
                 landed: Callable[[], Awaitable[T | None]], what: str,
                 lost: StoreUnavailable | None = None) -> T:
    """write(); if its connection died (StoreUnavailable), landed() once the database
    answers: its answer if the write landed, else write() again. `lost`: the caller made the
    first write itself (the hot path: no wrapper around it) and it failed so."""
    if lost is None:
        try:
            return await write()
        except StoreUnavailable as exc:
            lost = exc
    give_up = time.monotonic() + SETTLE_FOR
    delay = 0.1
    while True:
        try:
            found = await landed()
        except StoreUnavailable:
            if time.monotonic() >= give_up:
                raise lost from None
            await asyncio.sleep(delay)
            delay = min(2 * delay, 1.0)
            continue
        if found is not None:
            log.info("%s: its connection was lost during the commit; read back: it landed",
                     what)
            return found
        log.info("%s: its connection was lost during the commit; read back: it did not land; "
                 "sending it again", what)
        try:
            return await write()
        except StoreUnavailable as exc:
            lost = exc
            if time.monotonic() >= give_up:
                raise
            await asyncio.sleep(delay)


async def step_landed(conns: PgConnections, commit: StepCommit) -> RunRecord | None:
    """The run as it is now if `commit` landed, else None."""
    row = await conns.read_one(conns.q["get_run"], {"thread_id": commit.lease.thread_id})
    if row is None:
        return None
    run = RunRecord(*row)
    return run if run.epoch == commit.lease.epoch and run.step >= commit.step else None


def run_row(run: RunRecord) -> tuple[object, ...]:
    """The run's row, in RUN_COLUMNS order."""
    return tuple(getattr(run, name) for name in RUN_COLUMNS)


async def call_landed(conns: PgConnections, thread_id: str, step: int, idx: int) -> bool:
    rows = await conns.read(conns.q["load_journal"], {"thread_id": thread_id, "step": step})
    return any(r[0] == idx for r in rows)


Write = Callable[[], Awaitable[TupleRow | None]]


async def settle_step(conns: PgConnections, write: Write, commit: StepCommit,
                      release: bool = False, lost: StoreUnavailable | None = None
                      ) -> TupleRow | None:
    """settle() a step commit: the row its statement returns (commit_step_wake's when
    `release`), made of the run as read back."""

    async def landed() -> TupleRow | None:
        run = await step_landed(conns, commit)
        if run is None:
            return None
        return (*run_row(run), 0) if release else (run.thread_id, run.updated_at)

    return await settle(conns, write, landed,
                        f"run {commit.lease.thread_id!r}: commit of step {commit.step}", lost)


async def settle_call(conns: PgConnections, write: Write, thread_id: str, step: int,
                      idx: int, lost: StoreUnavailable | None = None) -> TupleRow | None:
    """settle() a journaled call's write."""

    async def landed() -> TupleRow | None:
        return (1,) if await call_landed(conns, thread_id, step, idx) else None

    return await settle(conns, write, landed,
                        f"run {thread_id!r}: journaling call {idx} of step {step}", lost)


async def settle_create(conns: PgConnections, write: Write, new: NewRun) -> TupleRow | None:
    """settle() a create_run: it landed iff the run exists with this input (its row then
    reads as created, as create_run's does: (True, run columns...))."""

    async def landed() -> TupleRow | None:
        row = await conns.read_one(conns.q["get_run"], {"thread_id": new.thread_id})
        if row is None:
            return None
        run = RunRecord(*row)
        same = run.agent == new.agent and run.input_hash == new.input_hash
        return (True, *run_row(run)) if same else None

    return await settle(conns, write, landed, f"run {new.thread_id!r}: start")


async def settle_resume(conns: PgConnections, write: Write, thread_id: str, value: bytes,
                        interrupt_id: str | None) -> TupleRow | None:
    """settle() an interrupt's answer: it landed iff the interrupt is resolved with this
    value (resume_interrupt's row: the interrupt's columns, then a count)."""

    async def landed() -> TupleRow | None:
        rows = await conns.read(conns.q["list_interrupts"], {
            "thread_id": thread_id, "status": "resolved", "limit": 10_000})
        for r in reversed(rows):
            if (interrupt_id is None or r[3] == interrupt_id) and bytes(r[5] or b"") == value:
                return (*r, 0)
        return None

    return await settle(conns, write, landed, f"run {thread_id!r}: interrupt answer")


async def settle_park(conns: PgConnections, write: Write, lease: Lease) -> TupleRow | None:
    """settle() a park: it landed iff the run left `running` on the lease's epoch (only its
    holder moves it so; a claim or a cancel moves the epoch)."""

    async def landed() -> TupleRow | None:
        row = await conns.read_one(conns.q["get_run"], {"thread_id": lease.thread_id})
        run = None if row is None else RunRecord(*row)
        return (1,) if run is not None and run.epoch == lease.epoch and \
            run.status != "running" else None

    return await settle(conns, write, landed, f"run {lease.thread_id!r}: park")


async def settle_done_marks(conns: PgConnections, params: dict[str, Any]) -> list[bool]:
    """complete_effects (`params`: its arrays), settled: for each effect, whether it was
    marked done."""
    n = len(params["keys"])

    async def write() -> list[bool]:
        out = [False] * n
        for (i,) in await conns.fetchall(conns.q["complete_effects"], params):
            out[i - 1] = True
        return out

    async def landed() -> list[bool] | None:
        rows = await conns.read(conns.q["effect_marks"], {
            "thread_ids": params["thread_ids"], "keys": params["keys"]})
        out = [False] * n
        for i, status, epoch in rows:
            if epoch == params["epochs"][i - 1]:
                if status == "running":
                    return None  # the statement did not land: none of it did
                out[i - 1] = status == "done"
        return out

    what = (f"effect {params['thread_ids'][0]!r}/{params['keys'][0]!r}: done mark" if n == 1
            else f"done marks of {n} effects")
    return await settle(conns, write, landed, what)
