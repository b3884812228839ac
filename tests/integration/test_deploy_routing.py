"""A start never routes by a weight table older than tether.deploy.ROUTES_TTL: after `deploy
route` or `deploy drain` in another process, the first start of a process that has been idle
since follows the new table (it once used the table it had and refreshed behind the start)."""

from __future__ import annotations

import asyncio
from typing import Any

import tether
from tether import Agent, Command, Context, deploy


def _agent() -> Agent:
    agent = Agent("greet")

    @agent.node(start=True)
    async def hello(state: dict[str, Any], ctx: Context) -> Command:
        return tether.finish({})

    return agent


async def test_the_first_start_after_a_route_follows_the_new_table(db_url: str) -> None:
    operator = tether.Runtime(db_url, agents=[_agent()], version="v1")
    other = tether.Runtime(db_url, agents=[_agent()], version="v2")
    starter = tether.Runtime(db_url, agents=[_agent()], version="v1")  # another process's
    stops = [asyncio.Event(), asyncio.Event()]
    tasks = [asyncio.create_task(rt.work(concurrency=4, stop=stop))
             for rt, stop in zip((operator, other), stops, strict=True)]
    try:
        for _ in range(3000):
            if len({w.version for w in await operator.workers() if w.alive}) == 2:
                break
            await asyncio.sleep(0.01)
        await operator.route({"v1": 100})
        first = await starter.start("greet", {}, thread_id="before")
        assert first.version == "v1"
        await operator.route({"v2": 100})
        await asyncio.sleep(deploy.ROUTES_TTL * 1.2)  # the starter has been idle since
        runs = [await starter.start("greet", {}, thread_id=f"after-route-{i}") for i in range(20)]
        assert {r.version for r in runs} == {"v2"}
        await operator.route({"v1": 50, "v2": 50})
        await asyncio.sleep(deploy.ROUTES_TTL * 1.2)
        await operator.drain("v1")
        await asyncio.sleep(deploy.ROUTES_TTL * 1.2)
        burst = await asyncio.gather(*(starter.start("greet", {}, thread_id=f"after-drain-{i}")
                                       for i in range(100)))
        assert {r.version for r in burst} == {"v2"}
    finally:
        for stop in stops:
            stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
        for rt in (operator, other, starter):
            await rt.close()
