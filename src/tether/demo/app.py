"""The demo's agents, importable by worker subprocesses (`--app tether.demo.app:runtime`).
The database is the worker's --db; the paths come from DEMO_CALL_LOG and DEMO_SINK."""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any

import tether

research = tether.Agent("research")
payments = tether.Agent("payments")
answerer = tether.Agent("answerer")
approval = tether.Agent("approval")


def _log(path_var: str, line: str) -> None:
    path = os.environ.get(path_var)
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())


async def llm(prompt: str) -> str:
    """A simulated LLM call: logged when it starts, then 150-300 ms of latency."""
    _log("DEMO_CALL_LOG", prompt)
    await asyncio.sleep(random.uniform(0.15, 0.3))
    return f"notes on {prompt.split('|')[-1]}"


@research.node(start=True)
async def study(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    n = len(state.get("notes", []))
    note = await ctx.call(llm, f"{ctx.thread_id}|{state['topic']} part {n + 1}")
    if n + 1 < state["parts"]:
        return tether.goto("study", {"notes": tether.append([note])})
    return tether.finish({"notes": tether.append([note]), "done": True})


@payments.node(start=True)
async def charge(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    ctx.effect("charge_card", {"customer": state["customer"], "amount": state["amount"]})
    return tether.finish({"requested": True})


@answerer.node(start=True)
async def answer(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    answered = state.get("answered", 0)
    for msg in ctx.inbox:
        await ctx.call(llm, f"{ctx.thread_id}|{msg.body}")
        answered += 1
    return tether.receive({"answered": answered})


@approval.node(start=True)
async def draft(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    text = await ctx.call(llm, f"{ctx.thread_id}|draft for {state['customer']}")
    verdict = ctx.interrupt({"question": "send this draft?", "draft": text})
    return tether.finish({"draft": text, "approved": verdict})


runtime = tether.Runtime(agents=[research, payments, answerer, approval], version="v1",
                         lease_ttl=float(os.environ.get("DEMO_LEASE_TTL", "1.5")),
                         poll_interval=0.05)


@runtime.effect("charge_card")
async def charge_card(payload: dict[str, Any], key: str) -> dict[str, Any]:
    """Performs the side effect (a line in the sink), then is slow to report it done: a crash
    in that window makes the outbox deliver it again with the same key."""
    _log("DEMO_SINK", f"{key},{payload['customer']},{payload['amount']}")
    await asyncio.sleep(float(os.environ.get("DEMO_EFFECT_DELAY", "0")))
    return {"charged": payload["amount"]}
