"""Worker processes on one database (issue 35 goals 9 and 10).

RP, bench R's other layout: W2's workload (runs started at once, 5 steps, one journaled
simulated LLM call each) started from this process, which runs no worker, so every run is
queued and claimed by a `tether worker` process: one process of one version, then two
processes of two versions routed 50/50 (each claims only its own version's runs).
`two_over_one`: wall time (first start to the last run completed) of the second over the
first, the median of `rounds` pairs in alternating order on fresh databases. The worker
processes are pinned to one core, so both layouts get the same CPU however many processes they
run; `cpu_two_over_one` is the ratio of the CPU time spent (workers' and the database server's
backends'). RPE (`embedded`), the layout of bench R itself with the second version's worker
moved out: this process runs the first version's worker (its runs are handed over) and starts
every run, pinned to the same core, the second version's worker in a process of its own.

S, scaling out: `runs` runs of `steps` steps (no sleep: a step is its commit) queued, then
P `tether worker` processes drain them, for each P of `procs` in turn, `rounds` times
interleaved. Throughput is steps per second from the first checkpoint to the last; beside it
what the workers' CPU and the database's own backends cost per step (tether.bench.pgcost),
from which `model_*` says where one primary saturates: steps/s = the server's cores / its CPU
per step (the backends' CPU only: the WAL writer and checkpointer are shared by the cluster).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

import tether

from .checkpoint import w2_agent, w2_delays
from .common import Result, StatusCounts, WorkerProcesses, bench_db, query, stop_worker, suffix
from .pgcost import DbCost, NoCost, PgCost, proc_cpu_s

VERSIONS = ("bench", "bench2")
S_RUNS, S_STEPS, S_CONCURRENCY = 2000, 10, 100
DEADLINE = 600.0

s_agent = tether.Agent("bench_s")


@s_agent.node(name="step", start=True)
async def s_step(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    update = {"n": ctx.step}
    if ctx.step < int(state["steps"]):
        return tether.goto("step", update)
    return tether.finish(update)


def w2_app() -> tether.Runtime:
    """A `tether worker --app` of version bench (db: --db, else $TETHER_DB)."""
    return tether.Runtime(os.environ.get("TETHER_DB"), agents=[w2_agent], version=VERSIONS[0])


def w2_app2() -> tether.Runtime:
    """The same agent, version bench2."""
    return tether.Runtime(os.environ.get("TETHER_DB"), agents=[w2_agent], version=VERSIONS[1])


def s_app() -> tether.Runtime:
    return tether.Runtime(os.environ.get("TETHER_DB"), agents=[s_agent], version="bench")


APPS = {VERSIONS[0]: "tether.bench.scale:w2_app", VERSIONS[1]: "tether.bench.scale:w2_app2"}


async def until_registered(rt: tether.Runtime, n: int, procs: WorkerProcesses) -> None:
    for _ in range(6000):  # up to 60 s for the worker processes to start and register
        procs.check()
        if sum(w.alive for w in await rt.workers()) >= n:
            return
        await asyncio.sleep(0.01)
    raise RuntimeError(f"{n} worker processes did not register within 60 s")


def pin(pid: int) -> None:
    """Keep a worker process on the machine's last core: the layouts then get the same CPU
    however many processes they run, and a shared machine's load weighs on both alike."""
    if os.environ.get("BENCH_RP_PIN") == "0":  # each process on every core, as deployed
        return
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(pid, {(os.cpu_count() or 1) - 1})


