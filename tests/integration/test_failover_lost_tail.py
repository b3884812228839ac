"""What a failover to an asynchronous standby loses, on one database (issue 34): the tail the
standby had not received. A worker committed step 3 of a run, the commit was acknowledged,
and the new primary never saw it: the run there is at step 2, still leased to the worker on
the same epoch, while the worker goes on with step 4 from memory.

The step commit of step 4 is fenced by the step (the run must be at step 3): refused. A
journaled call and a park of step 4 are fenced by the step too: refused, so the worker
abandons the run and whoever claims it once its lease runs out runs steps 3 and 4 again.
Fenced by the epoch only, they landed: a park of step 4 left the run waiting at step 2 with
its interrupt at step 4; answered, the run re-ran steps 3 and 4, and at step 4 parked again
on the same interrupt, already resolved, so it waited for an answer nobody could give (the
asynchronous failover test's run that never finished). A journaled call of step 4 left a
row that the re-run of step 4 then collided with (duplicate key, an ERROR with a traceback,
the run released and claimed once more).

The lost tail is made here by hand: inside step 4, before its interrupt or its call, the
node deletes step 3's checkpoint and journal and moves the run back to step 2, as the new
primary would have it.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from typing import Any

import psycopg
import pytest

from apps import inprocess
from apps.store_rows import leased, step_commit
from tether import Agent, Command, Context, RunStatus, finish, goto
from tether.errors import LeaseLost
from tether.store.base import Park
from tether.store.postgres import PostgresStore

pytestmark = pytest.mark.postgres

STEPS, AT = 5, 4  # the step the worker runs from memory after step 3's commit was lost
TTL = 1.0
WAIT = 20.0

CALLS: Counter[tuple[str, int]] = Counter()


def paid(thread_id: str, step: int) -> str:
    """A journaled call; counted each time it is made."""
    CALLS[thread_id, step] += 1
    return f"{thread_id}/{step}/{CALLS[thread_id, step]}"


async def lose_last_step(url: str, thread_id: str, step: int) -> None:
    """The database as a standby that never received `step`'s commit (nor its call)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn, \
            conn.transaction():
        await conn.execute("DELETE FROM checkpoints WHERE thread_id = %s AND step = %s",
                           (thread_id, step))
        await conn.execute("DELETE FROM journal WHERE thread_id = %s AND step = %s",
                           (thread_id, step))
        await conn.execute("UPDATE runs SET step = %s WHERE thread_id = %s AND step = %s",
                           (step - 1, thread_id, step))


def tail_agent(name: str, url: str, *, ask: bool) -> tuple[Agent, set[str]]:
    """An agent of STEPS steps, one journaled call each; at step AT, the first time, the
    previous step's commit is lost; then (`ask`) an interrupt before the call."""
    agent, lost = Agent(name), set()

    @agent.node(start=True)
    async def work(state: dict[str, Any], ctx: Context) -> Command:
        if ctx.step == AT and ctx.thread_id not in lost:
            lost.add(ctx.thread_id)
            await lose_last_step(url, ctx.thread_id, AT - 1)
        update: dict[str, Any] = {"done": [*state.get("done", []), ctx.step]}
        if ask and ctx.step == AT:
            update["answer"] = ctx.interrupt({"step": ctx.step})
        update["results"] = [*state.get("results", []),
                             await ctx.call(paid, ctx.thread_id, ctx.step)]
        if ctx.step >= STEPS:
            return finish(update)
        return goto("work", update)

    return agent, lost


async def _answer_until_done(rt: Any, thread_id: str) -> bool:
    for it in await rt.interrupts(thread_id=thread_id):
        await rt.resume(thread_id, "yes", interrupt_id=it.id)
    run = await rt.store.get_run(thread_id)
    return run is not None and run.status == "completed"


