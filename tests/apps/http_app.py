"""Agents served by the HTTP acceptance tests, run by `tether serve` and `tether worker`
subprocesses (`--app http_app:runtime`, with tests/apps on PYTHONPATH).

HTTP_APP_LOG names a file where nodes record what they were given, so a test can count
deliveries across processes.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import orjson

import tether

LOG = os.environ.get("HTTP_APP_LOG")


def record(thread_id: str, value: Any) -> None:
    """Append `thread_id <value as JSON>` to HTTP_APP_LOG, durably."""
    if not LOG:
        return
    line = f"{thread_id} {orjson.dumps(value).decode()}"
    with open(LOG, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def recorded(thread_id: str) -> bool:
    """Whether HTTP_APP_LOG has a line of this run's."""
    if not LOG or not os.path.exists(LOG):
        return False
    with open(LOG) as f:
        return any(line.split(" ", 1)[0] == thread_id for line in f)


echo = tether.Agent("echo")


@echo.node(start=True)
async def first(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    await asyncio.sleep(float(state.get("delay", 0)))  # time for an SSE client to connect
    ctx.stream({"token": "hello"})
    return tether.goto("second", {"seen": [ctx.step]})


@echo.node
async def second(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    return tether.finish({"done": True, "echo": state.get("message")})


approval = tether.Agent("approval")


@approval.node(start=True)
async def ask(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    answer = ctx.interrupt({"question": f"approve {state.get('item')}?"})
    first = not recorded(ctx.thread_id)
    record(ctx.thread_id, answer)
    if first:  # `hold`: seconds the first run of the step holds the answer (a test kills it)
        await asyncio.sleep(float(state.get("hold", 0)))
    return tether.finish({"answer": answer})


sleeper = tether.Agent("sleeper")


@sleeper.node(start=True)
async def nap(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    slept_at = await ctx.call(time.time)
    ctx.sleep(float(state.get("seconds", 2)))
    woke_at = await ctx.call(time.time)
    return tether.finish({"slept_at": slept_at, "woke_at": woke_at})


ticker = tether.Agent("ticker")


@ticker.node(start=True)
async def tick(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    n = int(state.get("n", 0)) + 1
    await asyncio.sleep(float(state.get("delay", 0.1)))
    if n >= int(state.get("steps", 3)):
        return tether.finish({"n": n})
    return tether.goto("tick", {"n": n})


failing = tether.Agent("failing", retry=tether.RetryPolicy(attempts=1))


@failing.node(start=True)
async def boom(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    raise RuntimeError("boom")


collector = tether.Agent("collector")


@collector.node(start=True)
async def collect(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    got = [*state.get("got", []), *({"from": m.sender, "body": m.body} for m in ctx.inbox)]
    if any(m.body == "stop" for m in ctx.inbox):
        return tether.finish({"got": got})
    return tether.receive({"got": got})


DB = os.environ.get("TETHER_DB", "sqlite:///tether.db")
runtime = tether.Runtime(DB, agents=[echo, approval, sleeper, ticker, failing, collector],
                         version="v1", lease_ttl=2.0, poll_interval=0.1)
quick = tether.Runtime(DB, agents=[echo], version="v1", lease_ttl=2.0, poll_interval=0.1)
"""Only runs that finish by themselves: what schemathesis may start (an SSE request for a
run that waits for a person would stream until it times out)."""

