"""Retention at scale: prune N finished runs of 10 steps each, and W2 beside a running prune.

    python -m bench.prune --backend postgres --runs 1000000
    python -m bench.prune --backend sqlite --runs 100000
    python -m bench.prune --backend postgres --runs 1000000 --reuse-fill --rounds 0
    python -m bench.prune --backend postgres --runs 0 --rounds 5

Fills a fresh database in set-based SQL, in chunks, with rows shaped as a real run of STEPS
steps writes them (one run row, a checkpoint and a journal entry per step: 21 rows a run;
tests/integration/test_bench_prune.py compares them with a real run's), finished 40 days
ago; then `tether prune --completed 30d`: rows/s, and the database's bytes before and after
(SQLite: the file and its WAL, with the runtime closed). Then W2 at 1,000 runs, alternately
alone and while a `tether prune` process works through a second filled set, ROUNDS times
each: W2 beside a prune over W2 alone (the median of each side). Goals (issue 19):
>= 50,000 rows/s on Postgres; W2 beside a prune within 10% of W2 alone.

--reuse-fill keeps the filled database (before its prune) as a template named after its size,
the fill's SQL and the schema, and later runs with the same ones start from a copy of it
(Postgres: CREATE DATABASE ... TEMPLATE, a file copy; SQLite: the file), not a new fill.
--runs 0 skips the first prune, --rounds 0 the W2 rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import tether
from tether.bench.checkpoint import w2_agent, w2_delays
from tether.bench.common import bench_db, pg_admin_url, pg_bytes, sqlite_bytes, sqlite_path

DAY = 86400.0
CHUNK = 100_000
"""Runs per set-based fill statement (one transaction each)."""
STEP_S = 0.01
"""Seconds between a filled run's steps (its times look like a run's, not all equal)."""


def fill_sql(dialect: str, first: int, runs: int, steps: int, old: float) -> list[str]:
    """Statements that insert runs first..first+runs-1 as completed runs of `steps` steps with
    one journaled call each, created at `old` (+1 ms per run). Shapes as a real run's rows:
    a 32-hex thread_id (md5, so in no particular order), the input as bytes and its hash, epoch
    1, each checkpoint a delta naming the next node (none after the last), one journal entry."""
    pg = dialect == "postgres"
    last = first + runs - 1
    i_runs = f"generate_series({first}, {last}) AS i" if pg else "n"
    i_steps = f"generate_series(1, {steps}) AS s" if pg else "st"
    seq = "" if pg else (
        f"WITH RECURSIVE n(i) AS (SELECT {first} UNION ALL SELECT i + 1 FROM n WHERE i < {last}),"
        f" st(s) AS (SELECT 1 UNION ALL SELECT s + 1 FROM st WHERE s < {steps}) ")
    blob = ("convert_to({}, 'UTF8')" if pg else "CAST({} AS BLOB)").format
    tid = "md5('bench' || i)"
    input_text = """'{"i":' || i || '}'"""
    delta_text = """'{"s":{"k":' || s || '}}'"""
    one = blob("'1'")
    created = f"({old} + i * 0.001)"
    finished = "" if pg else ", finished_at"  # (Postgres computes it; SQLite's writers set it)
    return [
        f"{seq}INSERT INTO runs (thread_id, agent, version, status, node, step, attempt, "
        f"failures, input, input_hash, epoch, created_at, updated_at{finished}) "
        f"SELECT {tid}, 'bench', 'v1', 'completed', NULL, {steps}, 0, 0, "
        f"{blob(input_text)}, md5({input_text}), 1, {created}, {created} + {steps * STEP_S}"
        f"{finished and f', {created} + {steps * STEP_S}'} FROM {i_runs}",
        f"{seq}INSERT INTO checkpoints (thread_id, step, node, next_node, kind, data, worker, "
        f"attempt, started_at, finished_at) "
        f"SELECT {tid}, s, 'step', CASE WHEN s < {steps} THEN 'step' END, 'd', "
        f"{blob(delta_text)}, "
        f"'bench-host:4242:a1b2c3', 1, {created} + (s - 1) * {STEP_S} + 0.001, "
        f"{created} + s * {STEP_S} FROM {i_runs}, {i_steps}",
        f"{seq}INSERT INTO journal (thread_id, step, idx, name, result) "
        f"SELECT {tid}, s, 0, 'app.agent.step.<locals>.fetch', {one} "
        f"FROM {i_runs}, {i_steps}",
    ]


def _md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


async def fill(url: str, first: int, runs: int, steps: int) -> float:
    """Fill runs first..first+runs-1 (see fill_sql) in chunks; seconds taken."""
    t0 = time.perf_counter()
    old = time.time() - 40 * DAY
    chunks = [(a, min(CHUNK, first + runs - a)) for a in range(first, first + runs, CHUNK)]
    dialect = "sqlite" if url.startswith("sqlite") else "postgres"
    if dialect == "sqlite":
        import sqlite3

        conn = sqlite3.connect(sqlite_path(url), isolation_level=None)
        conn.create_function("md5", 1, _md5, deterministic=True)
        for a, n in chunks:
            conn.execute("BEGIN IMMEDIATE")
            for q in fill_sql(dialect, a, n, steps, old):
                conn.execute(q)
            conn.execute("COMMIT")
        conn.close()
    else:
        import psycopg

        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as pg:
            for a, n in chunks:
                async with pg.transaction():
                    for q in fill_sql(dialect, a, n, steps, old):
                        await pg.execute(q.encode())
            await pg.execute(b"VACUUM ANALYZE runs, checkpoints, journal")
    return time.perf_counter() - t0


SQL = Path(tether.__file__).parent / "store" / "sql"


def fill_name(dialect: str, runs: int, steps: int) -> str:
    """The kept fill's name: its size, and a hash of the fill's SQL and the migrations."""
    h = hashlib.md5()
    for q in fill_sql(dialect, 0, runs, steps, 0.0):
        h.update(q.encode())
    for m in sorted((SQL / dialect / "migrations").glob("*.sql")):
        h.update(m.read_bytes())
    return f"tether_prune_fill_{runs}x{steps}_{h.hexdigest()[:10]}"


async def _admin(statement: str) -> None:
    import psycopg

    async with await psycopg.AsyncConnection.connect(pg_admin_url(), autocommit=True) as admin:
        await admin.execute(statement.encode())


async def _pg_exists(name: str) -> bool:
    import psycopg

    async with await psycopg.AsyncConnection.connect(pg_admin_url(), autocommit=True) as admin:
        cur = await admin.execute(b"SELECT 1 FROM pg_database WHERE datname = %s", (name,))
        return await cur.fetchone() is not None


async def filled(url: str, runs: int, steps: int, reuse: bool) -> tuple[str, float]:
    """Runs 0..runs-1 in the (fresh, migrated) database at `url`: filled, or with `reuse`
    copied from the kept fill if there is one (else filled and then kept). ("fill_s" or
    "copy_s", seconds taken)."""
    sqlite = url.startswith("sqlite")
    name = fill_name("sqlite" if sqlite else "postgres", runs, steps)
    kept = Path(os.environ.get("TMPDIR", "/tmp")) / f"{name}.db"
    t0 = time.perf_counter()
    if reuse and (kept.exists() if sqlite else await _pg_exists(name)):
        if sqlite:
            for extra in ("-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(sqlite_path(url) + extra)
            shutil.copyfile(kept, sqlite_path(url))
        else:
            target = url.rsplit("/", 1)[1]
            await _admin(f'DROP DATABASE "{target}" WITH (FORCE)')
            await _admin(f'CREATE DATABASE "{target}" TEMPLATE "{name}" STRATEGY FILE_COPY')
        print(f"copied the kept fill {name}", file=sys.stderr)
        return "copy_s", time.perf_counter() - t0
    took = await fill(url, 0, runs, steps)
    if reuse:
        if sqlite:
            shutil.copyfile(sqlite_path(url), kept.with_suffix(".part"))
            os.replace(kept.with_suffix(".part"), kept)
        else:
            source = url.rsplit("/", 1)[1]
            await _admin(f'CREATE DATABASE "{name}" TEMPLATE "{source}" STRATEGY FILE_COPY')
        print(f"kept the fill as {name} ({'file ' + str(kept) if sqlite else 'database'}; "
              "remove it when done)", file=sys.stderr)
    return "fill_s", took


async def db_bytes(url: str) -> int:
    return sqlite_bytes(sqlite_path(url)) if url.startswith("sqlite") else await pg_bytes(url)


async def w2(url: str, runs: int, seed: int) -> float:
    """W2 as `python -m bench.workloads W2` runs it (tether.bench.checkpoint): `runs` runs
    started at once, 5 steps each, one journaled simulated LLM call a step, one worker with
    concurrency = runs in this process; wall / ideal. `seed` keeps each round's ids apart."""
    delays = [w2_delays(i) for i in range(runs)]
    ideal = max(sum(d) for d in delays)
    rt = tether.Runtime(url, agents=[w2_agent], version="bench")
    async with rt:
        stop = asyncio.Event()
        worker = asyncio.create_task(rt.work(concurrency=runs, stop=stop, tune=True))
        await asyncio.sleep(0)  # the worker is up and polling before the clock starts
        t0 = time.perf_counter()
        started = await asyncio.gather(*(
            rt.start(w2_agent, {"delays": d, "replies": []}, thread_id=f"w2-{seed}-{i:05d}")
            for i, d in enumerate(delays)))
        done = await asyncio.gather(*(rt.wait(r.thread_id) for r in started))
        wall = time.perf_counter() - t0
        stop.set()
        await worker
    if any(r.status is not tether.RunStatus.COMPLETED for r in done):
        raise RuntimeError("W2: some runs did not complete")
    return wall / ideal