async def _rp_once(backend: str, runs: int, versions: tuple[str, ...], tmp: Path,
                   embedded: bool = False) -> tuple[float, float]:
    """(wall s from the first start to the last run completed, CPU s of the worker
    processes and the database's backends over the same interval). `embedded`: this process
    runs the first version's worker (its runs are handed over, as in bench R) and is pinned
    to the workers' core; else it only starts runs, and every version has a worker process."""
    async with bench_db(backend) as url:
        rt = tether.Runtime(url, agents=[w2_agent], version=versions[0])
        await rt.migrate()
        stop = asyncio.Event()
        async with rt, (PgCost(url) if backend == "postgres" else NoCost(url)) as cost:
            here = asyncio.create_task(rt.work(concurrency=runs, stop=stop)) if embedded else None
            cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
            try:
                if embedded:
                    pin(0)
                with WorkerProcesses(url, "", tmp) as procs:
                    for v in versions[1:] if embedded else versions:
                        procs.app = APPS[v]
                        pin(procs.start(concurrency=runs).pid)
                    await until_registered(rt, len(versions), procs)
                    if len(versions) > 1:
                        await rt.route({v: 1 for v in versions})
                    async with StatusCounts(url) as counts:
                        cost.exclude.add(counts.backend_pid() or 0)
                        base = {p.pid: proc_cpu_s(p.pid) or 0.0 for p in procs.procs}
                        own0 = time.process_time()
                        await cost.start()
                        t0 = time.perf_counter()
                        await asyncio.gather(*(
                            rt.start(w2_agent, {"delays": w2_delays(i), "replies": []},
                                     thread_id=f"w2-{i:05d}") for i in range(runs)))
                        t_started = time.perf_counter()
                        t1 = await counts.until("completed", runs, t0 + DEADLINE, "RP",
                                                interval=0.05, check=procs.check)
                        cpu = sum((proc_cpu_s(p.pid) or 0.0) - base[p.pid] for p in procs.procs)
                        if embedded:
                            cpu += time.process_time() - own0
                        await cost.stop()
                    procs.stop()
            finally:
                if here is not None:
                    await stop_worker(stop, here)
                if embedded and cpus:
                    os.sched_setaffinity(0, cpus)
            db = await cost.finish(0.0)
            rows = await query(url, "SELECT version, count(*) FROM runs GROUP BY version")
            if os.environ.get("BENCH_RP_DEBUG"):
                await _rp_debug(url, versions, t_started - t0, t1 - t0, cpu, db)

    split = {str(v): int(n) for v, n in rows}
    if len(versions) > 1 and min(split.get(v, 0) for v in versions) < runs // 4:
        raise RuntimeError(f"RP: runs by version {split}: the 50/50 routing did not hold")
    return t1 - t0, cpu + db.backend_cpu_s


async def _rp_debug(url: str, versions: tuple[str, ...], starts: float, wall: float,
                    cpu: float, db: DbCost) -> None:
    cp = await query(url, "SELECT step, count(*), min(started_at), percentile_cont(0.5) "
                          "WITHIN GROUP (ORDER BY started_at), max(finished_at) "
                          "FROM checkpoints GROUP BY step ORDER BY step")
    made = await query(url, "SELECT min(created_at), max(created_at) FROM runs")
    t = float(made[0][0])
    print(f"RP {versions}: starts {starts:.2f}s wall {wall:.2f}s created "
          f"{float(made[0][1]) - t:.2f}s workers' CPU {cpu:.2f}s db {db}", file=sys.stderr)
    waits = await query(url, "SELECT r.version, count(*), percentile_cont(0.5) WITHIN GROUP "
                             "(ORDER BY c.started_at - r.created_at), max(c.started_at - "
                             "r.created_at), max(l.finished_at) - min(r.created_at) FROM runs r "
                             "JOIN checkpoints c ON c.thread_id = r.thread_id AND c.step = 1 "
                             "JOIN checkpoints l ON l.thread_id = r.thread_id AND l.step = 5 "
                             "GROUP BY r.version ORDER BY r.version")
    for v, n, med_wait, max_wait, span in waits:
        print(f"  {v}: {n} runs, created to step 1 median {med_wait:.3f} s max {max_wait:.3f} s,"
              f" last step done {span:.2f} s after the first run was created", file=sys.stderr)
    for step, n, a, m, b in cp:
        print(f"  step {step} n={n} first {a - t:.2f} median {m - t:.2f} last {b - t:.2f}",
              file=sys.stderr)


