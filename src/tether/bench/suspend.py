"""W5: R runs each reach an interrupt that waits for human input; one worker in this process.
Time to suspend all, RSS while all are suspended, time to resume all and finish."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import tether

from .common import Result, StatusCounts, bench_db, current_rss_mib, peak_rss_mib, stop_worker, suffix

W5_CONCURRENCY = 1000  # worker slots; a run holds one only until it parks at the interrupt
W5_PHASE_DEADLINE = 120.0  # s for each of suspend and resume before the workload gives up
W5_RESUME_CHUNK = 500  # runtime.resume calls in flight at once

w5_agent = tether.Agent("bench_w5")


@w5_agent.node(start=True)
async def w5_ask(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    answer = ctx.interrupt({"question": "approve?", "i": state["i"]})
    return tether.finish({"answer": answer})


async def w5(backend: str, runs: int) -> list[Result]:
    """`runs` runs each reach ctx.interrupt; one in-process worker. Time to suspend all, RSS
    while they are suspended against idle RSS, time to resume all and finish."""
    async with bench_db(backend) as url:
        runtime = tether.Runtime(url, agents=[w5_agent], version="bench")
        await runtime.migrate()
        async with runtime, StatusCounts(url) as counts:
            stop = asyncio.Event()
            worker = asyncio.create_task(runtime.work(concurrency=W5_CONCURRENCY, stop=stop))
            # Warm-up outside the clock: one run through interrupt, resume and finish (imports,
            # connections, statement caches), then let the worker settle before idle RSS.
            await runtime.start(w5_agent, {"i": -1}, thread_id="warmup")
            await counts.until("waiting", 1, time.perf_counter() + 30, "W5 warm-up")
            await runtime.resume("warmup", {"approved": True, "i": -1})
            warm = await runtime.wait("warmup", timeout=30)
            assert warm.state["answer"] == {"approved": True, "i": -1}, warm.state
            await asyncio.sleep(0.5)
            idle_rss = current_rss_mib()

            t0 = time.perf_counter()
            for lo in range(0, runs, 1000):  # started in chunks; no Run objects kept
                await asyncio.gather(*(
                    runtime.start(w5_agent, {"i": i}, thread_id=f"w5-{i:05d}")
                    for i in range(lo, min(lo + 1000, runs))))
            t_started = time.perf_counter()
            t_suspended = await counts.until("waiting", runs, t0 + W5_PHASE_DEADLINE,
                                             "W5 suspend")
            await asyncio.sleep(0.5)  # let the worker finish its bookkeeping
            suspended_rss = current_rss_mib()
            by_status = await counts.get()
            if by_status.get("waiting", 0) != runs:
                raise RuntimeError(f"W5: expected {runs} waiting runs, found {by_status}")

            async def resume(i: int) -> None:
                await runtime.resume(f"w5-{i:05d}", {"approved": True, "i": i})

            t1 = time.perf_counter()
            for lo in range(0, runs, W5_RESUME_CHUNK):
                await asyncio.gather(*(resume(i) for i in range(lo, min(lo + W5_RESUME_CHUNK, runs))))
            t_resumed = time.perf_counter()
            t_done = await counts.until("completed", runs + 1, t1 + W5_PHASE_DEADLINE,
                                        "W5 resume")
            finished_rss = current_rss_mib()
            await stop_worker(stop, worker)
            by_status = await counts.get()
            if by_status != {"completed": runs + 1}:
                raise RuntimeError(f"W5: runs by status at the end: {by_status}")
            for i in random.Random(5).sample(range(runs), min(runs, 20)):
                run = await runtime.get(f"w5-{i:05d}")
                if run.state.get("answer") != {"approved": True, "i": i}:
                    raise RuntimeError(f"W5: run {i} finished with {run.state}")
    s = suffix(runs)

    def r(metric: str, value: float, unit: str) -> Result:
        return Result(backend, "W5", f"{metric}_{s}", round(value, 3), unit)

    return [
        r("start_s", t_started - t0, "s"),
        r("suspend_s", t_suspended - t0, "s"),
        r("idle_rss_mib", idle_rss, "MiB"),
        r("suspended_rss_mib", suspended_rss, "MiB"),
        r("rss_delta_mib", suspended_rss - idle_rss, "MiB"),
        r("resume_calls_s", t_resumed - t1, "s"),
        r("resume_finish_s", t_done - t1, "s"),
        r("finished_rss_mib", finished_rss, "MiB"),
        r("peak_rss_mib", peak_rss_mib(), "MiB"),
    ]
