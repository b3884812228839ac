"""W4: queue throughput. N no-op jobs (runs of a one-step agent) are enqueued with
`runtime.start`, 500 in flight at a time as a web handler or a batch script would; then P
`tether worker` processes (what a user runs: `tether worker --app tether.bench.queue:make_runtime`)
drain them. `enqueue_per_s`: jobs enqueued per second; `drain_jobs_per_s`: jobs per second from
the workers' spawn (process start-up included) until every run is completed (`drain_wall_s`);
`drain_per_s`: jobs per second from the first job's checkpoint to the last (`drain_s`).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import tether

from .common import Result, StatusCounts, WorkerProcesses, bench_db, query

W4_JOBS, W4_WORKERS = 20_000, 4
W4_CONCURRENCY = 100  # tether worker's default
W4_ENQUEUE_CHUNK = 500  # runtime.start calls in flight at once
W4_DEADLINE = 600.0  # s for the drain before the workload gives up
APP = "tether.bench.queue:make_runtime"

job_agent = tether.Agent("bench_w4")


@job_agent.node(name="job", start=True)
async def job(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    return tether.finish()


def make_runtime() -> tether.Runtime:
    """The app the worker processes load (db: --db, else $TETHER_DB)."""
    return tether.Runtime(os.environ.get("TETHER_DB"), agents=[job_agent], version="bench")


async def w4(backend: str, jobs: int = W4_JOBS, workers: int = W4_WORKERS) -> list[Result]:
    tmp = Path(tempfile.mkdtemp(prefix="tether_bench_w4_"))
    try:
        async with bench_db(backend) as url:
            runtime = tether.Runtime(url, agents=[job_agent], version="bench")
            await runtime.migrate()
            async with runtime:
                await runtime.start(job_agent, {}, thread_id="warmup")  # connections, caches
                t0 = time.perf_counter()
                for lo in range(0, jobs, W4_ENQUEUE_CHUNK):
                    await asyncio.gather(*(
                        runtime.start(job_agent, {"i": i}, thread_id=f"w4-{i:06d}")
                        for i in range(lo, min(lo + W4_ENQUEUE_CHUNK, jobs))))
                enqueue = time.perf_counter() - t0
            with WorkerProcesses(url, APP, tmp) as procs:
                async with StatusCounts(url) as counts:
                    t1_unix, t1 = time.time(), time.perf_counter()
                    for _ in range(workers):
                        procs.start(concurrency=W4_CONCURRENCY)
                    t_done = await counts.until("completed", jobs + 1, t1 + W4_DEADLINE,
                                                "W4 drain", interval=0.02, check=procs.check)
                    procs.stop()
                    final = await counts.get()
            if final != {"completed": jobs + 1}:
                raise RuntimeError(f"W4: runs by status at the end: {final}")
            rows = await query(url, "SELECT min(finished_at), max(finished_at), "
                                    "count(DISTINCT worker) FROM checkpoints")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    first, last, used = float(rows[0][0]), float(rows[0][1]), int(rows[0][2])
    drain = t_done - t1

    def r(metric: str, value: float, unit: str) -> Result:
        return Result(backend, "W4", metric, value, unit)

    return [
        r("jobs", jobs, "count"),
        r("enqueue_s", round(enqueue, 3), "s"),
        r("enqueue_per_s", round(jobs / enqueue, 1), "1/s"),
        r("workers", workers, "count"),
        r("workers_that_ran_jobs", used, "count"),
        r("drain_wall_s", round(drain, 3), "s"),
        r("drain_jobs_per_s", round(jobs / drain, 1), "1/s"),
        r("first_job_s", round(first - t1_unix, 3), "s"),
        r("drain_s", round(last - first, 3), "s"),
        r("drain_per_s", round(jobs / (last - first), 1) if last > first else 0.0, "1/s"),
    ]
