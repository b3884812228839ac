"""Agents for the dashboard's browser tests and screenshots (`tether serve --app
dashboard_app:runtime`, with tests/apps on PYTHONPATH).

`notify` effects fail (and are dead after one attempt) until the file named by
$DASH_FX_OK exists: a test makes an effect dead, creates the file, and retries it. The
`failing` agent fails the same way until $DASH_FIXED exists (then a retried run completes).
The runtime's version is $DASH_VERSION (default v1): a test starts workers of two versions.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import tether

approval = tether.Agent("approval")


def suggest_reply(item: str) -> dict[str, Any]:
    """Stands for a model call: journaled, so a re-execution of the step replays it."""
    return {"text": f"reply to {item}", "tokens": 7}


@approval.node(start=True)
async def draft(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    reply = await ctx.call(suggest_reply, state.get("item", "x"))
    return tether.goto("ask", {"draft": reply["text"], "log": tether.append(["drafted"])})


@approval.node
async def ask(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    answer = ctx.interrupt({"question": f"send {state['draft']!r}?"})
    return tether.finish({"answer": answer, "log": tether.append(["answered"])})


ticker = tether.Agent("ticker")


@ticker.node(start=True)
async def tick(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    n = int(state.get("n", 0)) + 1
    await asyncio.sleep(float(state.get("delay", 0.05)) * (1 + n % 3))
    update = {"n": n, "seen": tether.append([n]), "last": {"step": ctx.step, "even": n % 2 == 0}}
    if n >= int(state.get("steps", 3)):
        return tether.finish(update)
    return tether.goto("tick", update)


notifier = tether.Agent("notifier")


@notifier.node(start=True)
async def notify_node(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    ctx.effect("notify", {"to": state.get("to", "ops"), "text": "run done"})
    return tether.finish({"notified": True})


failing = tether.Agent("failing", retry=tether.RetryPolicy(attempts=1))


@failing.node(start=True)
async def boom(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    fixed = os.environ.get("DASH_FIXED", "")
    if not fixed or not os.path.exists(fixed):
        raise RuntimeError("the model returned nonsense")
    return tether.finish({"fixed": True})


family = tether.Agent("family")


@family.node(start=True)
async def beget(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    """Spawns `kids` children, each spawning `kids - 1`, down to none: a tree of runs."""
    kids = int(state.get("kids", 2))
    for i in range(kids):
        ctx.spawn("family", {"kids": kids - 1}, thread_id=f"{ctx.thread_id}.{i}")
    return tether.finish({"spawned": kids})


messenger = tether.Agent("messenger")


@messenger.node(start=True)
async def post(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    """Sends {"hello": recipient} to each run named in `to`, in this one step."""
    for recipient in state.get("to", []):
        ctx.send(recipient, {"hello": recipient})
    return tether.finish({"sent": len(state.get("to", []))})


listener = tether.Agent("listener")


@listener.node(start=True)
async def listen(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    """An actor: reads its mail (each step consumes what it was given) until "stop"."""
    got = [*state.get("got", []), *(m.body for m in ctx.inbox)]
    if "stop" in got:
        return tether.finish({"got": got})
    return tether.receive({"got": got})


async def notify(payload: dict[str, Any], key: str) -> dict[str, Any]:
    flag = os.environ.get("DASH_FX_OK", "")
    if not flag or not os.path.exists(flag):
        raise ConnectionError(f"mail relay refused {payload['to']!r}")
    return {"sent": key}


DB = os.environ.get("TETHER_DB", "sqlite:///tether.db")
runtime = tether.Runtime(DB, agents=[approval, ticker, notifier, failing, family,
                                         messenger, listener],
                         version=os.environ.get("DASH_VERSION", "v1"),
                         lease_ttl=2.0, poll_interval=0.1)
runtime.effect("notify", retry=tether.RetryPolicy(attempts=1))(notify)
