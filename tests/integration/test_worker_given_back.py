"""The worker's count of runs given back at shutdown includes a step that finished within the
grace period and was committed as queued (not only the leases released after it)."""

from __future__ import annotations

import asyncio
from typing import Any

import tether


async def test_a_step_finished_in_the_grace_counts_as_given_back(db_url: str) -> None:
    agent = tether.Agent("grace")
    started = asyncio.Event()

    @agent.node(start=True)
    async def slow(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
        started.set()
        await asyncio.sleep(0.3)
        return tether.goto("slow", state)

    rt = tether.Runtime(db_url, agents=[agent])  # a grace of 10 s by default
    async with rt:
        run = await rt.start(agent, {})
        stop = asyncio.Event()
        work = asyncio.create_task(rt.work(concurrency=2, stop=stop))
        await asyncio.wait_for(started.wait(), 10)
        [worker] = rt.local_workers
        stop.set()
        await asyncio.wait_for(work, 10)
        record = await rt.peek(run.thread_id)
        assert (record.status, record.step) == ("queued", 1)
        assert worker.given_back == 1 and worker.still_leased == 0