async def test_a_park_after_a_lost_commit_is_refused_and_the_run_completes(
        pg_url: str) -> None:
    agent, lost = tail_agent("lost_tail_park", pg_url, ask=True)
    rt = inprocess.make_runtime(pg_url, agent, lease_ttl=TTL, poll_interval=0.05)
    thread_id = f"t-{uuid.uuid4().hex[:10]}"
    async with inprocess.working(rt, concurrency=4):
        await rt.start(agent, {}, thread_id=thread_id)
        try:
            await inprocess.eventually(lambda: _answer_until_done(rt, thread_id),
                                       timeout=WAIT, what="the run completed")
        except AssertionError:
            run = await rt.store.get_run(thread_id)
            interrupts = await rt.store.list_interrupts(thread_id=thread_id, status=None)
            raise AssertionError(f"not completed: {run}; interrupts {interrupts}") from None
        run = await rt.get(thread_id)
        checkpoints = [cp.step for cp in await rt.checkpoints(thread_id)]
    assert lost == {thread_id}
    assert run.status == RunStatus.COMPLETED, run.error
    assert checkpoints == list(range(1, STEPS + 1))
    assert run.state["done"] == list(range(1, STEPS + 1))
    assert run.state["answer"] == "yes"
    # Step 3 ran again (its call was in the lost tail); every other call was made once.
    assert CALLS[thread_id, AT - 1] == 2
    assert all(CALLS[thread_id, s] == 1 for s in range(1, STEPS + 1) if s != AT - 1), CALLS


async def test_a_call_after_a_lost_commit_is_not_journaled(
        pg_url: str, caplog: pytest.LogCaptureFixture) -> None:
    agent, lost = tail_agent("lost_tail_call", pg_url, ask=False)
    rt = inprocess.make_runtime(pg_url, agent, lease_ttl=TTL, poll_interval=0.05)
    thread_id = f"t-{uuid.uuid4().hex[:10]}"
    with caplog.at_level(logging.INFO, logger="tether"):
        async with inprocess.working(rt, concurrency=4):
            await rt.start(agent, {}, thread_id=thread_id)
            done = await rt.wait(thread_id, timeout=WAIT)
            checkpoints = [cp.step for cp in await rt.checkpoints(thread_id)]
            journal = await rt.store.load_journal(thread_id, AT)
    assert lost == {thread_id}
    assert done.status == RunStatus.COMPLETED, done.error
    assert checkpoints == list(range(1, STEPS + 1))
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], errors  # no duplicate journal key, no step aborted
    assert any("lease lost before journaling" in r.getMessage() for r in caplog.records)
    # The call the worker made from memory was not kept: step 4's result is the one of the
    # step as run again, after steps 1-3 (step 3 twice: it was lost).
    assert done.state["results"][AT - 1] == f"{thread_id}/{AT}/2"
    assert [bytes(j.result) for j in journal] == [f'"{thread_id}/{AT}/2"'.encode()]
    assert CALLS[thread_id, AT - 1] == 2 and CALLS[thread_id, AT] == 2


async def test_the_store_fences_calls_and_parks_by_the_step(pg_url: str) -> None:
    """The store's rule: a journaled call or a park of step s is taken only while the run is
    at step s - 1 on the lease's epoch, as a step commit of step s is."""
    store = PostgresStore(pg_url)
    await store.open()
    try:
        lease = await leased(store)
        await store.commit_step(step_commit(lease, 1))
        await store.commit_step(step_commit(lease, 2))
        for step in (1, 2, 4):  # behind the run, or a step ahead of it
            with pytest.raises(LeaseLost):
                await store.record_call(lease, step, 0, "f", b'"x"')
            with pytest.raises(LeaseLost):
                await store.park_run(lease, Park("interrupt", step, 0, interrupt_id=f"i{step}",
                                                 payload=b"{}"))
            with pytest.raises(LeaseLost):
                await store.park_run(lease, Park("sleep", step, 0, seconds=60.0))
        assert await store.list_interrupts(thread_id=lease.thread_id, status=None) == []
        for step in (1, 2, 4):
            assert await store.load_journal(lease.thread_id, step) == []
        await store.record_call(lease, 3, 0, "f", b'"x"')  # the step after the run's last
        await store.park_run(lease, Park("interrupt", 3, 1, interrupt_id="i3", payload=b"{}"))
        after = await store.get_run(lease.thread_id)
        assert after is not None and (after.status, after.step) == ("waiting", 2)
        assert [i.step for i in await store.list_interrupts(thread_id=lease.thread_id)] == [3]
    finally:
        await store.close()
