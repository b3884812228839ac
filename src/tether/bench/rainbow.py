"""R: routing must not slow starts. W2's workload (runs started at once, 5 steps, one
journaled simulated LLM call each) measured twice in one process, back to back on fresh
databases: on one version (one worker), and on two versions routed 50/50 (a worker of each,
both in this process, every run started through the first version's runtime, so half are
handed to its own worker and half go queued to the other's). `two_over_one_*`: wall time of
the second over the first (goal: within 10%), the median of `rounds` such pairs (default 3) in
alternating order, with the worst pair's as two_over_one_max.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from statistics import median

import tether

from .checkpoint import W2_STEPS, w2_agent, w2_deadline, w2_delays
from .common import Result, bench_db, stop_worker, suffix

VERSIONS = ("bench", "bench2")


async def _once(backend: str, runs: int, versions: tuple[str, ...]) -> tuple[float, Counter[str]]:
    delays = [w2_delays(i) for i in range(runs)]
    async with bench_db(backend) as url:
        rts = [tether.Runtime(url, agents=[w2_agent], version=v) for v in versions]
        await rts[0].migrate()
        stops = [asyncio.Event() for _ in rts]
        workers = []
        for rt, stop in zip(rts, stops, strict=True):
            await rt.open()
            workers.append(asyncio.create_task(rt.work(concurrency=runs, stop=stop)))
        try:
            for _ in range(3000):  # up to 30 s for the workers to register
                if await _registered(rts[0], len(rts)):
                    break
                await asyncio.sleep(0.01)
            else:
                raise RuntimeError("R: the workers did not register within 30 s")
            if len(rts) > 1:
                await rts[0].route({v: 1 for v in versions})
            by_version = {rt.version: rt for rt in rts}
            t0 = time.perf_counter()
            started = await asyncio.gather(*(
                rts[0].start(w2_agent, {"delays": d, "replies": []}, thread_id=f"w2-{i:05d}")
                for i, d in enumerate(delays)))
            # Each run is waited for by its version's runtime: its local worker wakes it.
            async with asyncio.timeout(w2_deadline(runs)):
                done = await asyncio.gather(*(by_version[r.version].wait(r.thread_id)
                                              for r in started))
            wall = time.perf_counter() - t0
        finally:
            for stop, task in zip(stops, workers, strict=True):
                await stop_worker(stop, task)
            for rt in rts:
                await rt.close()
    bad = [r for r in done if r.status is not tether.RunStatus.COMPLETED
           or len(r.state["replies"]) != W2_STEPS]
    if bad:
        raise RuntimeError(f"R: {len(bad)} runs did not complete, e.g. {bad[0]}")
    return wall, Counter(r.version for r in done)


async def _registered(rt: tether.Runtime, versions: int) -> bool:
    """Every version's worker is in the registry (read from the database)."""
    return len({w.version for w in await rt.workers() if w.alive}) >= versions


async def rainbow(backend: str, runs: int, rounds: int = 3) -> list[Result]:
    """`rounds` pairs of (one version, two versions), the order alternating, each on fresh
    databases: the figures are the medians over the rounds, and two_over_one the median of
    each round's own ratio (a pair shares the machine's state of the moment)."""
    ideal = max(sum(w2_delays(i)) for i in range(runs))
    ones, twos, ratios, shares = [], [], [], []
    for i in range(rounds):
        if i % 2 == 0:
            one, _ = await _once(backend, runs, VERSIONS[:1])
            two, split = await _once(backend, runs, VERSIONS)
        else:
            two, split = await _once(backend, runs, VERSIONS)
            one, _ = await _once(backend, runs, VERSIONS[:1])
        ones.append(one)
        twos.append(two)
        ratios.append(two / one)
        shares.append(100 * split[VERSIONS[1]] / runs)
    s = suffix(runs)
    return [
        Result(backend, "R", f"one_version_over_ideal_{s}", round(median(ones) / ideal, 3), "x"),
        Result(backend, "R", f"two_versions_over_ideal_{s}", round(median(twos) / ideal, 3),
               "x"),
        Result(backend, "R", f"two_over_one_{s}", round(median(ratios), 3), "x"),
        Result(backend, "R", f"two_over_one_max_{s}", round(max(ratios), 3), "x"),
        Result(backend, "R", f"second_version_share_{s}", round(median(shares), 1), "%"),
    ]
