"""The agent of the observability tests (worker subprocesses and in-process).

    python -m tether worker --app apps.observe_app:make_runtime --db URL ...

A run of `obs` makes `state["steps"]` steps of one node. Each execution first makes one
journaled call, then appends `thread_id,step,attempt,outcome` to $CHAOS_CALL_LOG (one
O_APPEND write), so the test knows the true counts: executions, failures, retries. The node
raises ValueError on its first `state["fail"]` executions of step 1 (retried up to 3 attempts
in all, so fail >= 3 fails the run for good), interrupts at step `state["ask"]` if given, and
requests the effect `note` at its last step. `state["pause"]` seconds at each step give a test
time to kill a worker mid-run.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import tether
from tether.retry import RetryPolicy

from . import CALL_LOG_ENV

agent = tether.Agent("obs", retry=RetryPolicy(attempts=3, initial=0.01, maximum=0.02))
child_agent = tether.Agent("obs_child")


def log(line: str) -> None:
    path = os.environ.get(CALL_LOG_ENV)
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


async def think(step: int) -> int:
    return step * 10


@agent.node(start=True)
async def work(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    await ctx.call(think, ctx.step)
    if state.get("pause"):
        await asyncio.sleep(state["pause"])
    fail = ctx.step == 1 and ctx.attempt <= state.get("fail", 0)
    log(f"{ctx.thread_id},{ctx.step},{ctx.attempt},{'fail' if fail else 'ok'}")
    if fail:
        raise ValueError(f"attempt {ctx.attempt} fails")
    if ctx.step == state.get("ask"):
        answer = ctx.interrupt({"question": "go on?"})
        state = {**state, "answer": answer}
    if ctx.step == state.get("spawn"):
        ctx.spawn(child_agent, {"n": 1}, thread_id=f"{ctx.thread_id}.child")
    if ctx.step >= state["steps"]:
        ctx.effect("note", {"thread_id": ctx.thread_id})
        return tether.finish({"done": True})
    return tether.goto("work", {"at": ctx.step})


@child_agent.node(start=True)
async def child(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    await ctx.call(think, ctx.step)
    return tether.finish({"child": True})


def make_runtime() -> tether.Runtime:
    rt = tether.Runtime(agents=[agent, child_agent], version="v1")

    @rt.effect("note")
    async def note(payload: Any, key: str) -> None:
        return None

    return rt
