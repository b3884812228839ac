"""The dashboard on a big store: server time of its pages, p50 and p95 (issue 21).

    python -m bench.dashboard                         # both stores, full scale
    python -m bench.dashboard --backend postgres --scale 0.1
    python -m bench.dashboard --keep --pages updated  # reuse the stores of the last --keep run

Fills a fresh database in SQL (generate_series on Postgres, a recursive CTE on SQLite):
1,000,000 runs with 10 checkpoints each (10,000,000) on Postgres, 100,000 runs with 10 each
(1,000,000) on SQLite, times --scale, then vacuumed and analyzed; 2% of runs failed,
versions v1/v2, five agents, one run in 1,000 waiting on a pending interrupt, one in 10 with
an answered one, one in 10 with a done effect (one dead). The newest tenth is parked
(waiting), so no recent run is completed; the oldest hundredth is of agent `early` on version
v0, so neither has a recent run. Then a real worker
runs one run of 1,000 steps. Each page is served by the real app (create_app, in process, no
network) N times after a warm-up; the time is the request's, as the server spends it.
Reference, in the same run: the same pages on a store of 1,000 runs (the `ratio` column).
Goals: runs list, a filtered list and the inbox < 100 ms p95; the 1,000-step run < 200 ms.

--keep keeps the filled stores (Postgres databases tether_dash_<size>, SQLite files in
$TMPDIR/tether_dash/) and reuses them in the next --keep run: migrated to the checkout's
schema, their long run kept, so only the pages are measured again (--drop removes them).
--pages measures only the pages whose name contains that text.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx

import tether
from tether.bench.common import bench_db, pg_admin_url, pg_url
from tether.service.api import create_app

STEPS = 10


def fill_sql(dialect: str, runs: int, now: float) -> list[str]:
    """Runs r00000000.. created one a second up to `now`, with their checkpoints and
    interrupts (the state of a checkpoint here is an empty delta)."""
    parked, early = runs - runs // 10, runs // 100  # the newest tenth, the oldest hundredth
    status = (f"CASE WHEN i % 1000 = 7 OR i >= {parked} THEN 'waiting' WHEN i % 50 = 0 "
              f"THEN 'failed' ELSE 'completed' END")
    ask = f"CASE WHEN i % 1000 = 7 OR i >= {parked} THEN"
    agent = f"CASE WHEN i < {early} THEN 'early' ELSE 'a' || (i % 5) END"
    version = f"CASE WHEN i < {early} THEN 'v0' ELSE 'v' || (1 + i % 2) END"
    # An effect in every tenth run, done but for one dead in the oldest hundredth.
    effect = "CASE WHEN i = 1 THEN 'dead' ELSE 'done' END"
    ecols = ("thread_id, key, step, idx, name, payload, status, attempts, next_attempt_at, "
             "created_at, done_at")
    cols = ("thread_id, agent, version, status, node, step, input, input_hash, waiting_for, "
            "error, created_at, updated_at")
    if dialect == "postgres":
        tid = "'r' || lpad(i::text, 8, '0')"
        gen = f"generate_series(0, {runs - 1}) AS i"
        return [
            f"INSERT INTO runs ({cols}) SELECT {tid}, {agent}, {version}, "
            f"{status}, {ask} 'ask' END, {STEPS}, '\\x7b7d'::bytea, 'h', "
            f"{ask} 'interrupt' END, CASE WHEN i % 50 = 0 AND i % 1000 <> 7 AND i < {parked} "
            f"THEN convert_to('{{\"category\":\"exception\",\"type\":\"E\","
            f"\"message\":\"boom\"}}', 'UTF8') END, {now} - {runs} + i, {now} - {runs} + i "
            f"+ 5 FROM {gen}",
            f"INSERT INTO checkpoints (thread_id, step, node, next_node, kind, data, worker, "
            f"attempt, started_at, finished_at) SELECT {tid}, s, 'n', CASE WHEN s < {STEPS} "
            f"THEN 'n' END, CASE WHEN s = 1 THEN 's' ELSE 'd' END, CASE WHEN s = 1 THEN "
            f"'\\x7b7d'::bytea ELSE '\\x7b2273223a7b7d7d'::bytea END, 'w', 1, "
            f"{now} - {runs} + i, {now} - {runs} + i + 0.1 FROM {gen}, "
            f"generate_series(1, {STEPS}) AS s",
            f"INSERT INTO interrupts (thread_id, step, idx, id, payload, value, status, "
            f"created_at, resolved_at) SELECT {tid}, {STEPS} + 1, 0, 'i' || i, "
            f"'\\x7b7d'::bytea, CASE WHEN i % 1000 = 7 THEN NULL ELSE '\\x74727565'::bytea END,"
            f" CASE WHEN i % 1000 = 7 THEN 'pending' ELSE 'resolved' END, {now} - {runs} + i, "
            f"CASE WHEN i % 1000 = 7 THEN NULL ELSE {now} END FROM {gen} "
            f"WHERE i % 1000 = 7 OR i % 10 = 3",
            f"INSERT INTO outbox ({ecols}) SELECT {tid}, 'e', 3, 0, 'charge', '\\x7b7d'::bytea, "
            f"{effect}, 1, {now} - {runs} + i, {now} - {runs} + i, {now} - {runs} + i + 1 "
            f"FROM {gen} WHERE i % 10 = 1",
            # A settled store: without it, autovacuum's first pass over 10,000,000 fresh
            # checkpoints runs during the measurement, on the same two cores.
            "VACUUM ANALYZE",
        ]
    seq = f"WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < {runs - 1})"
    # SQLite's writers set idle_at and finished_at (Postgres computes them): waiting runs rest,
    # failed and completed ones are finished, each since its updated_at.
    updated = f"{now} - {runs} + i + 5"
    resting = (f", CASE WHEN {status} = 'waiting' THEN {updated} END, "
               f"CASE WHEN {status} = 'waiting' THEN NULL ELSE {updated} END")
    st = f"s(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM s WHERE k < {STEPS})"
    tid = "'r' || substr('00000000' || i, -8, 8)"
    return [
        f"{seq} INSERT INTO runs ({cols}, idle_at, finished_at) SELECT {tid}, {agent}, "
        f"{version}, {status}, {ask} 'ask' END, {STEPS}, x'7b7d', 'h', "
        f"{ask} 'interrupt' END, CASE WHEN i % 50 = 0 AND i % 1000 <> 7 AND i < {parked} "
        f"THEN CAST('{{\"category\":\"exception\",\"type\":\"E\",\"message\":\"boom\"}}' AS "
        f"BLOB) END, {now} - {runs} + i, {updated}{resting} FROM n",
        f"{seq}, {st} INSERT INTO checkpoints (thread_id, step, node, next_node, kind, data, "
        f"worker, attempt, started_at, finished_at) SELECT {tid}, k, 'n', CASE WHEN k < {STEPS}"
        f" THEN 'n' END, CASE WHEN k = 1 THEN 's' ELSE 'd' END, CASE WHEN k = 1 THEN x'7b7d' "
        f"ELSE x'7b2273223a7b7d7d' END, 'w', 1, {now} - {runs} + i, {now} - {runs} + i + 0.1 "
        f"FROM n, s",
        f"{seq} INSERT INTO interrupts (thread_id, step, idx, id, payload, value, status, "
        f"created_at, resolved_at) SELECT {tid}, {STEPS} + 1, 0, 'i' || i, x'7b7d', CASE WHEN "
        f"i % 1000 = 7 THEN NULL ELSE x'74727565' END, CASE WHEN i % 1000 = 7 THEN 'pending' "
        f"ELSE 'resolved' END, {now} - {runs} + i, CASE WHEN i % 1000 = 7 THEN NULL ELSE "
        f"{now} END FROM n WHERE i % 1000 = 7 OR i % 10 = 3",
        f"{seq} INSERT INTO outbox ({ecols}) SELECT {tid}, 'e', 3, 0, 'charge', x'7b7d', "
        f"{effect}, 1, {now} - {runs} + i, {now} - {runs} + i, {now} - {runs} + i + 1 "
        f"FROM n WHERE i % 10 = 1",
        "ANALYZE",
    ]


async def fill(url: str, runs: int) -> float:
    t0 = time.perf_counter()
    now = time.time()
    if url.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            for q in fill_sql("sqlite", runs, now):
                conn.execute(q)
            conn.commit()
        finally:
            conn.close()
    else:
        import psycopg

        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            for q in fill_sql("postgres", runs, now):
                await conn.execute(q.encode())
    return time.perf_counter() - t0


def long_agent() -> tether.Agent:
    agent = tether.Agent("long")

    @agent.node(start=True)
    async def tick(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
        n = int(state.get("n", 0)) + 1
        update = {"n": n, "seen": tether.append([n]), "last": {"step": ctx.step}}
        return tether.finish(update) if n >= 1000 else tether.goto("tick", update)

    return agent


async def long_run(rt: tether.Runtime) -> str:
    with contextlib.suppress(tether.RunNotFound):
        if (await rt.peek("long-run")).step == 1000:  # a kept store's
            return "long-run"
    stop = asyncio.Event()
    worker = asyncio.create_task(rt.work(concurrency=4, stop=stop))
    try:
        run = await rt.start("long", {}, thread_id="long-run")
        done = await rt.wait(run.thread_id, timeout=600)
        assert done.step == 1000, done.step
    finally:
        stop.set()
        await worker
    return run.thread_id


def pages(long_id: str, runs: int) -> dict[str, str]:
    middle = f"r{runs // 10 * 5 + 3:08d}"  # of agent a3, neither early nor parked
    return {
        "runs list": "/ui/runs",
        "filtered: failed on v1 (2%)": "/ui/runs?status=failed&version=v1",
        "filtered: failed on v2 (none)": "/ui/runs?status=failed&version=v2",
        "filtered: agent, created range": "/ui/runs?agent=a3&since=2000-01-01&until=2999-01-01",
        "filtered: thread_id prefix": "/ui/runs?prefix=r0001234",
        "runs list, oldest first": "/ui/runs?order=oldest",
        "runs list, latest updated": "/ui/runs?order=updated",
        "filtered: completed (none recent)": "/ui/runs?status=completed",
        "filtered: agent alone (only old runs)": "/ui/runs?agent=early",
        "filtered: version alone (only old runs)": "/ui/runs?version=v0",
        "filtered: waiting, latest updated": "/ui/runs?status=waiting&order=updated",
        "overview": "/ui",
        "effects (one dead)": "/ui/effects",
        "inbox": "/ui/interrupts",
        "run of 1,000 steps": f"/ui/runs/{long_id}",
        "metrics (hour and day)": "/ui/metrics",
        "agent page (a3)": "/ui/agents/a3",
        "agent page, one run's path": f"/ui/agents/a3?thread_id={middle}",
    }


GOALS = {"run of 1,000 steps": 200.0}


async def measure(url: str, runs: int, n: int, only: str | None) -> dict[str, tuple[float, float]]:
    rt = tether.Runtime(url, agents=[long_agent()], version="v1")
    try:
        long_id = await long_run(rt)
        app = create_app(rt)
        out: dict[str, tuple[float, float]] = {}
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
            for name, path in pages(long_id, runs).items():
                if only is not None and only not in name:
                    continue
                times = []
                for i in range(n + 3):
                    t0 = time.perf_counter()
                    r = await c.get(path)
                    took = (time.perf_counter() - t0) * 1000
                    assert r.status_code == 200, (path, r.status_code, r.text[-300:])
                    if i >= 3:  # warm-up: first reads of the cache, connection pool
                        times.append(took)
                times.sort()
                out[name] = (statistics.median(times), times[int(0.95 * (len(times) - 1))])
        return out
    finally:
        await rt.close()


KEPT = os.path.join(tempfile.gettempdir(), "tether_dash")
FILLED = "bench_dashboard_filled2"  # a kept store's mark: filled to the end, with how many runs


def kept_url(backend: str, size: int) -> str:
    if backend == "sqlite":
        return f"sqlite:///{os.path.join(KEPT, f'sqlite_{size}.db')}"
    return pg_url(f"tether_dash_{size}")


async def sql(url: str, query: str, admin: bool = False) -> list[tuple[Any, ...]]:
    if url.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            rows = conn.execute(query).fetchall()
            conn.commit()
            return rows
        finally:
            conn.close()
    import psycopg

    async with await psycopg.AsyncConnection.connect(pg_admin_url() if admin else url,
                                                     autocommit=True) as conn:
        cur = await conn.execute(query.encode())
        return list(await cur.fetchall()) if cur.description else []


@contextlib.asynccontextmanager
async def kept_db(backend: str, size: int) -> AsyncIterator[tuple[str, bool]]:
    """A kept store of `size` runs: (url, whether it is filled already). One left half
    filled by an interrupted run is emptied first."""
    url = kept_url(backend, size)
    name = url.rsplit("/", 1)[1]
    if backend == "sqlite":
        os.makedirs(KEPT, exist_ok=True)
    elif not await sql(url, f"SELECT 1 FROM pg_database WHERE datname = '{name}'", admin=True):
        await sql(url, f'CREATE DATABASE "{name}"', admin=True)
    try:
        filled = await sql(url, f"SELECT runs FROM {FILLED}") == [(size,)]
    except Exception:  # no such table: never filled to the end
        filled = False
    if not filled:
        await drop(backend, size)
        if backend == "postgres":
            await sql(url, f'CREATE DATABASE "{name}"', admin=True)
    yield url, filled
    if not filled:
        await sql(url, f"CREATE TABLE {FILLED} (runs INTEGER); INSERT INTO {FILLED} VALUES "
                       f"({size})" if backend == "postgres" else
                  f"CREATE TABLE {FILLED} AS SELECT {size} AS runs")


async def drop(backend: str, size: int) -> None:
    url = kept_url(backend, size)
    if backend == "sqlite":
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(url.removeprefix("sqlite:///") + suffix)
    else:
        name = url.rsplit("/", 1)[1]
        await sql(url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', admin=True)


@contextlib.asynccontextmanager
async def fresh_db(backend: str) -> AsyncIterator[tuple[str, bool]]:
    async with bench_db(backend) as url:
        yield url, False


async def one(backend: str, runs: int, n: int, keep: bool, only: str | None
              ) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    results = {}
    for label, size in (("reference", 1000), ("big", runs)):
        async with (kept_db(backend, size) if keep else fresh_db(backend)) as (url, filled):
            t0 = time.perf_counter()
            await tether.Runtime(url).migrate()
            if filled:
                print(f"# {backend}: {size:,} runs, {size * STEPS:,} checkpoints, kept "
                      f"(migrated in {time.perf_counter() - t0:.1f} s)", flush=True)
            else:
                fill_s = await fill(url, size)
                print(f"# {backend}: {size:,} runs, {size * STEPS:,} checkpoints filled in "
                      f"{fill_s:.1f} s", flush=True)
            results[label] = await measure(url, size, n, only)
    for name, (p50, p95) in results["big"].items():
        ref95 = results["reference"][name][1]
        goal = GOALS.get(name, 100.0)
        rows.append({"backend": backend, "page": name, "runs": runs, "p50_ms": p50,
                     "p95_ms": p95, "ref_p95_ms": ref95, "ratio": p95 / ref95, "goal_ms": goal,
                     "ok": p95 < goal})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    p.add_argument("--scale", type=float, default=1.0,
                   help="fraction of the full size (1,000,000 runs on Postgres, 100,000 on "
                        "SQLite, 10 checkpoints each)")
    p.add_argument("--requests", type=int, default=40, help="timed requests per page")
    p.add_argument("--keep", action="store_true",
                   help="keep the filled stores, and reuse those a --keep run left")
    p.add_argument("--drop", action="store_true", help="remove the kept stores, measure none")
    p.add_argument("--pages", default=None, help="only the pages whose name contains this")
    a = p.parse_args()
    if not 0 < a.scale <= 10 or a.requests < 2:
        p.error("--scale must be in (0, 10] and --requests at least 2")
    rows: list[dict[str, Any]] = []
    for backend in (["sqlite", "postgres"] if a.backend == "both" else [a.backend]):
        full = 1_000_000 if backend == "postgres" else 100_000
        size = max(1000, int(full * a.scale))
        if a.drop:
            for s in {1000, size}:
                asyncio.run(drop(backend, s))
            if backend == "sqlite" and os.path.isdir(KEPT) and not os.listdir(KEPT):
                shutil.rmtree(KEPT)
            continue
        rows += asyncio.run(one(backend, size, a.requests, a.keep, a.pages))
    if a.drop:
        return
    print("\n| store | runs | checkpoints | page | p50 ms | p95 ms | goal | "
          "p95 on 1,000 runs | ratio |")
    print("|---|---:|---:|---|---:|---:|---|---:|---:|")
    for r in rows:
        print(f"| {r['backend']} | {r['runs']:,} | {r['runs'] * STEPS:,} | {r['page']} | "
              f"{r['p50_ms']:.1f} | {r['p95_ms']:.1f} | "
              f"{'<' if r['ok'] else 'NOT <'} {r['goal_ms']:.0f} | {r['ref_p95_ms']:.1f} | "
              f"{r['ratio']:.2f}x |")


if __name__ == "__main__":
    main()
