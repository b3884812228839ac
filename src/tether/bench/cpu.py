"""C: CPU-bound steps beside I/O-bound runs, in one worker (issue 17's "CPU offload" bench).

W2's runs (5 steps, each a simulated LLM call of 50-150 ms) share the worker with `cpu_runs`
runs whose 5 steps each burn `burn_ms` of pure-Python CPU: inline (in the node, on the event
loop) or offloaded (ctx.cpu_call, in the worker's process pool of `cpu_workers` processes).
Reported: W2's wall over its ideal (the clock stops when the last W2 run finishes) for W2
alone, with the CPU work inline, and offloaded; the goal is offloaded within 1.3x of alone.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import tether

from .checkpoint import W2_STEPS, w2_agent, w2_delays
from .common import Result, bench_db

cpu_agent = tether.Agent("bench_cpu")


def burn(seconds: float) -> int:
    """Pure-Python work for `seconds` of this process's CPU time (module-level: picklable)."""
    deadline = time.process_time() + seconds
    n = 0
    while time.process_time() < deadline:
        n += 1
    return n


@cpu_agent.node(start=True)
async def cpu_step(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    if state["offload"]:
        loops = await ctx.cpu_call(burn, state["burn_s"])
    else:
        loops = await ctx.call(burn, state["burn_s"])  # a sync call: runs on the loop
    update = {"loops": tether.append([loops])}
    if ctx.step < W2_STEPS:
        return tether.goto("cpu_step", update)
    return tether.finish(update)


async def one(backend: str, runs: int, cpu_runs: int, burn_ms: float, offload: bool | None,
              cpu_workers: int) -> float:
    """W2's wall / ideal in one configuration (offload None: no CPU runs at all)."""
    delays = [w2_delays(i) for i in range(runs)]
    ideal = max(sum(d) for d in delays)
    async with bench_db(backend) as url:
        runtime = tether.Runtime(url, agents=[w2_agent, cpu_agent], version="bench",
                                 cpu_workers=cpu_workers)
        await runtime.migrate()
        async with runtime:
            stop = asyncio.Event()
            worker = asyncio.create_task(runtime.work(concurrency=runs + cpu_runs, stop=stop))
            await asyncio.sleep(0)
            if offload:  # the pool's processes start before the clock does (a worker's first
                # cpu_call pays for them once; a bench of 1 s should not)
                await runtime.start(cpu_agent, {"offload": True, "burn_s": 0.0, "loops": []},
                                    thread_id="warm")
                await runtime.wait("warm", timeout=120)
            t0 = time.perf_counter()
            cpu = [] if offload is None else await asyncio.gather(*(
                runtime.start(cpu_agent, {"offload": offload, "burn_s": burn_ms / 1000,
                                          "loops": []}, thread_id=f"cpu-{i:03d}")
                for i in range(cpu_runs)))
            started = await asyncio.gather(*(
                runtime.start(w2_agent, {"delays": d, "replies": []}, thread_id=f"w2-{i:05d}")
                for i, d in enumerate(delays)))
            done = await asyncio.gather(*(runtime.wait(r.thread_id, timeout=600)
                                          for r in started))
            wall = time.perf_counter() - t0
            await asyncio.gather(*(runtime.wait(r.thread_id, timeout=600) for r in cpu))
            stop.set()
            await worker
        bad = [r for r in done if r.status is not tether.RunStatus.COMPLETED]
        if bad:
            raise RuntimeError(f"C: {len(bad)} W2 runs did not complete, e.g. {bad[0]}")
    return wall / ideal


async def cpu_offload(backend: str, runs: int = 1000, cpu_runs: int = 20, burn_ms: float = 100,
                      cpu_workers: int = 0) -> list[Result]:
    workers = cpu_workers or max(1, (os.cpu_count() or 2) - 1)  # leave the loop a CPU
    alone = await one(backend, runs, cpu_runs, burn_ms, None, workers)
    inline = await one(backend, runs, cpu_runs, burn_ms, False, workers)
    offloaded = await one(backend, runs, cpu_runs, burn_ms, True, workers)
    return [
        Result(backend, "C", "w2_wall_over_ideal_alone", round(alone, 3), "x"),
        Result(backend, "C", "w2_wall_over_ideal_cpu_inline", round(inline, 3), "x"),
        Result(backend, "C", "w2_wall_over_ideal_cpu_offloaded", round(offloaded, 3), "x"),
        Result(backend, "C", "offloaded_vs_alone", round(offloaded / alone, 3), "x"),
        Result(backend, "C", "cpu_workers", workers, "processes"),
    ]
