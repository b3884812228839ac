"""Queue wait across processes: how long a run started in one process waits for a worker in
another to begin its first step (its `created_at` to its first checkpoint's `started_at`).
Runs are started one by one, a little apart, so each finds the worker idle: what a run started
through `tether serve` waits. On Postgres the worker hears of it through NOTIFY; on SQLite
through the file's change counter (tether.store.sqlite_watch), where it would otherwise wait
for the worker's poll (`poll_interval`, 0.25 s by default).

    python -m bench.queue_wait [--backend sqlite|postgres|both] [--runs 50]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys

from rich.console import Console
from rich.table import Table

import tether
from tether.bench.common import bench_db

agent = tether.Agent("echo")


@agent.node(start=True)
async def echo(state: dict[str, object], ctx: tether.Context) -> tether.Command:
    return tether.finish({})


WORKER = """
import asyncio, sys
import tether
agent = tether.Agent("echo")

@agent.node(start=True)
async def echo(state, ctx):
    return tether.finish({})

asyncio.run(tether.Runtime(sys.argv[1], agents=[agent]).work())
"""


async def measure(backend: str, runs: int) -> list[float]:
    """Each run's queue wait in ms, sorted."""
    async with bench_db(backend) as url:
        rt = tether.Runtime(url, agents=[agent])
        await rt.migrate()
        worker = await asyncio.create_subprocess_exec(sys.executable, "-c", WORKER, url)
        try:
            for _ in range(3000):  # up to 30 s for the worker to register
                if any(w.alive for w in await rt.workers()):
                    break
                await asyncio.sleep(0.01)
            else:
                raise RuntimeError("the worker did not register within 30 s")
            ids = []
            for i in range(runs):
                ids.append((await rt.start("echo", {}, thread_id=f"q{i:04d}")).thread_id)
                await asyncio.sleep(0.037)  # apart, and not in step with any poll
            waits = []
            for tid in ids:
                done = await asyncio.wait_for(rt.wait(tid), 30)
                first = (await rt.checkpoints(tid))[0]
                waits.append((first.started_at - done.created_at) * 1000)
            return sorted(waits)
        finally:
            worker.terminate()
            await asyncio.wait_for(worker.wait(), 30)
            await rt.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    ap.add_argument("--runs", type=int, default=50)
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    backends = ("sqlite", "postgres") if args.backend == "both" else (args.backend,)
    table = Table(title=f"queue wait across processes, {args.runs} runs one by one (ms)")
    for col in ("store", "median", "p90", "max"):
        table.add_column(col, justify="left" if col == "store" else "right")
    for backend in backends:
        waits = asyncio.run(measure(backend, args.runs))
        p90 = waits[min(len(waits) - 1, int(0.9 * len(waits)))]
        table.add_row(backend, f"{statistics.median(waits):.1f}", f"{p90:.1f}",
                      f"{waits[-1]:.1f}")
    Console().print(table)


if __name__ == "__main__":
    main()
