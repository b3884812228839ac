"""When a worker's claim loop asks the database for runs: a run ending wakes it only when
the worker was full (a free slot may let it take a queued run at once); a worker that had
slots to spare found the queue empty at its last claim, and new work wakes it by itself (a
start, a send, an answer), so it does not ask again for every run that ends."""

from __future__ import annotations

import asyncio
from typing import Any

import tether
from apps.inprocess import working
from tether import Agent, Command, Context, RunStatus
from tether.store.base import RunRecord


def _agent() -> Agent:
    agent = Agent("quick")

    @agent.node(start=True)
    async def only(state: dict[str, Any], ctx: Context) -> Command:
        await asyncio.sleep(0.01 * state["i"])
        return tether.finish({"done": True})

    return agent


def _count_claims(rt: tether.Runtime) -> list[int]:
    """The number of runs each claim_runs call returned, in order."""
    store: Any = rt.store
    claim = store.claim_runs
    got: list[int] = []

    async def counted(*args: Any, **kwargs: Any) -> list[RunRecord]:
        runs: list[RunRecord] = await claim(*args, **kwargs)
        got.append(len(runs))
        return runs

    store.claim_runs = counted
    return got


async def _drained(rt: tether.Runtime, runs: list[tether.Run],
                   concurrency: int) -> list[tether.Run]:
    """The runs once a worker of `concurrency` slots has run them all."""
    async with working(rt, concurrency, close=False):
        return await asyncio.wait_for(
            asyncio.gather(*(rt.wait(r.thread_id) for r in runs)), 20)


async def test_a_full_worker_takes_the_next_queued_run_as_a_slot_frees(db_url: str) -> None:
    # A poll interval far longer than the test: only the wake-up of a run's end can start
    # the queued runs in time.
    rt = tether.Runtime(db_url, agents=[_agent()], poll_interval=60.0)
    async with rt:
        runs = [await rt.start("quick", {"i": 1}) for _ in range(6)]
        done = await _drained(rt, runs, concurrency=2)
    assert {r.status for r in done} == {RunStatus.COMPLETED}


async def test_runs_ending_with_slots_to_spare_make_no_claims(db_url: str) -> None:
    rt = tether.Runtime(db_url, agents=[_agent()], poll_interval=60.0)
    async with rt:
        claims = _count_claims(rt)
        runs = [await rt.start("quick", {"i": i}) for i in range(1, 11)]
        done = await _drained(rt, runs, concurrency=50)
    assert {r.status for r in done} == {RunStatus.COMPLETED}
    # The first claim takes all ten; ten runs ending one by one ask for nothing more.
    assert claims[0] == 10, claims
    assert len(claims) <= 2, claims
