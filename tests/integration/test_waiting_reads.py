"""`runtime.wait` on runs no worker of this process drives: the waits begun together share one
status read; a waiter is registered before that read, so a run that ends while it is read
still wakes it at once; a failed shared read falls back to each waiter's own."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

import tether
from apps.inprocess import working
from tether import Agent, Command, Context, RunNotFound, RunStatus
from tether.errors import StoreUnavailable


def _agent() -> Agent:
    agent = Agent("short")

    @agent.node(start=True)
    async def only(state: dict[str, Any], ctx: Context) -> Command:
        return tether.finish({"n": state["n"] + 1})

    return agent


def _spy(rt: tether.Runtime, name: str) -> list[Any]:
    """The arguments of each call of the store's method `name`, in order."""
    store: Any = rt.store
    method = getattr(store, name)
    calls: list[Any] = []

    async def spied(*args: Any) -> Any:
        calls.append(args)
        return await method(*args)

    setattr(store, name, spied)
    return calls


async def test_waits_begun_together_share_one_read(db_url: str) -> None:
    rt = tether.Runtime(db_url, agents=[_agent()], poll_interval=60.0)
    async with rt:
        runs = [await rt.start("short", {"n": i}) for i in range(20)]
        statuses, gets = _spy(rt, "run_statuses"), _spy(rt, "get_run")
        waits = asyncio.gather(*(rt.wait(r.thread_id) for r in runs))
        await asyncio.sleep(0)  # every wait has asked before the worker starts
        async with working(rt, 50, close=False):
            done = await asyncio.wait_for(waits, 20)
    assert [r.state["n"] for r in done] == [i + 1 for i in range(20)]
    assert {r.status for r in done} == {RunStatus.COMPLETED}
    assert len(statuses) == 1 and sorted(statuses[0][0]) == sorted(r.thread_id for r in runs)
    assert gets == []  # the worker handed each waiter its run


async def test_a_run_that_ends_while_its_status_is_read_wakes_its_waiter(
        db_url: str) -> None:
    rt = tether.Runtime(db_url, agents=[_agent()], poll_interval=60.0)
    async with rt:
        run = await rt.start("short", {"n": 1})
        store: Any = rt.store
        read = store.run_statuses

        async def stale(ids: Sequence[str]) -> dict[str, str]:
            found: dict[str, str] = await read(ids)  # the run as it was: queued
            rt.hub.notify_finished(run.thread_id)  # it ends before the read returns
            return found

        store.run_statuses = stale
        # The poller would notice only after 60 s: the waiter must have been woken.
        got = await asyncio.wait_for(rt.wait(run.thread_id), 10)
    assert got.thread_id == run.thread_id
    assert rt.hub.waited() == frozenset()


async def test_a_failed_shared_read_falls_back_to_each_waiters_own(db_url: str) -> None:
    rt = tether.Runtime(db_url, agents=[_agent()], poll_interval=60.0)
    async with rt:
        run = await rt.start("short", {"n": 1})
        async with working(rt, 5, close=False):
            await asyncio.wait_for(rt.wait(run.thread_id), 20)
        store: Any = rt.store

        async def down(ids: Sequence[str]) -> dict[str, str]:
            raise StoreUnavailable("the shared read failed")

        store.run_statuses = down
        done, missing = await asyncio.wait_for(asyncio.gather(
            rt.wait(run.thread_id), rt.wait("no-such-run"), return_exceptions=True), 10)
    assert isinstance(done, tether.Run) and done.status is RunStatus.COMPLETED
    assert isinstance(missing, RunNotFound)
    assert rt.hub.waited() == frozenset()


async def test_a_wait_for_an_unknown_run_says_so(db_url: str) -> None:
    rt = tether.Runtime(db_url, agents=[_agent()])
    async with rt:
        with pytest.raises(RunNotFound, match="no-such-run"):
            await rt.wait("no-such-run", timeout=5)
        assert rt.hub.waited() == frozenset()
