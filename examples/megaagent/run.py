"""Run the durable MegaAgent example and check that nothing was lost or consumed twice.

    python examples/megaagent/run.py --agents 1000                 # one in-process worker
    python examples/megaagent/run.py --agents 1000 --kill 2        # worker subprocess, SIGKILLed
                                                                   # twice mid-way and restarted
    python examples/megaagent/run.py --db postgresql://postgres@127.0.0.1/mega --agents 1000
    python examples/megaagent/run.py --db postgresql://postgres@127.0.0.1/mega \\
        --agents 100000 --workers 4 --progress 30                  # 4 `tether worker` processes

With --workers N this process only starts the boss run and waits for it: N `tether worker`
subprocesses share the database and do all the work (--kill K then SIGKILLs one of them, in
turn, K times mid-way and restarts it). Each worker process's peak RSS is its ru_maxrss as
reported by wait4() when it exits (SIGKILLed ones included).

After the boss finishes, the script checks the answers (every worker's score reached its admin
once and every group's summary the boss) and audits the mailbox table: exactly the messages
the protocol sends, none sent twice, each consumed except admin-channel notes that reach
admins who had already finished. It exits non-zero otherwise. The last line is a dict of
figures (wall_s, messages, messages_per_s, peak_rss_mib, db_bytes, ...).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import orjson

HERE = os.path.dirname(os.path.abspath(__file__))


def shape(agents: int) -> tuple[int, list[int]]:
    """(groups, workers in each group) for exactly `agents` agents in all (the boss, one admin
    per group and the workers; groups differ by at most one worker)."""
    groups = max(1, round(agents ** 0.5 / 3))
    workers = agents - 1 - groups
    return groups, [workers // groups + (g < workers % groups) for g in range(groups)]


class WorkerProcess:
    """One `tether worker` subprocess running app:runtime against `db`."""

    def __init__(self, slot: int, db: str, concurrency: int, lease_ttl: float,
                 pool_timeout: float) -> None:
        # (the caller's PYTHONPATH kept after ours: a checkout's src/ runs in the workers too)
        path = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "MEGA_DB": db, "PYTHONPATH": path, "MEGA_LEASE_TTL": str(lease_ttl),
               "MEGA_PG_POOL_TIMEOUT": str(pool_timeout)}
        self.slot = slot
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tether", "worker", "--app", "app:runtime", "--db", db,
             "--concurrency", str(concurrency), "--lease-ttl", str(lease_ttl)],
            env=env, stdout=subprocess.DEVNULL)

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def stop(self, sig: signal.Signals, timeout: float = 60) -> dict[str, Any]:
        """Send `sig`, reap the process with wait4 (SIGKILL after `timeout` seconds) and
        return what it cost: its peak RSS (ru_maxrss), CPU seconds and how it ended."""
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
        deadline = time.monotonic() + timeout
        ended = "SIGKILL" if sig == signal.SIGKILL else ""
        while True:
            pid, status, usage = os.wait4(self.pid, os.WNOHANG)  # noqa: ASYNC222 (no wait)
            if pid:
                break
            if time.monotonic() > deadline:
                print(f"worker {self.pid} did not exit {timeout:g} s after {sig.name}: "
                      "SIGKILL", file=sys.stderr, flush=True)
                self.proc.kill()
                ended, deadline = f"SIGKILL after {sig.name} timed out", float("inf")
            await asyncio.sleep(0.02)
        self.proc.returncode = code = os.waitstatus_to_exitcode(status)
        return {"slot": self.slot, "pid": self.pid, "ended": ended or f"exit {code}",
                "alive_s": round(time.perf_counter() - self.started, 1),
                "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
                "peak_rss_mib": round(usage.ru_maxrss / 1024, 1)}


async def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--agents", type=int, default=1000,
                   help="agents in all: the boss, the admins and the workers (at least 3)")
    p.add_argument("--db", default=os.environ.get("MEGA_DB"),
                   help="a database without runs (default: megaagent.db here, made afresh "
                        "each run)")
    p.add_argument("--workers", type=int, default=0,
                   help="N `tether worker` subprocesses do the work (default: one in-process "
                        "worker; one subprocess with --kill)")
    p.add_argument("--kill", type=int, default=0,
                   help="SIGKILL a worker subprocess K times mid-way (one of them, in turn)")
    p.add_argument("--concurrency", type=int, default=None,
                   help="runs in flight per worker (default 2000 in-process, 200 per worker "
                        "process: on Postgres, 4 x 2000 runs queue for 4 x 10 pooled "
                        "connections, time out and deadlock at 30,000 agents)")
    p.add_argument("--lease-ttl", type=float, default=None,
                   help="worker subprocesses' lease TTL (default 2 s with --kill, so that a "
                        "killed worker's runs come back soon; else 30 s: at 100,000 agents on "
                        "Postgres a heartbeat can wait seconds for a pooled connection)")
    p.add_argument("--pool-timeout", type=float, default=60,
                   help="worker subprocesses' wait for a pooled Postgres connection (s)")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--progress", type=float, default=0,
                   help="print runs by status every this many seconds (0: never)")
    args = p.parse_args(argv)
    if args.workers < 0 or args.kill < 0:
        p.error("--workers and --kill must be >= 0")
    if args.agents < 3:
        p.error("--agents must be >= 3 (a boss, an admin and a worker)")
    if args.db is None:
        args.db = "sqlite:///megaagent.db"
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.remove("megaagent.db" + suffix)
    workers = args.workers or (1 if args.kill else 0)
    if args.concurrency is None:
        args.concurrency = 200 if workers else 2000
    lease_ttl = args.lease_ttl or (2.0 if args.kill else 30.0)
    os.environ["MEGA_DB"] = args.db
    sys.path.insert(0, HERE)
    import app

    from tether.store.base import TERMINAL

    runtime = app.runtime
    groups, sizes = shape(args.agents)
    total_agents = 1 + groups + sum(sizes)
    await runtime.migrate()
    async with runtime:
        if await runtime.list_runs(limit=1):
            raise SystemExit(f"--db {args.db} already holds runs: the checks count every run "
                             "and message in it, so give a fresh database")
    procs: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    async with runtime:
        run = await runtime.start(app.boss, {"groups": groups, "sizes": sizes})
        size = f"{min(sizes)}" if min(sizes) == max(sizes) else f"{min(sizes)}-{max(sizes)}"
        print(f"boss {run.thread_id}: {groups} groups of {size} workers = {total_agents} agents"
              + (f" on {workers} worker process{'es' if workers != 1 else ''}"
                 if workers else ""), flush=True)
        reporter = (asyncio.create_task(report_progress(args.db, args.progress, t0))
                    if args.progress > 0 else None)
        kills = 0
        try:
            if workers:
                final, kills = await with_subprocesses(args, workers, lease_ttl, runtime,
                                                       run.thread_id, total_agents, procs)
            else:
                stop = asyncio.Event()
                work = asyncio.create_task(runtime.work(concurrency=args.concurrency, stop=stop))
                try:
                    final = await runtime.wait(run.thread_id, timeout=args.timeout)
                finally:
                    stop.set()
                    await work
        finally:
            if reporter is not None:
                reporter.cancel()
        wall = time.perf_counter() - t0
        # Verify: every worker's answer reached its admin once and every summary the boss.
        expected = 0
        admins = final.state["admins"]
        for a in admins:
            arun = await runtime.get(a)
            for w in arun.state["members"]:
                expected += app.expected_score(arun.state["task"], w)
        assert final.status == "completed", final.error
        assert final.state["results"] == sum(sizes), final.state["results"]
        assert final.state["total"] == expected, (final.state["total"], expected)
        runs = await runtime.list_runs(limit=10_000_000)
        assert len(runs) == total_agents, (len(runs), total_agents)
        assert all(r.status in TERMINAL for r in runs), Counter(r.status for r in runs)
    messages = audit_mailbox(args.db, groups, sum(sizes))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child_rss = max((w["peak_rss_mib"] for w in procs), default=0.0)
    stats = run_stats(args.db)
    result: dict[str, Any] = {
        "agents": total_agents, "groups": groups, "workers_per_group": max(sizes),
        "wall_s": round(wall, 2), "messages": messages,
        "messages_per_s": round(messages / wall, 1),
        "peak_rss_mib": round(max(rss, child_rss), 1), "kills": kills,
        "db_bytes": db_bytes(args.db), "worker_processes": workers,
        "coordinator_rss_mib": round(rss, 1), **stats}
    if workers:
        result["workers"] = procs
        result["worker_peak_rss_mib"] = round(child_rss, 1)
        result["worker_rss_sum_mib"] = round(sum(
            w["peak_rss_mib"] for w in procs if w["ended"] != "SIGKILL"), 1)
    print(f"OK: all {total_agents} agents finished, every result counted once "
          f"(total score {final.state['total']}).", flush=True)
    print(result, flush=True)
    return result


async def with_subprocesses(args: argparse.Namespace, n: int, lease_ttl: float, runtime: Any,
                            boss: str, total_agents: int, procs: list[dict[str, Any]],
                            ) -> tuple[Any, int]:
    """Run the boss to completion on `n` worker subprocesses, SIGKILLing one of them (in turn)
    `args.kill` times mid-way and restarting it. Appends each process's figures to `procs`."""
    # SIGTERM or SIGINT (even where a shell made background jobs ignore it) cancels the wait,
    # so that the `finally` below stops the workers instead of orphaning them.
    loop, me = asyncio.get_running_loop(), asyncio.current_task()
    assert me is not None
    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        loop.add_signal_handler(sig, me.cancel)
    pool = [WorkerProcess(i, args.db, args.concurrency, lease_ttl, args.pool_timeout) for i in range(n)]
    kills = last_done = 0
    try:
        while kills < args.kill:
            # Kill when a growing share of the agents has finished: mid-way, at any scale
            # (and only once the restarted worker has made progress of its own).
            target = total_agents * (kills + 1) // (args.kill + 2)
            while True:
                await asyncio.sleep(0.05)
                try:
                    done = await asyncio.to_thread(count_completed, args.db)
                except Exception as exc:  # e.g. too many connections: poll again
                    print(f"counting completed runs failed: {exc!r}", file=sys.stderr)
                    continue
                if done >= target and done > last_done:
                    break
            last_done = done
            slot = kills % n
            procs.append(await pool[slot].stop(signal.SIGKILL))
            kills += 1
            print(f"SIGKILLed the worker ({kills}/{args.kill}); {done} runs completed so far; "
                  "restarting it", flush=True)
            pool[slot] = WorkerProcess(slot, args.db, args.concurrency, lease_ttl,
                                       args.pool_timeout)
        final = await runtime.wait(boss, timeout=args.timeout)
    finally:
        # SIGTERM: each worker stops claiming, finishes or releases its leases, and exits.
        procs.extend(await asyncio.gather(*(w.stop(signal.SIGTERM) for w in pool)))
        for sig in signals:
            loop.remove_signal_handler(sig)
    return final, kills


