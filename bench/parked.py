"""A million parked actors: N actor runs waiting on mail in one database, then mail to some of
them, and what an operator's tools cost at that size.

    python -m bench.parked [--backend postgres|sqlite] [--actors 1000000] [--mail 10000]
                           [--workers 2] [--reference 10000]

Phases, each timed:
1. park: `runtime.start_many` in batches of 10,000, then `--workers` `tether worker` processes
   run each actor's first step, which parks it (`tether.receive()`), until all N wait on mail;
2. idle memory: a fresh `tether worker` process on the database with N parked actors, its
   resident memory after it has polled for a while, beside the same on a database with only
   `--reference` parked actors (a worker's memory must not grow with the parked count);
3. mail: `runtime.send` to `--mail` actors picked at random; the time until every one of them
   has run its step and parked again (actors per second);
4. tools: `tether deploy status`, `tether advise --measure` (each a whole command, Python's
   start included) and the dashboard's pages through `tether serve` (p50/p95 of 20 requests
   each, after one warm-up); on a Postgres server whose autovacuum is off, `deploy status` and
   the pages again after `VACUUM (ANALYZE)` of the tables the phases churned, as autovacuum
   would have run by then.
Disk per parked actor is the database's size (tables and indexes) over N.
Goals: mail >= 10,000 actors/s; deploy status < 1 s; dashboard pages p95 < 100 ms; advise
--measure < 5 s; idle worker RSS with N parked within 10% (or 5 MiB) of the reference's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import tether
from tether.bench.common import StatusCounts, bench_db, percentile, pg_bytes, sqlite_bytes, sqlite_path

actor = tether.Agent("parked_actor")


@actor.node(start=True)
async def listen(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    """Parks until mail arrives; counts what it got and parks again."""
    return tether.receive({"got": int(state.get("got", 0)) + len(ctx.inbox)})


broadcaster = tether.Agent("parked_broadcaster")


@broadcaster.node(start=True)
async def broadcast(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    """Sends one message to each of state["to"], all committed with this one step."""
    for thread_id in state["to"]:
        ctx.send(thread_id, {"ping": thread_id})
    return tether.finish({"sent": len(state["to"])})


DB = os.environ.get("PARKED_DB", "sqlite:///parked.db")
runtime = tether.Runtime(DB, agents=[actor, broadcaster], version="v1")  # what `tether worker` runs

BATCH = 10_000
ROOT = Path(__file__).resolve().parents[1]
PAGES = ("/ui", "/ui/runs", "/ui/runs?status=waiting", "/ui/interrupts", "/ui/workers",
         "/ui/deployments", "/ui/metrics", "/ui/agents/parked_actor", "/ui/runs/{sample}")


def _env(url: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PARKED_DB": url, "PYTHONPATH": path}


def _tether(*args: str) -> list[str]:
    return [sys.executable, "-m", "tether", *args]


def _worker(url: str, concurrency: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        _tether("worker", "--app", "bench.parked:runtime", "--db", url,
                "--concurrency", str(concurrency)),
        env=_env(url), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _serve(url: str, port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(_tether("serve", "--db", url, "--port", str(port)), env=_env(url),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


async def _count(counts: StatusCounts, q: str) -> int:
    return sum((await counts.get(q)).values())


WAITING = "SELECT status, count(*) FROM runs WHERE status = 'waiting' GROUP BY status"


async def _until(counts: StatusCounts, q: str, n: int, what: str, timeout: float, console: Console,
                 every: float = 0.05) -> float:
    began = time.perf_counter()
    last = -1.0
    while True:
        got = await _count(counts, q)
        now = time.perf_counter()
        if got >= n:
            return now - began
        if now - began > timeout:
            raise RuntimeError(f"{what}: {got:,} of {n:,} after {timeout:g} s")
        if now - last >= 10:
            console.print(f"  {what}: {got:,} of {n:,} ({now - began:.0f} s)")
            last = now
        await asyncio.sleep(every)


async def park(url: str, n: int, workers: int, console: Console) -> tuple[float, float]:
    """Start n actors and run them until every one waits on mail: (start_s, park_s)."""
    rt = tether.Runtime(url, agents=[actor], version="v1")
    await rt.migrate()
    async with StatusCounts(url) as counts:  # what a run before this one started already
        first = await _count(counts, "SELECT 'all', count(*) FROM runs")
    began = time.perf_counter()
    try:
        for lo in range(first - first % BATCH, n, BATCH):
            await rt.start_many([{"agent": actor.name, "input": {},
                                  "thread_id": f"a{i:07d}"} for i in range(lo, min(n, lo + BATCH))])
            if lo and lo % 200_000 == 0:
                console.print(f"  started {lo:,} of {n:,}")
    finally:
        await rt.close()
    started = time.perf_counter() - began
    procs = [_worker(url, 2000) for _ in range(workers)]
    try:
        async with StatusCounts(url) as counts:
            # (a count of a large table: every second, not to slow the workers down)
            parked = await _until(counts, WAITING, n, "parked", 3600, console, every=1.0)
    finally:
        _stop(procs)
    return started, started + parked


async def idle_rss(url: str, settle_s: float) -> float:
    """A fresh worker's RSS after `settle_s` seconds of polling a database of parked actors."""
    proc = _worker(url, 2000)
    try:
        await asyncio.sleep(settle_s)
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited with {proc.returncode}")
        return _rss_mib(proc.pid)
    finally:
        _stop([proc])


