"""A run started in a process where a worker of the version it is routed to runs (another
runtime's: two versions in one worker process) is handed to that worker as it is created,
leased to it, as a run of the runtime's own version is to its own workers; with no such
worker it is queued for that version's workers to claim."""

from __future__ import annotations

import asyncio
from typing import Any

import tether
from tether import Agent, Command, Context, RunStatus

GATE = asyncio.Event()


def _agent(version: str) -> Agent:
    agent = Agent("greet")

    @agent.node(start=True)
    async def hello(state: dict[str, Any], ctx: Context) -> Command:
        await GATE.wait()
        return tether.finish({"by": version})

    return agent


async def _registered(rt: tether.Runtime, n: int) -> None:
    for _ in range(3000):  # the workers register as they start (from the database)
        if len({w.version for w in await rt.workers() if w.alive}) >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the workers did not register within 30 s")


async def test_a_run_routed_to_another_version_in_this_process_is_handed_to_its_worker(
        db_url: str) -> None:
    GATE.clear()
    v1 = tether.Runtime(db_url, agents=[_agent("v1")], version="v1")
    v2 = tether.Runtime(db_url, agents=[_agent("v2")], version="v2")
    stops = [asyncio.Event(), asyncio.Event()]
    tasks = [asyncio.create_task(rt.work(concurrency=10, stop=stop))
             for rt, stop in zip((v1, v2), stops, strict=True)]
    try:
        await _registered(v1, 2)
        await v1.route({"v2": 1})
        run = await v1.start("greet", {}, thread_id="t1")
        (worker,) = v2.local_workers
        assert (run.version, run.status) == ("v2", RunStatus.RUNNING)  # leased as created
        rec = await v1.store.get_run("t1")
        assert rec is not None and rec.lease_owner == worker.id
        GATE.set()
        done = await asyncio.wait_for(v2.wait("t1"), 30)
        assert (done.status, done.state) == (RunStatus.COMPLETED, {"by": "v2"}), done.error
        assert {cp.worker for cp in await v2.checkpoints("t1")} == {worker.id}
        # With v2's worker stopped, a run routed to v2 waits queued for one.
        stops[1].set()
        await asyncio.wait_for(tasks[1], 30)
        queued = await v1.start("greet", {}, thread_id="t2")
        assert (queued.version, queued.status) == ("v2", RunStatus.QUEUED)
    finally:
        GATE.set()
        for stop in stops:
            stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
        await v1.close()
        await v2.close()
