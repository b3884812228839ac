"""A burst of starts: `runtime.start_many` of N runs against the same N started concurrently
with `runtime.start` (asyncio.gather, the fastest way without a batch) and one by one, each on
a fresh database of each store, in one run of this script (ratios are to the one-by-one
figure measured beside it). Goal (issue 35): 10,000 starts <= 0.5 s on both stores.

    python -m bench.startmany [--backend sqlite|postgres|both] [--runs 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable

from rich.console import Console
from rich.table import Table

import tether
from tether.bench.common import bench_db

agent = tether.Agent("echo")


@agent.node(start=True)
async def echo(state: dict[str, object], ctx: tether.Context) -> tether.Command:
    return tether.finish({})


def _many(rt: tether.Runtime, n: int) -> Awaitable[object]:
    return rt.start_many([{"agent": "echo", "input": {"i": i}} for i in range(n)])


async def _gathered(rt: tether.Runtime, n: int) -> object:
    return await asyncio.gather(*(rt.start("echo", {"i": i}) for i in range(n)))


async def _one_by_one(rt: tether.Runtime, n: int) -> object:
    for i in range(n):
        await rt.start("echo", {"i": i})
    return None


WAYS: dict[str, Callable[[tether.Runtime, int], Awaitable[object]]] = {
    "one by one (start)": _one_by_one, "gathered (start)": _gathered, "start_many": _many}


async def measure(backend: str, way: str, runs: int) -> float:
    async with bench_db(backend) as url:
        rt = tether.Runtime(url, agents=[agent])
        try:
            await rt.migrate()
            await rt.start("echo", {})  # connections open, queries prepared
            began = time.perf_counter()
            await WAYS[way](rt, runs)
            return time.perf_counter() - began
        finally:
            await rt.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    ap.add_argument("--runs", type=int, default=10_000)
    args = ap.parse_args()
    if not 1 <= args.runs <= 10_000:
        ap.error("--runs must be 1 to 10000 (start_many's batch limit)")
    backends = ("sqlite", "postgres") if args.backend == "both" else (args.backend,)
    table = Table(title=f"{args.runs} starts (s; ratio to one by one, same run)")
    for col in ("store", "way", "seconds", "starts/s", "ratio"):
        table.add_column(col, justify="left" if col in ("store", "way") else "right")
    for backend in backends:
        ref = None
        for way in WAYS:
            took = asyncio.run(measure(backend, way, args.runs))
            ref = ref or took
            table.add_row(backend, way, f"{took:.3f}", f"{args.runs / took:,.0f}",
                          f"{took / ref:.3f}")
    Console().print(table)


if __name__ == "__main__":
    main()