async def mail(url: str, n: int, picks: int, workers: int, way: str,
               console: Console) -> tuple[float, float]:
    """Send one message to each of `picks` random parked actors, `way` "api" (runtime.send,
    1,000 at a time) or "step" (one broadcaster run's step sends them all, committed with its
    checkpoint): (send_s, processed_s), both from the first send (for "step", send_s is when
    the broadcaster finished)."""
    chosen = random.Random().sample(range(n), picks)  # (a new set on each run)
    procs = [_worker(url, 2000) for _ in range(workers)]
    rt = tether.Runtime(url, agents=[actor, broadcaster], version="v1")
    await asyncio.sleep(3)  # the workers are up and polling
    try:
        async with StatusCounts(url) as counts:
            ids = ",".join(f"'a{i:07d}'" for i in chosen)  # (the bench's own ids: no quoting)
            # Done when each chosen actor ran one more step and parked again.
            (before,) = (await counts.get(f"SELECT 'x', sum(step) FROM runs WHERE thread_id IN ({ids})"
                                          )).values()
            done_q = (f"SELECT 'x', CASE WHEN sum(step) >= {before + picks} AND "
                      f"sum(CASE WHEN status = 'waiting' THEN 0 ELSE 1 END) = 0 THEN count(*) ELSE 0 END "
                      f"FROM runs "
                      f"WHERE thread_id IN ({ids})")
            began = time.perf_counter()
            if way == "api":
                for lo in range(0, picks, 1000):
                    await asyncio.gather(*(rt.send(f"a{i:07d}", {"ping": i})
                                           for i in chosen[lo:lo + 1000]))
            else:
                run = await rt.start(broadcaster, {"to": [f"a{i:07d}" for i in chosen]})
                done = await rt.wait(run.thread_id, timeout=600)
                if done.status != "completed":
                    raise RuntimeError(f"the broadcaster ended {done.status}: {done.error}")
            sent = time.perf_counter() - began
            processed = sent + await _until(counts, done_q, picks, "mail processed", 600,
                                            console)
    finally:
        await rt.close()
        _stop(procs)
    return sent, processed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _timed(cmd: list[str], url: str) -> float:
    began = time.perf_counter()
    out = subprocess.run(cmd, env=_env(url), capture_output=True, text=True, timeout=300)
    took = time.perf_counter() - began
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[2:])} exited {out.returncode}: {out.stderr[-500:]}")
    return took


@contextlib.asynccontextmanager
async def served(url: str) -> AsyncIterator[str]:
    import httpx

    port = _free_port()
    proc = _serve(url, port)
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient() as client:
            for _ in range(300):
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"{base}/healthz")).status_code < 500:
                        break
                await asyncio.sleep(0.1)
        yield base
    finally:
        _stop([proc])


async def pages(url: str, n: int) -> dict[str, tuple[float, float]]:
    import httpx

    out: dict[str, tuple[float, float]] = {}
    async with served(url) as base, httpx.AsyncClient(base_url=base, timeout=60) as client:
        for page in PAGES:
            path = page.format(sample=f"a{n // 2:07d}")
            times = []
            for i in range(21):
                began = time.perf_counter()
                r = await client.get(path)
                took = time.perf_counter() - began
                if r.status_code != 200:
                    raise RuntimeError(f"GET {path}: {r.status_code} {r.text[:200]}")
                if i:  # the first is a warm-up
                    times.append(took * 1e3)
            out[path] = (percentile(times, 0.5), percentile(times, 0.95))
    return out


