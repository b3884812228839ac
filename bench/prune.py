"""Retention at scale: prune N finished runs of 10 steps each, and W2 beside a running prune.

    python -m bench.prune --backend postgres --runs 1000000
    python -m bench.prune --backend sqlite --runs 100000

Fills a fresh database in SQL (runs finished 40 days ago, 10 checkpoints and 10 journal rows
each: 21 rows a run), then `tether prune --completed 30d`: rows/s. Then W2 at 1,000 runs alone
and again while a prune of a second filled set runs against the same database, and prints the
ratio. Goals (issue 19): >= 50,000 rows/s on Postgres; W2 beside a prune within 10%.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import tether
from tether.bench.common import bench_db

DAY = 86400.0


def fill_sql(dialect: str, first: int, runs: int, steps: int) -> list[str]:
    old = time.time() - 40 * DAY
    if dialect == "postgres":
        gen = f"generate_series({first}, {first + runs - 1})"
        return [
            f"INSERT INTO runs (thread_id, agent, version, status, step, input, input_hash, "
            f"created_at, updated_at) SELECT 'p' || lpad(i::text, 8, '0'), 'a', 'v1', "
            f"'completed', {steps}, '\\x7b7d'::bytea, 'h', {old}, {old} FROM {gen} AS i",
            f"INSERT INTO checkpoints (thread_id, step, node, kind, data, worker, attempt, "
            f"started_at, finished_at) SELECT 'p' || lpad(i::text, 8, '0'), s, 'n', 'd', "
            f"'\\x7b7d'::bytea, 'w', 1, {old}, {old} FROM {gen} AS i, "
            f"generate_series(1, {steps}) AS s",
            f"INSERT INTO journal (thread_id, step, idx, name, result) SELECT "
            f"'p' || lpad(i::text, 8, '0'), s, 0, 'f', '\\x31'::bytea FROM {gen} AS i, "
            f"generate_series(1, {steps}) AS s",
            "ANALYZE",
        ]
    seq = (f"WITH RECURSIVE n(i) AS (SELECT {first} UNION ALL SELECT i + 1 FROM n "
           f"WHERE i < {first + runs - 1})")
    st = f"s(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM s WHERE k < {steps})"
    tid = "'p' || substr('00000000' || i, -8, 8)"
    return [
        f"{seq} INSERT INTO runs (thread_id, agent, version, status, step, input, input_hash, "
        f"created_at, updated_at) SELECT {tid}, 'a', 'v1', 'completed', {steps}, x'7b7d', 'h', "
        f"{old}, {old} FROM n",
        f"{seq}, {st} INSERT INTO checkpoints (thread_id, step, node, kind, data, worker, "
        f"attempt, started_at, finished_at) SELECT {tid}, k, 'n', 'd', x'7b7d', 'w', 1, {old}, "
        f"{old} FROM n, s",
        f"{seq}, {st} INSERT INTO journal (thread_id, step, idx, name, result) SELECT {tid}, "
        f"k, 0, 'f', x'31' FROM n, s",
    ]


async def fill(url: str, first: int, runs: int, steps: int) -> float:
    t0 = time.perf_counter()
    if url.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        for q in fill_sql("sqlite", first, runs, steps):
            conn.execute(q)
        conn.commit()
        conn.close()
    else:
        import psycopg

        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            for q in fill_sql("postgres", first, runs, steps):
                await conn.execute(q.encode())
    return time.perf_counter() - t0


@contextlib.asynccontextmanager
async def runtime(url: str, agents: list[tether.Agent]) -> AsyncIterator[tether.Runtime]:
    rt = tether.Runtime(url, agents=agents, version="bench")
    try:
        yield rt
    finally:
        await rt.close()


async def w2(url: str, runs: int, seed: int) -> float:
    """W2's shape: `runs` runs of 5 steps each sleeping 50-150 ms; wall / ideal."""
    import random

    agent = tether.Agent(f"w2_{seed}")

    @agent.node(start=True)
    async def step(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
        await asyncio.sleep(state["sleeps"][state.get("k", 0)])
        k = state.get("k", 0) + 1
        return tether.finish({"k": k}) if k == 5 else tether.goto("step", {"k": k})

    plans = []
    for i in range(runs):
        r = random.Random(i)
        plans.append([r.uniform(0.05, 0.15) for _ in range(5)])
    ideal = max(sum(p) for p in plans)
    async with runtime(url, [agent]) as rt:
        stop = asyncio.Event()
        worker = asyncio.create_task(rt.work(concurrency=runs, stop=stop, tune=True))
        t0 = time.perf_counter()
        started = [await rt.start(agent, {"sleeps": p}) for p in plans]
        await asyncio.gather(*(rt.wait(r.thread_id) for r in started))
        wall = time.perf_counter() - t0
        stop.set()
        await worker
    return wall / ideal


async def main(backend: str, runs: int, steps: int, w2_runs: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def result(metric: str, value: float, unit: str) -> None:
        row = {"system": "tether", "backend": backend, "workload": "P", "metric": metric,
               "value": round(value, 3), "unit": unit}
        out.append(row)
        print(json.dumps(row), flush=True)

    async with bench_db(backend) as url:
        await tether.Runtime(url).migrate()
        result("fill_s", await fill(url, 0, runs, steps), "s")
        async with runtime(url, []) as rt:
            report = await rt.prune(completed="30d")
        result("runs_pruned", report.runs, "count")
        result("rows_pruned", report.rows, "count")
        result("prune_s", report.seconds, "s")
        result("rows_per_s", report.rows / report.seconds, "1/s")
        # W2 alone, then W2 while another prune runs over a fresh set
        alone = await w2(url, w2_runs, 1)
        result("w2_wall_over_ideal_alone", alone, "x")
        await fill(url, runs, runs, steps)
        async with runtime(url, []) as rt:
            pruning = asyncio.create_task(rt.prune(completed="30d"))
            beside = await w2(url, w2_runs, 2)
            during = not pruning.done()
            report2 = await pruning
        result("w2_wall_over_ideal_during_prune", beside, "x")
        result("w2_during_vs_alone", beside / alone, "x")
        result("prune_still_running_at_w2_end", float(during), "bool")
        result("rows_per_s_beside_w2", report2.rows / report2.seconds, "1/s")
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    p.add_argument("--runs", type=int, default=100_000)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--w2-runs", type=int, default=1000)
    a = p.parse_args()
    rows = asyncio.run(main(a.backend, a.runs, a.steps, a.w2_runs))
    print("\n| metric | value | unit |\n|---|---:|---|")
    for r in rows:
        print(f"| {r['metric']} | {r['value']:,} | {r['unit']} |")