async def rainbow_processes(backend: str, runs: int, rounds: int = 3,
                            embedded: bool = False) -> list[Result]:
    """`rounds` pairs of (one version in one worker process, two versions in a worker
    process each), alternating; medians, and the median of each pair's own ratio."""
    ideal = max(sum(w2_delays(i)) for i in range(runs))
    ones, twos, ratios, cpu_ratios = [], [], [], []
    tmp = Path(tempfile.mkdtemp(prefix="tether_bench_rp_"))
    try:
        for i in range(rounds):
            order = (VERSIONS[:1], VERSIONS) if i % 2 == 0 else (VERSIONS, VERSIONS[:1])
            got = {len(v): await _rp_once(backend, runs, v, tmp, embedded) for v in order}
            ones.append(got[1][0])
            twos.append(got[2][0])
            ratios.append(got[2][0] / got[1][0])
            cpu_ratios.append(got[2][1] / got[1][1])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    s = suffix(runs)
    name = "RPE" if embedded else "RP"
    return [
        Result(backend, name, f"one_process_over_ideal_{s}", round(median(ones) / ideal, 3), "x"),
        Result(backend, name, f"two_processes_over_ideal_{s}", round(median(twos) / ideal, 3),
               "x"),
        Result(backend, name, f"two_over_one_{s}", round(median(ratios), 3), "x"),
        Result(backend, name, f"two_over_one_max_{s}", round(max(ratios), 3), "x"),
        Result(backend, name, f"cpu_two_over_one_{s}", round(median(cpu_ratios), 3), "x"),
    ]


# -- S: scaling out ---------------------------------------------------------------------------

async def scale_once(procs_n: int, runs: int = S_RUNS, steps: int = S_STEPS,
                     concurrency: int = S_CONCURRENCY) -> dict[str, float]:
    """One drain on a fresh Postgres database: the figures of one row of the S table."""
    tmp = Path(tempfile.mkdtemp(prefix="tether_bench_s_"))
    try:
        async with bench_db("postgres") as url:
            rt = tether.Runtime(url, agents=[s_agent], version="bench")
            await rt.migrate()
            async with rt:
                for lo in range(0, runs, 500):
                    await asyncio.gather(*(
                        rt.start(s_agent, {"steps": steps}, thread_id=f"s-{i:06d}")
                        for i in range(lo, min(lo + 500, runs))))
            async with PgCost(url) as cost:
                with WorkerProcesses(url, "tether.bench.scale:s_app", tmp) as procs:
                    async with StatusCounts(url) as counts:
                        cost.exclude.add(counts.backend_pid() or 0)
                        await cost.start()
                        t0 = time.perf_counter()
                        for _ in range(procs_n):
                            procs.start(concurrency=concurrency)
                        base = await _registered_cpu(counts, procs, procs_n)
                        await counts.until("completed", runs, t0 + DEADLINE, "S",
                                           interval=0.02, check=procs.check)
                        worker_cpu = sum((proc_cpu_s(p.pid) or 0.0) - base[p.pid]
                                         for p in procs.procs)
                        await cost.stop()
                    procs.stop()
                db: DbCost = await cost.finish()
            first, last = (float(x) for x in (await query(
                url, "SELECT min(finished_at), max(finished_at) FROM checkpoints"))[0])
            n_steps = int((await query(url, "SELECT count(*) FROM checkpoints"))[0][0])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if n_steps != runs * steps:
        raise RuntimeError(f"S: {n_steps} checkpoints, expected {runs * steps}")
    return {
        "procs": procs_n, "steps": n_steps, "drain_s": last - first,
        "steps_per_s": n_steps / (last - first),
        "worker_cpu_us_per_step": 1e6 * worker_cpu / n_steps,
        "db_cpu_us_per_step": 1e6 * db.backend_cpu_s / n_steps,
        "db_backends": db.backends,
        "commits_per_step": db.commits / n_steps,
        "rows_per_step": db.rows_written / n_steps,
        "wal_bytes_per_step": (db.wal_bytes if db.wal_bytes is not None else
                               db.wal_bytes_cluster) / n_steps,
        "wal_bytes_cluster_per_step": db.wal_bytes_cluster / n_steps,
    }


