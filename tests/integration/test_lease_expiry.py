"""A worker never spends a call on a lease that is expired or about to expire, a step commit
extends the lease it proves, and a commit that lost the race for its step to the run's new
holder is a lost lease (issue 34: a worker whose heartbeat lagged after an outage made paid
LLM calls another worker then made again).

Two in-process workers on one database; the first one's heartbeat is stalled (what an outage
and a slow reconnect did), so its lease runs out while its one run is busy (one slot: it
does not claim the run back itself).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from apps import inprocess
from tether import Agent, Command, Context, Runtime, finish, goto
from tether.errors import LeaseLost
from tether.store.base import EffectRow, Lease, NewRun, StepCommit, Store
from tether.store.postgres import PostgresStore
from tether.worker import Worker

TTL = 1.0
BUSY = 1.6  # longer than TTL: the lease expires meanwhile (no heartbeat renews it)
WAIT = 30.0

CALLS: Counter[str] = Counter()


def paid(name: str) -> str:
    """A journaled call that costs money each time it is made."""
    CALLS[name] += 1
    return name


async def paid_slowly(name: str) -> str:
    CALLS[name] += 1
    await asyncio.sleep(0.5)  # in flight when the other worker could claim the run
    return name


@pytest.fixture
def stalled(monkeypatch: pytest.MonkeyPatch) -> Iterator[set[int]]:
    """ids of stores whose workers get no heartbeat (the test adds the first worker's)."""
    ids: set[int] = set()
    real = Worker._heartbeat

    async def heartbeat(self: Worker) -> None:
        if id(self.store) in ids:
            await asyncio.Event().wait()
        await real(self)

    monkeypatch.setattr(Worker, "_heartbeat", heartbeat)
    CALLS.clear()
    yield ids
    CALLS.clear()


async def _expired(rt: Runtime, thread_id: str) -> bool:
    run = await rt.store.get_run(thread_id)
    assert run is not None
    return run.lease_expires_at is not None and run.lease_expires_at < await rt.store.now()


async def test_no_call_on_an_expired_lease(db_url: str, stalled: set[int]) -> None:
    """The worker whose lease ran out mid-step (its heartbeat stalled) does not make the
    step's next call: the run's new holder makes it, once."""
    agent = Agent("expiry")

    @agent.node(start=True)
    async def work(state: dict[str, Any], ctx: Context) -> Command:
        await ctx.call(paid, "first")
        await asyncio.sleep(BUSY)
        await ctx.call(paid, "second")
        return finish({"ok": True})

    a = inprocess.make_runtime(db_url, agent, lease_ttl=TTL, poll_interval=0.02)
    b = inprocess.make_runtime(db_url, agent, lease_ttl=TTL, poll_interval=0.02)
    stalled.add(id(a.store))
    async with inprocess.working(a, concurrency=1):  # (no free slot: no re-claim of its own)
        run = await a.start(agent, {}, thread_id=f"x-{uuid.uuid4().hex[:8]}")
        await inprocess.eventually(lambda: _journaled(a.store, run.thread_id, 1),
                                   timeout=WAIT, what="the first call journaled")
        await inprocess.eventually(lambda: _expired(a, run.thread_id), timeout=WAIT,
                                   what="the stalled worker's lease to expire")
        async with inprocess.working(b, concurrency=2):
            done = await b.wait(run.thread_id, timeout=WAIT)
    assert done.status == "completed", done.error
    # "first" was journaled by the first worker and replayed by the second.
    assert CALLS == {"first": 1, "second": 1}, CALLS


async def test_no_step_starts_on_an_expired_lease(db_url: str, stalled: set[int]) -> None:
    """A step committed after the lease ran out (nobody had claimed the run yet) either
    extends the lease or the next step renews it before its call: another worker arriving
    meanwhile cannot take the run over and make that call again."""
    agent = Agent("expiry_step")

    @agent.node(start=True)
    async def slow(state: dict[str, Any], ctx: Context) -> Command:
        await asyncio.sleep(BUSY)
        return goto("call")

    @agent.node
    async def call(state: dict[str, Any], ctx: Context) -> Command:
        await ctx.call(paid_slowly, "llm")
        return finish({"ok": True})

    a = inprocess.make_runtime(db_url, agent, lease_ttl=TTL, poll_interval=0.02)
    b = inprocess.make_runtime(db_url, agent, lease_ttl=TTL, poll_interval=0.02)
    stalled.add(id(a.store))
    async with inprocess.working(a, concurrency=1):  # (no free slot: no re-claim of its own)
        run = await a.start(agent, {}, thread_id=f"y-{uuid.uuid4().hex[:8]}")

        async def step_one() -> bool:
            return bool(await a.store.checkpoints(run.thread_id)) and CALLS["llm"] > 0

        await inprocess.eventually(step_one, timeout=WAIT, what="step 1 committed")
        async with inprocess.working(b, concurrency=2):
            done = await b.wait(run.thread_id, timeout=WAIT)
    assert done.status == "completed", done.error
    assert CALLS == {"llm": 1}, CALLS


async def _journaled(store: Store, thread_id: str, step: int) -> bool:
    return bool(await store.load_journal(thread_id, step))


def _new_run() -> NewRun:
    data = orjson.dumps({})
    return NewRun(thread_id=f"r-{uuid.uuid4().hex[:10]}", agent="a", version="v1",
                  node="start", input=data, input_hash=hashlib.sha256(data).hexdigest())


def _commit(lease: Lease, *, effects: tuple[EffectRow, ...] = (), ttl: float | None = None
            ) -> StepCommit:
    now = time.time()
    return StepCommit(lease=lease, step=1, node="start", next_node="start", kind="d",
                      data=b"{}", attempt=1, started_at=now, finished_at=now,
                      status="running", effects=effects, lease_ttl=ttl)


async def test_a_lost_commit_race_is_a_lost_lease(store: Store) -> None:
    """The old holder of a run commits the step its successor has committed already, with
    the same effect key: LeaseLost (its run is abandoned), not DuplicateEffectKey (which
    would fail the run as a definition error)."""
    run, _ = await store.create_run(_new_run())
    (old,) = await store.claim_runs("old", "v1", ["a"], 10, 0.2)
    await asyncio.sleep(0.35)
    (new,) = await store.claim_runs("new", "v1", ["a"], 10, 30.0)
    effect = EffectRow(key="notify", idx=0, name="send", payload=b"{}")
    await store.commit_step(_commit(Lease(run.thread_id, "new", new.epoch), effects=(effect,)))
    with pytest.raises(LeaseLost):
        await store.commit_step(_commit(Lease(run.thread_id, "old", old.epoch),
                                        effects=(effect,)))


async def test_a_step_commit_extends_its_lease(pg_url: str) -> None:
    """On Postgres a step commit that keeps the run extends its lease to now + ttl once less
    than half of ttl is left (and leaves a fresher one as it is: the update stays HOT)."""
    store = PostgresStore(pg_url)
    await store.open()
    try:
        run, _ = await store.create_run(_new_run())
        (claimed,) = await store.claim_runs("w", "v1", ["a"], 10, 1.0)
        lease = Lease(run.thread_id, "w", claimed.epoch)
        await store.commit_step(_commit(lease, ttl=100.0))  # 1 s left of 100: extended
        after = await store.get_run(run.thread_id)
        assert after is not None and after.lease_expires_at is not None
        assert after.lease_expires_at > await store.now() + 99.0
        second = dataclasses.replace(_commit(lease, ttl=150.0), step=2)
        await store.commit_step(second)  # ~100 s left of 150: more than half, kept
        kept = await store.get_run(run.thread_id)
        assert kept is not None and kept.lease_expires_at == after.lease_expires_at
    finally:
        await store.close()


async def test_a_worker_renews_only_the_leases_it_drives(store: Store) -> None:
    """A run leased to a worker that no longer drives it (after a failover to an asynchronous
    standby lost its finish, say) is not kept alive by the worker's heartbeat: it expires and
    another worker takes it over."""
    driven, _ = await store.create_run(_new_run())
    forgotten, _ = await store.create_run(_new_run())
    assert len(await store.claim_runs("w", "v1", ["a"], 10, 0.3)) == 2
    assert await store.renew_leases("w", 30.0, [driven.thread_id]) == {driven.thread_id}
    await asyncio.sleep(0.45)
    taken = await store.claim_runs("other", "v1", ["a"], 10, 30.0)
    assert [r.thread_id for r in taken] == [forgotten.thread_id]


async def test_a_commit_that_skips_a_step_is_refused(pg_url: str) -> None:
    """On Postgres a step commit is fenced by the step too: a worker one step ahead of the run
    (its previous commit lost in a failover to an asynchronous standby) commits nothing,
    alone or in a group commit, rather than leave a gap in the checkpoint log."""
    store = PostgresStore(pg_url)
    await store.open()
    try:
        leases = []
        for _ in range(4):
            await store.create_run(_new_run())
        for run in await store.claim_runs("w", "v1", ["a"], 10, 30.0):
            leases.append(Lease(run.thread_id, "w", run.epoch))
        await store.commit_step(_commit(leases[0]))  # step 1
        with pytest.raises(LeaseLost):
            await store.commit_step(dataclasses.replace(_commit(leases[0]), step=3))
        results = await asyncio.gather(  # together: one group commit of all four
            *(store.commit_step(dataclasses.replace(_commit(le), step=2)) for le in leases),
            return_exceptions=True)
        assert [type(r).__name__ for r in results] == ["NoneType"] + ["LeaseLost"] * 3
        steps = {le.thread_id: [cp.step for cp in await store.checkpoints(le.thread_id)]
                 for le in leases}
        assert list(steps.values()) == [[1, 2], [], [], []], steps
    finally:
        await store.close()
