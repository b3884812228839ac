"""The newcomer's verbs on every store: wait until a status (`wait(until=...)`), retry a failed
run from its failed step, mail refused to a run that can never read it, an operator's release
of a worker's leases, and what `start` says about a run's inbox. Real databases, a real
in-process worker."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import pytest

from apps import inprocess
from tether import (
    Agent,
    Command,
    Context,
    DefinitionError,
    InvalidState,
    LeaseLost,
    RetryPolicy,
    RunNotFound,
    RunStatus,
    finish,
    goto,
)
from tether.store.base import Lease

State = dict[str, Any]
WAIT = 20.0
make_runtime = functools.partial(inprocess.make_runtime, poll_interval=0.02)
working = functools.partial(inprocess.working, concurrency=4)


def approval_agent() -> Agent:
    agent = Agent("approval")

    @agent.node(start=True)
    async def ask(state: State, ctx: Context) -> Command:
        ok = ctx.interrupt({"question": "go?"})
        return finish({"ok": ok})

    return agent


async def test_wait_until_waiting_returns_when_the_run_parks(db_url: str) -> None:
    agent = approval_agent()
    rt = make_runtime(db_url, agent)
    async with working(rt):
        run = await rt.start(agent, {})
        parked = await rt.wait(run.thread_id, timeout=WAIT, until="waiting")
        assert parked.status == RunStatus.WAITING
        assert parked.waiting_for is not None
        # At once when already there, and a collection of statuses works the same.
        again = await rt.wait(run.thread_id, timeout=WAIT, until=["sleeping", RunStatus.WAITING])
        assert again.status == RunStatus.WAITING
        await rt.resume(run.thread_id, True)
        done = await rt.wait(run.thread_id, timeout=WAIT)
        assert (done.status, done.state) == (RunStatus.COMPLETED, {"ok": True})
        # A finished run can never reach `waiting`: the wait returns it instead of hanging.
        ended = await rt.wait(run.thread_id, timeout=WAIT, until="waiting")
        assert ended.status == RunStatus.COMPLETED


async def test_wait_until_times_out_and_rejects_unknown_statuses(db_url: str) -> None:
    agent = approval_agent()
    rt = make_runtime(db_url, agent)
    try:
        run = await rt.start(agent, {})  # no worker: it stays queued
        with pytest.raises(TimeoutError):
            await rt.wait(run.thread_id, timeout=0.2, until="waiting")
        with pytest.raises(DefinitionError, match="unknown run status 'wating'"):
            await rt.wait(run.thread_id, until="wating")
        with pytest.raises(DefinitionError, match="no status"):
            await rt.wait(run.thread_id, until=[])
        with pytest.raises(RunNotFound):
            await rt.wait("nope", timeout=1, until="waiting")
    finally:
        await rt.close()


async def test_retry_runs_a_failed_run_again_from_its_failed_step(db_url: str) -> None:
    agent = Agent("fragile")
    broken = {"on": True}
    calls: list[str] = []

    async def fetch(name: str) -> str:
        calls.append(name)
        return f"{name}!"

    @agent.node(start=True)
    async def first(state: State, ctx: Context) -> Command:
        calls.append("first")
        return goto("second", {"a": 1})

    @agent.node(retry=RetryPolicy(attempts=2, initial=0.01))
    async def second(state: State, ctx: Context) -> Command:
        got = await ctx.call(fetch, "x")  # journaled before the bug: not called again
        if broken["on"]:
            raise RuntimeError("a bug")
        return finish({"b": got})

    rt = make_runtime(db_url, agent)
    async with working(rt):
        run = await rt.start(agent, {})
        failed = await rt.wait(run.thread_id, timeout=WAIT)
        assert failed.status == RunStatus.FAILED and failed.step == 1
        assert failed.error is not None and "a bug" in failed.error.message
        assert calls == ["first", "x"]

        with pytest.raises(InvalidState, match="only a failed run can be retried"):
            await rt.retry((await rt.start(approval_agent_in(rt), {})).thread_id)

        broken["on"] = False  # the fix
        retried = await rt.retry(run.thread_id)
        assert retried.thread_id == run.thread_id
        assert retried.status in (RunStatus.QUEUED, RunStatus.RUNNING)
        assert retried.error is None and retried.node == "second"
        done = await rt.wait(run.thread_id, timeout=WAIT)
        assert (done.status, done.state) == (RunStatus.COMPLETED, {"a": 1, "b": "x!"})
        assert calls == ["first", "x"]  # step 1 not run again; the journaled call replayed
        cps = await rt.checkpoints(run.thread_id)
        assert [(cp.step, cp.node) for cp in cps] == [(1, "first"), (2, "second")]
        assert cps[1].attempt == 3  # two failed attempts, then the retry's new one

        with pytest.raises(InvalidState, match="is completed, not failed"):
            await rt.retry(run.thread_id)
        with pytest.raises(RunNotFound):
            await rt.retry("nope")


def approval_agent_in(rt: Any) -> Agent:
    agent = approval_agent()
    rt.add_agent(agent)
    return agent


async def test_mail_to_a_finished_run_is_refused_with_the_reason(db_url: str) -> None:
    agent = Agent("once")

    @agent.node(start=True)
    async def only(state: State, ctx: Context) -> Command:
        return finish({"done": True})

    rt = make_runtime(db_url, agent)
    async with working(rt):
        run = await rt.start(agent, {})
        await rt.wait(run.thread_id, timeout=WAIT)
        with pytest.raises(InvalidState, match="is completed: it can never read mail"):
            await rt.send(run.thread_id, {"hi": 1})
        assert await rt.inbox(run.thread_id) == []
        with pytest.raises(RunNotFound):
            await rt.send("nope", {"hi": 1})
        cancelled = await rt.start(approval_agent_in(rt), {})
        await rt.cancel(cancelled.thread_id)
        with pytest.raises(InvalidState, match="is cancelled"):
            await rt.send(cancelled.thread_id, {"hi": 1})


async def test_start_reports_the_inbox_depth_as_get_does(db_url: str) -> None:
    agent = approval_agent()
    rt = make_runtime(db_url, agent)
    try:
        run = await rt.start(agent, {}, thread_id="t1")
        assert run.inbox_depth == 0
        await rt.send("t1", {"m": 1})
        again = await rt.start(agent, {}, thread_id="t1")
        assert not again.created
        assert again.inbox_depth == (await rt.get("t1")).inbox_depth == 1
    finally:
        await rt.close()


async def test_release_worker_frees_its_runs_at_once_and_fences_it_out(db_url: str) -> None:
    agent = Agent("steps")

    @agent.node(start=True)
    async def one(state: State, ctx: Context) -> Command:
        return finish({"done": True})

    rt = make_runtime(db_url, agent)
    try:
        run = await rt.start(agent, {})
        # A worker that claimed the run with a long TTL and then died (nothing renews it).
        claimed = await rt.store.claim_runs("dead:1:x", "v1", ["steps"], 10, 3600)
        assert [r.thread_id for r in claimed] == [run.thread_id]
        stale = Lease(run.thread_id, "dead:1:x", claimed[0].epoch)
        assert await rt.release_worker("someone-else") == []
        assert await rt.release_worker("dead:1:x") == [run.thread_id]
        row = await rt.peek(run.thread_id)
        assert (row.status, row.lease_owner) == (RunStatus.QUEUED, None)
        with pytest.raises(LeaseLost):  # the old holder, were it alive, commits nothing
            await rt.store.record_call(stale, 1, 0, "f", b"1")
        with pytest.raises(DefinitionError):
            await rt.release_worker("")
    finally:
        await rt.close()
    rt = make_runtime(db_url, agent)
    async with working(rt):
        done = await asyncio.wait_for(rt.wait(run.thread_id), WAIT)  # well within the 1 h TTL
        assert done.status == RunStatus.COMPLETED
