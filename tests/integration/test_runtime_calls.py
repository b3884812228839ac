"""`runtime.calls(thread_id, step)`: what a step journaled, as a re-execution would replay it,
on every store (the dashboard's step page shows it). Real databases, a real in-process
worker."""

from __future__ import annotations

import functools
import uuid
from typing import Any

import pytest

from apps import inprocess
from tether import Agent, Command, Context, RunNotFound, finish, goto
from tether.runtime import Call

WAIT = 20.0
make_runtime = functools.partial(inprocess.make_runtime, poll_interval=0.02)


def lookup(item: str) -> dict[str, Any]:
    return {"item": item, "price": 12}


async def test_calls_lists_each_steps_journal_in_call_order(db_url: str) -> None:
    agent = Agent("shop")

    @agent.node(start=True)
    async def quote(state: dict[str, Any], ctx: Context) -> Command:
        first = await ctx.call(lookup, "tea")
        second = await ctx.call(uuid.uuid4)
        return goto("pay", {"price": first["price"], "ref": str(second)})

    @agent.node
    async def pay(state: dict[str, Any], ctx: Context) -> Command:
        return finish({"paid": True})

    rt = make_runtime(db_url, agent)
    async with inprocess.working(rt, concurrency=2):
        run = await rt.start(agent, {})
        done = await rt.wait(run.thread_id, timeout=WAIT)
        calls = await rt.calls(run.thread_id, 1)
        assert [(c.thread_id, c.step, c.index) for c in calls] == [
            (run.thread_id, 1, 0), (run.thread_id, 1, 1)]
        assert calls[0] == Call(run.thread_id, 1, 0, calls[0].name, {"item": "tea", "price": 12},
                                {"args": ["tea"]})
        assert calls[0].name.endswith("lookup") and calls[1].name.endswith("uuid4")
        assert calls[1].result == uuid.UUID(done.state["ref"])  # the typed value, read back
        assert await rt.calls(run.thread_id, 2) == []
        assert await rt.calls(run.thread_id, 99) == []
        with pytest.raises(RunNotFound):
            await rt.calls("no-such-run", 1)