async def _registered_cpu(counts: StatusCounts, procs: WorkerProcesses, n: int
                          ) -> dict[int, float]:
    """Each worker process's CPU time when it registered (its start-up: interpreter, imports,
    connections), to leave out of the per-step figure."""
    base: dict[int, float] = {}
    deadline = time.perf_counter() + 60
    while len(base) < n:
        procs.check()
        for pid in await counts.get("SELECT pid::text, 1 FROM workers"):
            if int(pid) not in base:
                base[int(pid)] = proc_cpu_s(int(pid)) or 0.0
        if time.perf_counter() > deadline:
            raise RuntimeError(f"S: {n - len(base)} worker processes did not register in 60 s")
        await asyncio.sleep(0.002)
    return base


def model(rows: list[dict[str, float]], cores: int) -> dict[str, float]:
    """Where one primary saturates, from the measured per-step costs: the medians of the rows
    with the most worker processes (the smallest group commits, so the dearest steps), its
    CPU (`cores` of it) spent only on tether's backends, and the WAL that rate writes."""
    most = max(r["procs"] for r in rows)
    rows = [r for r in rows if r["procs"] == most]
    db_us = median(r["db_cpu_us_per_step"] for r in rows)
    wal = median(r["wal_bytes_per_step"] for r in rows)
    rows_per_step = median(r["rows_per_step"] for r in rows)
    commits = median(r["commits_per_step"] for r in rows)
    steps_s = cores / (db_us * 1e-6)
    return {"db_cpu_us_per_step": db_us, "wal_bytes_per_step": wal,
            "rows_per_step": rows_per_step, "commits_per_step": commits, "cores": cores,
            "steps_per_s": steps_s, "rows_per_s": steps_s * rows_per_step,
            "wal_mb_per_s": steps_s * wal / 1e6}


async def scale_out(procs: tuple[int, ...] = (1, 2, 4), rounds: int = 2, runs: int = S_RUNS,
                    steps: int = S_STEPS) -> tuple[list[dict[str, float]], dict[str, float]]:
    """Every P in `procs`, `rounds` times, interleaved (1, 2, 4, 4, 2, 1, ...)."""
    rows: list[dict[str, float]] = []
    for i in range(rounds):
        for p in (procs if i % 2 == 0 else tuple(reversed(procs))):
            rows.append(await scale_once(p, runs, steps))
    return rows, model(rows, os.cpu_count() or 1)


async def s_workload(backend: str, procs: tuple[int, ...], rounds: int) -> list[Result]:
    if backend != "postgres":
        raise SystemExit("S measures the Postgres server's own cost: postgres only")
    rows, m = await scale_out(procs, rounds)
    out: list[Result] = []
    for p in procs:
        mine = [r for r in rows if r["procs"] == p]
        for key, unit in (("steps_per_s", "1/s"), ("worker_cpu_us_per_step", "us"),
                          ("db_cpu_us_per_step", "us"), ("wal_bytes_per_step", "B")):
            out.append(Result(backend, "S", f"{key}_{p}p", round(median(r[key] for r in mine),
                                                                  1), unit))
    base = median(r["steps_per_s"] for r in rows if r["procs"] == procs[0])
    for p in procs[1:]:
        v = median(r["steps_per_s"] for r in rows if r["procs"] == p)
        out.append(Result(backend, "S", f"speedup_{p}p_over_{procs[0]}p", round(v / base, 3),
                          "x"))
    out += [Result(backend, "S", "model_steps_per_s", round(m["steps_per_s"]), "1/s"),
            Result(backend, "S", "model_rows_per_s", round(m["rows_per_s"]), "1/s"),
            Result(backend, "S", "model_wal_mb_per_s", round(m["wal_mb_per_s"], 1), "MB/s")]
    return out

