"""Version v1 of the app the rainbow-deploy tests run (`--app apps.deploy_v1:make_runtime`).

Agent `deal`: `draft` (optionally waiting on an interrupt first, when `state["ask"]`) goes to
`review`, which finishes with result "v1"; with `state["legacy"]` it goes to `legacy`
instead, a node that waits on an interrupt and that v2 no longer has. `state["pause"]`
seconds of sleep in each node keep runs in flight.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import tether

agent = tether.Agent("deal")


@agent.node(start=True)
async def draft(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    answer = ctx.interrupt({"q": "approve?"}) if state.get("ask") else None
    await asyncio.sleep(state.get("pause", 0))
    if state.get("legacy"):
        return tether.goto("legacy", {"drafted_by": ctx.version})
    return tether.goto("review", {"drafted_by": ctx.version, "answer": answer})


@agent.node
async def review(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    await asyncio.sleep(state.get("pause", 0))
    return tether.finish({"result": "v1", "reviewed_by": ctx.version})


@agent.node
async def legacy(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    answer = ctx.interrupt({"q": "legacy?"})
    return tether.finish({"result": "v1-legacy", "answer": answer})


def make_runtime() -> tether.Runtime:
    return tether.Runtime(os.environ.get("TETHER_DB"), agents=[agent], version="v1")
