"""Run the durable MegaAgent example and check that nothing was lost or consumed twice.

    python examples/megaagent/run.py --agents 1000                 # one in-process worker
    python examples/megaagent/run.py --agents 1000 --kill 2        # worker subprocess, SIGKILLed
                                                                   # twice mid-way and restarted
    python examples/megaagent/run.py --db postgresql://postgres@127.0.0.1/mega --agents 1000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import signal
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def shape(agents: int) -> tuple[int, int]:
    """(groups, workers per group) for about `agents` agents in all (boss + admins + workers)."""
    groups = max(1, round(agents ** 0.5 / 3))
    per_group = max(1, (agents - 1 - groups) // groups)
    return groups, per_group


def start_worker(db: str, concurrency: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "MEGA_DB": db, "PYTHONPATH": HERE, "MEGA_LEASE_TTL": "2"}
    return subprocess.Popen(
        [sys.executable, "-m", "tether", "worker", "--app", "app:runtime", "--db", db,
         "--concurrency", str(concurrency)], env=env, stdout=subprocess.DEVNULL)


async def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--agents", type=int, default=1000)
    p.add_argument("--db", default=os.environ.get("MEGA_DB", "sqlite:///megaagent.db"))
    p.add_argument("--kill", type=int, default=0, help="SIGKILL a worker subprocess N times")
    p.add_argument("--concurrency", type=int, default=2000)
    p.add_argument("--timeout", type=float, default=600)
    args = p.parse_args(argv)
    os.environ["MEGA_DB"] = args.db
    sys.path.insert(0, HERE)
    import app

    from tether.store.base import TERMINAL

    runtime = app.runtime
    groups, per_group = shape(args.agents)
    total_agents = 1 + groups + groups * per_group
    await runtime.migrate()
    t0 = time.perf_counter()
    async with runtime:
        run = await runtime.start(app.boss, {"groups": groups, "workers_per_group": per_group})
        print(f"boss {run.thread_id}: {groups} groups x {per_group} workers = {total_agents} agents",
              flush=True)
        kills = last_done = 0
        if args.kill or "--subprocess" in sys.argv:
            proc = start_worker(args.db, args.concurrency)
            try:
                while kills < args.kill:
                    # Kill when a growing share of the agents has finished: mid-way, at any scale.
                    # (and only once the restarted worker has made progress of its own).
                    target = total_agents * (kills + 1) // (args.kill + 2)
                    while True:
                        await asyncio.sleep(0.05)
                        done = len(await runtime.list_runs(status="completed", limit=1_000_000))
                        if done >= target and done > last_done:
                            break
                    last_done = done
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                    kills += 1
                    print(f"SIGKILLed the worker ({kills}/{args.kill}); {done} runs completed so "
                          "far; restarting it", flush=True)
                    proc = start_worker(args.db, args.concurrency)
                final = await runtime.wait(run.thread_id, timeout=args.timeout)
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
        else:
            stop = asyncio.Event()
            work = asyncio.create_task(runtime.work(concurrency=args.concurrency, stop=stop))
            try:
                final = await runtime.wait(run.thread_id, timeout=args.timeout)
            finally:
                stop.set()
                await work
        wall = time.perf_counter() - t0
        # Verify: every worker's answer reached its admin once and every summary the boss.
        expected = 0
        admins = final.state["admins"]
        for a in admins:
            arun = await runtime.get(a)
            for w in arun.state["members"]:
                expected += app.expected_score(arun.state["task"], w)
        assert final.status == "completed", final.error
        assert final.state["results"] == groups * per_group, final.state["results"]
        assert final.state["total"] == expected, (final.state["total"], expected)
        runs = await runtime.list_runs(limit=1_000_000)
        assert len(runs) == total_agents and all(r.status in TERMINAL for r in runs)
    messages = await count_messages(args.db)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    result = {"agents": total_agents, "groups": groups, "workers_per_group": per_group,
              "wall_s": round(wall, 2), "messages": messages,
              "messages_per_s": round(messages / wall, 1),
              "peak_rss_mib": round(max(rss, child_rss), 1), "kills": kills,
              "db_bytes": db_bytes(args.db)}
    print(f"OK: all {total_agents} agents finished, every result counted once "
          f"(total score {final.state['total']}).", flush=True)
    print(result, flush=True)
    return result


async def count_messages(db: str) -> int:
    if db.startswith("sqlite"):
        import sqlite3

        from tether.store.sqlite import parse_sqlite_url

        conn = sqlite3.connect(parse_sqlite_url(db)[0])
        try:
            return int(conn.execute("SELECT count(*) FROM mailbox").fetchone()[0])
        finally:
            conn.close()
    import psycopg

    async with await psycopg.AsyncConnection.connect(db) as conn:
        cur = await conn.execute("SELECT count(*) FROM mailbox")
        row = await cur.fetchone()
        return int(row[0]) if row else 0


def db_bytes(db: str) -> int:
    if db.startswith("sqlite"):
        from tether.store.sqlite import parse_sqlite_url

        path = parse_sqlite_url(db)[0]
        return sum(os.path.getsize(path + s) for s in ("", "-wal") if os.path.exists(path + s))
    import psycopg

    with psycopg.connect(db) as conn:
        row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
        return int(row[0]) if row else 0


if __name__ == "__main__":
    asyncio.run(main())
