"""The agent of the Prometheus screenshot (scripts/screenshot-prometheus) and of
docs/howto-observability.md's walk-through: `research` searches (about 0.1 s a step, a few
rounds) then writes (0.3 s), so a graph of its steps shows two nodes apart.

    tether worker --app research_app:runtime --metrics-port 9464     # tests/apps on PYTHONPATH
"""

from __future__ import annotations

import asyncio
from typing import Any

import tether

research = tether.Agent("research")


@research.node(start=True)
async def search(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    await asyncio.sleep(0.06 + 0.02 * (ctx.step % 4))
    if ctx.step >= int(state.get("rounds", 3)):
        return tether.goto("write")
    return tether.goto("search")


@research.node
async def write(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    await asyncio.sleep(0.3)
    return tether.finish({"pages": ctx.step})


runtime = tether.Runtime(agents=[research], version="v1")