def _tombstones(url: str) -> int:
    if url.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(sqlite_path(url))
        try:
            return int(conn.execute("SELECT count(*) FROM tombstones").fetchone()[0])
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(url) as pg:
        row = pg.execute(b"SELECT count(*) FROM tombstones").fetchone()
        return int(row[0]) if row else 0


async def w2_beside_prune(url: str, w2_runs: int, seed: int) -> tuple[float, bool, float]:
    """W2 while a `tether prune` process removes runs of the second set: (wall / ideal,
    whether the prune was still at work when W2 ended, seconds from its SIGINT to its exit).
    The prune is stopped by SIGINT (it ends after its batch and exits 130); a prune told
    another is at work (a lease a stopped pruner failed to drop lasts TETHER_LEASE_TTL=2 s
    here) is started again until it gets the lease."""
    env = {**os.environ, "TETHER_DB": "", "TETHER_LEASE_TTL": "2"}
    before = await asyncio.to_thread(_tombstones, url)
    deadline = time.monotonic() + 120
    while True:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tether", "prune", "--completed", "30d", "--db", url,
            "--json", env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        ratio, busy, stopping = None, False, 0.0
        try:
            while await asyncio.to_thread(_tombstones, url) <= before:  # at work yet?
                if proc.returncode is not None or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
            else:
                ratio = await w2(url, w2_runs, seed)
                busy = proc.returncode is None
        finally:
            t0 = time.monotonic()
            if proc.returncode is None:
                proc.send_signal(signal.SIGINT)
            _, err = await asyncio.wait_for(proc.communicate(), 60)
            stopping = time.monotonic() - t0
        if ratio is not None:
            if proc.returncode not in (0, 130):
                raise RuntimeError(f"the prune exited {proc.returncode}: {err.decode()[-2000:]}")
            return ratio, busy, stopping
        if time.monotonic() > deadline:
            raise RuntimeError("the prune did not start removing runs")
        await asyncio.sleep(0.5)


