"""Two versions of one agent for `tether demo deploy`, importable by worker subprocesses
(`--app tether.demo.versions:v1` or `:v2`). The database comes from TETHER_DB.

`ticket`: `triage` works for `state["steps"]` super-steps (a simulated LLM call each), then
`answer`. v2 changes the answer and adds a node, `review`, after it.
"""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any

import tether


async def think(seconds: float) -> float:
    """A simulated LLM call."""
    await asyncio.sleep(random.uniform(0.5, 1.0) * seconds)
    return seconds


def _agent(version: str) -> tether.Agent:
    agent = tether.Agent("ticket")

    @agent.node(start=True)
    async def triage(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
        await ctx.call(think, state.get("pause", 0.1))
        done = state.get("done", 0) + 1
        if done < state.get("steps", 1):
            return tether.goto("triage", {"done": done})
        return tether.goto("answer", {"done": done})

    @agent.node
    async def answer(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
        if version == "v1":
            return tether.finish({"answer": "v1: please restart your router"})
        return tether.goto("review", {"answer": "v2: your router was restarted remotely"})

    if version == "v2":
        @agent.node
        async def review(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
            return tether.finish({"reviewed": True})

    return agent


v1_agent, v2_agent = _agent("v1"), _agent("v2")


def v1() -> tether.Runtime:
    return tether.Runtime(os.environ.get("TETHER_DB"), agents=[v1_agent], version="v1")


def v2() -> tether.Runtime:
    return tether.Runtime(os.environ.get("TETHER_DB"), agents=[v2_agent], version="v2")