async def _vacuum_unless_autovacuum(url: str) -> float | None:
    """On a Postgres server without autovacuum, VACUUM (ANALYZE) the tables the phases churn:
    its seconds (None: autovacuum is on, nothing done)."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        row = await (await conn.execute(b"SHOW autovacuum")).fetchone()
        if row is not None and row[0] == "on":
            return None
        began = time.perf_counter()
        await conn.execute(b"VACUUM (ANALYZE) runs, checkpoints, mailbox")
        return time.perf_counter() - began


async def db_bytes(url: str) -> int:
    return await pg_bytes(url) if url.startswith("postgres") else sqlite_bytes(sqlite_path(url))


@contextlib.asynccontextmanager
async def _database(backend: str, keep: str | None) -> AsyncIterator[str]:
    if keep is None:
        async with bench_db(backend) as url:
            yield url
    else:
        yield keep


async def _parked(url: str) -> int:
    try:
        async with StatusCounts(url) as counts:
            return await _count(counts, WAITING)
    except Exception:  # no database yet, or no schema: nothing parked
        return 0


async def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("postgres", "sqlite"), default="postgres")
    p.add_argument("--actors", type=int, default=1_000_000)
    p.add_argument("--mail", type=int, default=10_000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--reference", type=int, default=10_000,
                   help="parked actors in the idle-memory reference database")
    p.add_argument("--keep-db", metavar="URL",
                   help="use this database and keep it: its actors are parked the first time, "
                        "later runs (e.g. after a change) measure the same database again")
    args = p.parse_args(argv)
    if args.mail > args.actors or args.reference > args.actors:
        p.error("--mail and --reference must not exceed --actors")
    console = Console(stderr=True)
    async with bench_db(args.backend) as ref_url:
        console.print(f"reference: parking {args.reference:,} actors")
        await park(ref_url, args.reference, args.workers, console)
        ref_rss = await idle_rss(ref_url, 10)
    async with _database(args.backend, args.keep_db) as url:
        start_s = park_s = math.nan
        if await _parked(url) >= args.actors:
            console.print(f"{url}: {args.actors:,} actors are parked already")
        else:
            console.print(f"parking {args.actors:,} actors ({args.workers} worker processes)")
            start_s, park_s = await park(url, args.actors, args.workers, console)
        size = await db_bytes(url)
        big_rss = await idle_rss(url, 10)
        figures = {}
        for way in ("step", "api"):
            console.print(f"mail to {args.mail:,} of them ({way})")
            figures[way] = await mail(url, args.actors, args.mail, args.workers, way, console)
        console.print("operator tools")
        status_s = _timed(_tether("deploy", "status", "--db", url), url)
        advise_s = _timed(_tether("advise", "--measure", "--db", url), url)
        page_ms = await pages(url, args.actors)
        # A server without autovacuum keeps every dead index entry the parks and wake-ups
        # left (a run's old versions in runs_open's queued and running ranges), and the pages
        # walk them; a production server's autovacuum removes them within a minute or so.
        vacuumed: dict[str, tuple[float, float]] = {}
        vacuum_s = None if args.backend != "postgres" else await _vacuum_unless_autovacuum(url)
        status2_s = math.nan
        if vacuum_s is not None:
            status2_s = _timed(_tether("deploy", "status", "--db", url), url)
            vacuumed = await pages(url, args.actors)

    table = Table(title=f"{args.actors:,} parked actors on {args.backend} "
                        f"({args.workers} worker processes)")
    for col in ("measure", "value", "goal"):
        table.add_column(col, overflow="fold")
    rows: list[tuple[str, str, str]] = [
        ("start_many, all actors", f"{start_s:.1f} s", ""),
        ("started and parked", f"{park_s:.1f} s ({args.actors / park_s:,.0f} actors/s)", ""),
        ("disk per parked actor", f"{size / args.actors:,.0f} bytes ({size / 2**20:,.0f} MiB)",
         ""),
        (f"idle worker RSS, {args.reference:,} parked", f"{ref_rss:.1f} MiB", "reference"),
        (f"idle worker RSS, {args.actors:,} parked",
         f"{big_rss:.1f} MiB ({big_rss / ref_rss:.2f}x)", "<= 1.10x or +5 MiB"),
    ]
    for way, label in (("step", "from one step (ctx.send)"), ("api", "by runtime.send")):
        send_s, mail_s = figures[way]
        rows += [(f"mail to {args.mail:,} {label}: sent", f"{send_s:.2f} s", ""),
                 (f"mail to {args.mail:,} {label}: all processed",
                  f"{mail_s:.2f} s ({args.mail / mail_s:,.0f} actors/s)", ">= 10,000 actors/s")]
    rows += [
        ("tether deploy status", f"{status_s:.2f} s", "< 1 s"),
        ("tether advise --measure", f"{advise_s:.2f} s", "< 5 s"),
    ]
    rows += [(f"GET {path} p50 / p95", f"{p50:.0f} / {p95:.0f} ms", "p95 < 100 ms")
             for path, (p50, p95) in page_ms.items()]
    if vacuumed:
        rows += [("VACUUM (ANALYZE) runs, checkpoints, mailbox (autovacuum is off here)",
                  f"{vacuum_s:.1f} s", ""),
                 ("then: tether deploy status", f"{status2_s:.2f} s", "< 1 s")]
        rows += [(f"then: GET {path} p50 / p95", f"{p50:.0f} / {p95:.0f} ms", "p95 < 100 ms")
                 for path, (p50, p95) in vacuumed.items()]
    for row in rows:
        table.add_row(*row)
    Console(width=100).print(table)


if __name__ == "__main__":
    asyncio.run(main())