async def main(backend: str, runs: int, steps: int, w2_runs: int, beside_runs: int,
               rounds: int, reuse: bool = False) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def result(metric: str, value: float, unit: str) -> None:
        row = {"system": "tether", "backend": backend, "workload": "P", "metric": metric,
               "value": round(value, 4), "unit": unit}
        out.append(row)
        print(json.dumps(row), flush=True)

    async with bench_db(backend) as url:
        await tether.Runtime(url).migrate()
        if runs:
            metric, took = await filled(url, runs, steps, reuse)
            await tether.Runtime(url).migrate()  # a kept fill is of these migrations: a no-op
            result(metric, took, "s")
            result("db_bytes_filled", await db_bytes(url), "B")
            rt = tether.Runtime(url)
            try:
                report = await rt.prune(completed="30d")
            finally:
                await rt.close()
            result("runs_pruned", report.runs, "count")
            result("rows_pruned", report.rows, "count")
            result("prune_s", report.seconds, "s")
            result("rows_per_s", report.rows / report.seconds, "1/s")
            result("freed_bytes", report.freed_bytes, "B")
            result("db_bytes_pruned", await db_bytes(url), "B")
        if not rounds:
            return out
        result("fill_beside_s", await fill(url, runs, beside_runs, steps), "s")
        pruned_before = await asyncio.to_thread(_tombstones, url)
        await w2(url, min(w2_runs, 200), 0)  # warm-up (imports, first connections): not counted
        alone: list[float] = []
        beside: list[float] = []
        stops: list[float] = []
        for r in range(rounds):  # alternate which goes first, so drift falls on both alike
            for with_prune in ((False, True) if r % 2 == 0 else (True, False)):
                if with_prune:
                    ratio, busy, stopping = await w2_beside_prune(url, w2_runs, 2 * r + 3)
                    if not busy:
                        raise RuntimeError("the prune ended before W2: fill more runs "
                                           "(--beside-runs)")
                    beside.append(ratio)
                    stops.append(stopping)
                else:
                    alone.append(await w2(url, w2_runs, 2 * r + 2))
                print(f"round {r + 1} {'beside' if with_prune else 'alone '} "
                      f"{(beside if with_prune else alone)[-1]:.3f}", file=sys.stderr)
        result("w2_wall_over_ideal_alone", statistics.median(alone), "x")
        result("w2_wall_over_ideal_beside_prune", statistics.median(beside), "x")
        result("w2_beside_over_alone", statistics.median(beside) / statistics.median(alone), "x")
        result("prune_sigint_to_exit_max_s", max(stops), "s")
        result("w2_runs_removed_meanwhile",
               await asyncio.to_thread(_tombstones, url) - pruned_before, "count")
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    p.add_argument("--runs", type=int, default=100_000)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--w2-runs", type=int, default=1000)
    p.add_argument("--beside-runs", type=int, default=50_000,
                   help="the second set, pruned beside W2 (enough to outlast every round)")
    p.add_argument("--rounds", type=int, default=3, help="W2 rounds each way (0: none)")
    p.add_argument("--reuse-fill", action="store_true",
                   help="keep the fill of --runs runs and start later runs from a copy of it")
    a = p.parse_args()
    for name in ("steps", "w2_runs", "beside_runs"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.runs < 0 or a.rounds < 0 or not (a.runs or a.rounds):
        p.error("--runs and --rounds must be >= 0, and not both 0")
    rows = asyncio.run(main(a.backend, a.runs, a.steps, a.w2_runs, a.beside_runs, a.rounds,
                            a.reuse_fill))
    print("\n| metric | value | unit |\n|---|---:|---|")
    for r in rows:
        print(f"| {r['metric']} | {r['value']:,} | {r['unit']} |")