# -- reading the database from outside ---------------------------------------------------------

def query(db: str, sql: str) -> list[tuple[Any, ...]]:
    """Rows of one read-only statement, on a connection of its own."""
    if db.startswith("sqlite"):
        from tether.store.sqlite import parse_sqlite_url

        conn = sqlite3.connect(parse_sqlite_url(db)[0], timeout=60)
        try:
            return conn.execute(sql).fetchall()
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(db) as pg:
        return pg.execute(sql.encode()).fetchall()


def count_completed(db: str) -> int:
    return int(query(db, "SELECT count(*) FROM runs WHERE status = 'completed'")[0][0])


async def report_progress(db: str, every: float, t0: float) -> None:
    while True:
        await asyncio.sleep(every)
        try:
            rows = await asyncio.to_thread(
                query, db, "SELECT status, count(*) FROM runs GROUP BY status ORDER BY status")
            mail = await asyncio.to_thread(
                query, db, "SELECT count(*), count(consumed_step) FROM mailbox")
        except Exception as exc:  # e.g. too many connections: report it, try again later
            print(f"[{time.perf_counter() - t0:7.1f} s] progress query failed: {exc!r}",
                  flush=True)
            continue
        print(f"[{time.perf_counter() - t0:7.1f} s] runs: "
              + ", ".join(f"{s} {n}" for s, n in rows)
              + f"; mail sent {mail[0][0]}, consumed {mail[0][1]}", flush=True)


