"""Version v2 of the rainbow-deploy tests' app (`--app apps.deploy_v2:make_runtime`): `review`
now gives result "v2" and goes on to a new node, `polish`; the node `legacy` is gone.
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
    return tether.goto("review", {"drafted_by": ctx.version, "answer": answer})


@agent.node
async def review(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    await asyncio.sleep(state.get("pause", 0))
    return tether.goto("polish", {"result": "v2", "reviewed_by": ctx.version})


@agent.node
async def polish(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    return tether.finish({"polished": True})


def make_runtime() -> tether.Runtime:
    return tether.Runtime(os.environ.get("TETHER_DB"), agents=[agent], version="v2")
