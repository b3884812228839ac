"""The agent the failover tests' worker subprocesses run (issue 34).

    TETHER_DB=URL python -m tether worker --app apps.ha_app:make_runtime --db URL ...

A run of `ha` makes `state["steps"]` steps of one node. Each step makes one journaled call,
chaos_app.record_call (logged to $CHAOS_CALL_LOG when it starts, so the log counts every real
invocation); step `state["ask_at"]` (if any) first parks on an interrupt and goes on with the
answer; step `state["effect_at"]` (if any) also requests the effect `sink.write`
(effects_app's handler: each performance appended to $EFFECTS_SINK, under its key).
"""

from __future__ import annotations

import os
from typing import Any

import tether

from .chaos_app import record_call
from .effects_app import sink_write

agent = tether.Agent("ha")


@agent.node(start=True)
async def work(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    update: dict[str, Any] = {}
    if ctx.step == state.get("ask_at"):
        update["answer"] = ctx.interrupt({"step": ctx.step})
    out = await ctx.call(record_call, ctx.thread_id, ctx.step, ctx.attempt, state["pause"])
    if ctx.step == state.get("effect_at"):
        ctx.effect("sink.write", {"thread_id": ctx.thread_id, "step": ctx.step,
                                  "nonce": out["nonce"]})
    update.update(done=tether.append([ctx.step]), nonces=tether.append([out["nonce"]]))
    if ctx.step >= state["steps"]:
        return tether.finish({**update, "finished": True})
    return tether.goto("work", update)


def run_input(i: int, *, steps: int, pause: tuple[float, float], ask_at: int | None = None,
              effect_at: int | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {"i": i, "steps": steps, "pause": list(pause)}
    if ask_at is not None:
        data["ask_at"] = ask_at
    if effect_at is not None:
        data["effect_at"] = effect_at
    return data


def make_runtime() -> tether.Runtime:
    rt = tether.Runtime(os.environ.get("TETHER_DB"), agents=[agent], version="v1")
    rt.effect("sink.write", retry=tether.RetryPolicy(attempts=1000, initial=0.05,
                                                     maximum=0.5))(sink_write)
    return rt