def audit_mailbox(db: str, groups: int, workers: int) -> int:
    """Check the mailbox table against the protocol; returns the number of messages.

    Per group: one "ready" per worker, one "task" to each worker (group chat), one "result"
    per worker, one summary to the boss, and a "note" to each other admin. No (sender,
    recipient, kind) twice; every message consumed except notes to admins already done."""
    rows = query(db, "SELECT thread_id, sender, message, consumed_step FROM mailbox")
    kinds: Counter[str] = Counter()
    pairs: Counter[tuple[str, str | None, str]] = Counter()
    unconsumed = []
    for thread_id, sender, message, consumed in rows:
        kind = orjson.loads(bytes(message)).get("kind", "summary")
        kinds[kind] += 1
        pairs[(thread_id, sender, kind)] += 1
        if consumed is None and kind != "note":
            unconsumed.append((thread_id, sender, kind))
    n = workers
    want = {"ready": n, "task": n, "result": n, "summary": groups, "note": groups * (groups - 1)}
    assert dict(kinds) == {k: v for k, v in want.items() if v}, (dict(kinds), want)
    twice = [k for k, c in pairs.items() if c > 1]
    assert not twice, f"{len(twice)} messages sent twice, e.g. {twice[:3]}"
    assert not unconsumed, f"{len(unconsumed)} messages never consumed, e.g. {unconsumed[:3]}"
    return len(rows)


def run_stats(db: str) -> dict[str, int]:
    """Committed steps (checkpoints) and claims (the sum of fencing epochs: one per claim;
    more claims than runs + wake-ups means runs were re-claimed after a lost lease)."""
    steps = query(db, "SELECT count(*) FROM checkpoints")[0][0]
    claims = query(db, "SELECT coalesce(sum(epoch), 0) FROM runs")[0][0]
    return {"steps": int(steps), "claims": int(claims)}


def db_bytes(db: str) -> int:
    if db.startswith("sqlite"):
        from tether.store.sqlite import parse_sqlite_url

        path = parse_sqlite_url(db)[0]
        return sum(os.path.getsize(path + s) for s in ("", "-wal") if os.path.exists(path + s))
    return int(query(db, "SELECT pg_database_size(current_database())")[0][0])


if __name__ == "__main__":
    asyncio.run(main())
