"""Runs started in bursts over HTTP: another process POSTs N runs to a real `tether serve
--worker` (`--concurrency` requests in flight, one POST /runs each, or POST /runs:batch of
`--batch` runs), and the server's own worker runs them (W2's shape: 5 steps of 20 ms each).
Prints requests/s, the time until every run completed over the ideal (steps x sleep), and the
server's CPU per step; `--src` serves another checkout (before/after pairs).

    python -m bench.http_burst [--backend sqlite|postgres|both] [--runs 2000] [--batch 0]
    python -m bench.http_burst --src /path/to/other/checkout/src
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

import tether
from bench.streams import HEADERS, cpu_seconds, free_port, migrate, wait_up
from tether.bench.common import bench_db

STEPS, SLEEP = 5, 0.02
hop = tether.Agent("hop")


@hop.node(start=True)
async def step(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    await asyncio.sleep(SLEEP)
    n = state.get("n", 0) + 1
    return tether.finish({"n": n}) if n >= STEPS else tether.goto("step", {"n": n})


runtime = tether.Runtime(agents=[hop])
"""The app `tether serve --app bench.http_burst:runtime --worker` serves."""


async def _burst(base: str, runs: int, inflight: int, batch: int) -> float:
    """Seconds to have every run accepted."""
    limits = httpx.Limits(max_connections=inflight, max_keepalive_connections=inflight)
    async with httpx.AsyncClient(base_url=base, headers=HEADERS, limits=limits,
                                 timeout=120) as c:
        sem = asyncio.Semaphore(inflight)

        async def one(i: int) -> None:
            async with sem:
                if batch:
                    body = {"runs": [{"agent": "hop", "input": {"i": j}}
                                     for j in range(i, min(runs, i + batch))]}
                    r = await c.post("/runs:batch", json=body)
                else:
                    r = await c.post("/runs", json={"agent": "hop", "input": {"i": i}})
                if r.status_code not in (200, 201):
                    raise RuntimeError(f"{r.status_code}: {r.text[:200]}")

        began = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(0, runs, batch or 1)))
        return time.perf_counter() - began


async def measure(backend: str, runs: int, inflight: int, batch: int, src: Path | None,
                  serve_args: list[str]) -> dict[str, float]:
    async with bench_db(backend) as url:
        await migrate(url)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        root = Path(__file__).resolve().parents[1]
        paths = [str(src)] if src else []
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [*paths, str(root), os.environ.get("PYTHONPATH", "")])}
        env.pop("TETHER_TOKEN", None)
        with tempfile.TemporaryFile() as out:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tether", "serve", "--app", "bench.http_burst:runtime",
                "--db", url, "--port", str(port), "--worker", "--concurrency", str(runs),
                *serve_args,
                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            watcher = tether.Runtime(url)
            try:
                async with httpx.AsyncClient(base_url=base, headers=HEADERS) as c:
                    await wait_up(c, proc, out)
                cpu0 = cpu_seconds(proc.pid)
                began = time.perf_counter()
                try:
                    posted = await _burst(base, runs, inflight, batch)
                except Exception:
                    out.seek(0)
                    sys.stderr.write(out.read().decode(errors="replace")[-3000:])
                    raise
                while True:
                    counts = await watcher.status_counts()
                    done = sum(n for (status, _), n in counts.runs.items()
                               if status == "completed")
                    if done >= runs:
                        break
                    await asyncio.sleep(0.05)
                wall = time.perf_counter() - began
                cpu = cpu_seconds(proc.pid) - cpu0
            finally:
                await watcher.close()
                proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), 15)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
    return {"posted_s": posted, "requests_per_s": (runs / (batch or 1)) / posted,
            "runs_per_s": runs / posted, "wall_s": wall,
            "wall_over_ideal": wall / (STEPS * SLEEP),
            "server_cpu_us_per_step": cpu / (runs * STEPS) * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="both", choices=("sqlite", "postgres", "both"))
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--inflight", type=int, default=50, help="requests in flight at once")
    ap.add_argument("--batch", type=int, default=0,
                    help="runs per POST /runs:batch (0: one POST /runs per run)")
    ap.add_argument("--src", type=Path, help="serve this checkout's src/ instead")
    ap.add_argument("--serve-args", default="", help="more flags for tether serve")
    args = ap.parse_args()
    if args.runs < 1 or args.inflight < 1 or not 0 <= args.batch <= 10_000:
        ap.error("--runs and --inflight must be >= 1, --batch 0 to 10000")
    backends = ("sqlite", "postgres") if args.backend == "both" else (args.backend,)
    how = f"POST /runs:batch of {args.batch}" if args.batch else "one POST /runs each"
    table = Table(title=f"{args.runs} runs over HTTP ({how}, {args.inflight} in flight)")
    cols = ("posted_s", "requests_per_s", "runs_per_s", "wall_s", "wall_over_ideal",
            "server_cpu_us_per_step")
    table.add_column("store")
    for col in cols:
        table.add_column(col, justify="right")
    for backend in backends:
        r = asyncio.run(measure(backend, args.runs, args.inflight, args.batch, args.src,
                                args.serve_args.split()))
        table.add_row(backend, *(f"{r[c]:,.2f}" for c in cols))
    Console().print(table)


if __name__ == "__main__":
    main()
