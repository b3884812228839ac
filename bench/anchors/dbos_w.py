"""DBOS Transact on the shared workloads W1-W5 (../shared/WORKLOADS.md).

Runs inside bench/.anchors/dbos/ (never imports tether), from the repo root:

    python -m bench.anchors.dbos_w W1|W2|W3|W4|W5 sqlite|postgres [runs|jobs]

and prints one JSON line per result (system "dbos"). DBOS is used through its public API:
`DBOS(config=...)`, `DBOS.launch()`, `@DBOS.workflow()`, `@DBOS.step()`,
`DBOS.start_workflow_async`, `DBOS.register_queue` / `Queue.enqueue_async`, `DBOS.recv_async` /
`DBOS.send_async`. Its system database is a fresh SQLite file (put in WAL mode first, see
README) or a fresh Postgres database. W3 and W4 start worker processes of this same module
(`w3-worker`, `w4-worker`).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Any

from dbos import DBOS, DBOSConfig, SetWorkflowID

from bench.anchors.common import (
    BACKENDS,
    W1_STEPS,
    W1_THREADS,
    W2_STEPS,
    W3_RUNS,
    W3_SLEEP,
    W3_STEPS,
    W4_JOBS,
    W5_RUNS,
    bench_db,
    current_rss_mib,
    db_bytes,
    emit,
    exit_on_sigterm,
    log,
    message,
    peak_rss_mib,
    percentile,
    result,
    sqlite_path,
    suffix,
    w2_deadline,
    w2_delays,
)

SYSTEM = "dbos"
APP = "tether-bench"
W4_PROCESSES = 4  # WORKLOADS.md: drain with 4 worker processes
W4_WORKER_CONCURRENCY = int(os.environ.get("BENCH_DBOS_W4_WORKER_CONCURRENCY", "1000"))
W4_POLLING_S = float(os.environ.get("BENCH_DBOS_W4_POLLING_S", "0.05"))
W4_ENQUEUE_INFLIGHT = 500  # enqueue_async calls in flight at once, as tether's W4 starts
# Each worker's system-database pool (DBOS's default is 20): 4 workers x (pool + LISTEN
# connection) must fit the shared server's max_connections = 100 with other users on it.
W4_POOL = 10
W5_CHUNK = 1000  # start_workflow_async calls gathered at once
W5_SEND_CHUNK = 500  # send_async calls in flight at once, as tether's W5 resumes
PHASE_DEADLINE = 300.0
# DBOS's executor (threads for sync workflows and steps, and asyncio's default executor, which
# its async paths use for database calls) is unbounded by default: with thousands of async
# workflows in flight it starts thousands of threads (a load average near 2,000 was seen at
# 10,000 waiting W5 workflows on Postgres). W2 and W5 cap it with DBOS's max_executor_threads:
# at 1,000 runs on Postgres, W5's resume took 5.0 s with 32 threads against 10.0 s uncapped.
ASYNC_THREADS = int(os.environ.get("BENCH_DBOS_MAX_THREADS", "32"))
SQLITE_WAL = os.environ.get("BENCH_DBOS_SQLITE_WAL", "1") == "1"


def prepare_sqlite(url: str) -> None:
    """Put the SQLite system database in WAL mode before DBOS creates its tables (a persistent
    property of the file; DBOS leaves the journal mode at SQLite's default, DELETE). The
    synchronous level stays SQLite's default, FULL: the same durability as tether's."""
    if url.startswith("sqlite") and SQLITE_WAL:
        conn = sqlite3.connect(sqlite_path(url))
        try:
            conn.execute("PRAGMA journal_mode=WAL")
        finally:
            conn.close()


def launch(url: str, executor_id: str | None = None, listen: list[str] | None = None,
           threads: int = 0, **extra: Any) -> None:
    """Construct and launch DBOS on `url`. `threads`: DBOS's max_executor_threads (0: its
    default, no cap)."""
    prepare_sqlite(url)
    config: DBOSConfig = {"name": APP, "system_database_url": url, "log_level": "WARNING"}
    if threads:
        config["max_executor_threads"] = threads
    if executor_id is not None:
        config["executor_id"] = executor_id
    config.update(extra)  # type: ignore[typeddict-item]
    DBOS(config=config)
    if listen is not None:
        DBOS.listen_queues(listen)
    DBOS.launch()


def shutdown() -> None:
    DBOS.destroy(destroy_registry=False)


# -- W1: checkpoint log ----------------------------------------------------------------------

w1_step_times: list[tuple[float, float]] = []


@DBOS.step()
def w1_append(messages: list[str], thread_id: str, k: int) -> list[str]:
    return [*messages, message(thread_id, k)]


@DBOS.workflow()
def w1_run(thread_id: str) -> int:
    """20 steps; step k's recorded output is the state after k super-steps (k messages)."""
    messages: list[str] = []
    for k in range(1, W1_STEPS + 1):
        t0 = time.perf_counter()
        messages = w1_append(messages, thread_id, k)
        w1_step_times.append((t0, time.perf_counter()))
    return len(messages)


def w1(backend: str) -> list[dict[str, object]]:
    with bench_db(backend, "dbos_bench") as (_, url):
        launch(url)
        with SetWorkflowID("warmup"):
            w1_run("warmup")
        w1_step_times.clear()
        t0 = time.perf_counter()
        for i in range(W1_THREADS):
            tid = f"w1-{i:04d}"
            with SetWorkflowID(tid):
                n = w1_run(tid)
            if n != W1_STEPS:
                raise RuntimeError(f"W1 run {tid} ended with {n} messages")
        wall = time.perf_counter() - t0
        shutdown()
        size = db_bytes(url)
    lat = [b - a for a, b in w1_step_times]
    # time between two consecutive step returns of the same workflow
    ends = [b for _, b in w1_step_times]
    cycles = [ends[i] - ends[i - 1] for i in range(len(ends)) if i % W1_STEPS]
    n = len(lat)
    if n != W1_THREADS * W1_STEPS:
        raise RuntimeError(f"W1 recorded {n} steps, expected {W1_THREADS * W1_STEPS}")

    def r(metric: str, value: float, unit: str) -> dict[str, object]:
        return result(SYSTEM, backend, "W1", metric, value, unit)

    return [
        r("wall_s", round(wall, 3), "s"),
        r("checkpoints_per_s", round(n / wall, 1), "1/s"),
        r("latency_p50_ms", round(percentile(lat, 0.50) * 1e3, 3), "ms"),
        r("latency_p99_ms", round(percentile(lat, 0.99) * 1e3, 3), "ms"),
        r("step_p50_ms", round(percentile(cycles, 0.50) * 1e3, 3), "ms"),
        r("step_p99_ms", round(percentile(cycles, 0.99) * 1e3, 3), "ms"),
        r("bytes_on_disk", size, "bytes"),
        r("peak_rss_mib", round(peak_rss_mib(), 1), "MiB"),
    ]


# -- W2: concurrent runs ---------------------------------------------------------------------


@DBOS.step()
async def w2_llm(delay: float) -> str:
    await asyncio.sleep(delay)
    return "ok"


@DBOS.workflow()
async def w2_run(delays: list[float]) -> int:
    replies = [await w2_llm(d) for d in delays]
    return len(replies)


async def w2_async(runs: int) -> tuple[float, float]:
    delays = [w2_delays(i) for i in range(runs)]
    t0 = time.perf_counter()

    async def start(i: int) -> Any:
        with SetWorkflowID(f"w2-{i:05d}"):
            return await DBOS.start_workflow_async(w2_run, delays[i])

    handles = await asyncio.gather(*(start(i) for i in range(runs)))
    t_started = time.perf_counter()
    try:
        async with asyncio.timeout(w2_deadline(runs) - (time.perf_counter() - t0)):
            done = await asyncio.gather(*(h.get_result() for h in handles))
    except TimeoutError:
        raise RuntimeError(f"W2: {runs} runs not all finished within {w2_deadline(runs):.0f} s "
                           "of the first start") from None
    wall = time.perf_counter() - t0
    bad = [n for n in done if n != W2_STEPS]
    if bad:
        raise RuntimeError(f"W2: {len(bad)} runs did not complete {W2_STEPS} steps")
    return wall, t_started - t0


def w2(backend: str, runs: int) -> list[dict[str, object]]:
    ideal = max(sum(w2_delays(i)) for i in range(runs))
    with bench_db(backend, "dbos_bench") as (_, url):
        launch(url, threads=ASYNC_THREADS)
        wall, start_s = asyncio.run(w2_async(runs))
        shutdown()
    s = suffix(runs)

    def r(metric: str, value: float, unit: str) -> dict[str, object]:
        return result(SYSTEM, backend, "W2", f"{metric}_{s}", value, unit)

    return [
        r("wall_s", round(wall, 3), "s"),
        r("ideal_s", round(ideal, 3), "s"),
        r("wall_over_ideal", round(wall / ideal, 3), "x"),
        r("start_s", round(start_s, 3), "s"),
        r("peak_rss_mib", round(peak_rss_mib(), 1), "MiB"),
    ]


# -- W3: crash and resume --------------------------------------------------------------------

W3_DIR = os.environ.get("BENCH_W3_DIR", "")


def _append(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")


@DBOS.step()
async def w3_step(run: int, step: int) -> None:
    """One side effect outside the engine, then 20 ms of work. The `starts` log records every
    execution of the step body (a step run twice shows there twice)."""
    _append(os.path.join(W3_DIR, "starts.log"), f"{run},{step}")
    _append(os.path.join(W3_DIR, "effects.log"), f"{run},{step}")
    await asyncio.sleep(W3_SLEEP)


@DBOS.workflow()
async def w3_run(run: int) -> int:
    for step in range(W3_STEPS):
        await w3_step(run, step)
    return W3_STEPS


def w3_ids(runs: int) -> list[str]:
    return [f"w3-{i:04d}" for i in range(runs)]


W3_QUEUE = "w3"


def w3_worker(url: str, role: str, runs: int) -> None:
    """Process A dequeues the runs (enqueued before it started) and works on them until it is
    killed; process B launches DBOS, which recovers the pending workflows of this executor,
    and waits for every run."""
    launch(url, listen=[W3_QUEUE])
    if role == "A":
        threading.Event().wait()
        return
    deadline = time.time() + PHASE_DEADLINE
    incomplete = []
    for i, wid in enumerate(w3_ids(runs)):
        while time.time() < deadline:
            status = DBOS.get_workflow_status(wid)
            if status is None or status.status in ("SUCCESS", "ERROR", "CANCELLED"):
                break
            time.sleep(0.005)
        status = DBOS.get_workflow_status(wid)
        if status is None or status.status != "SUCCESS":
            incomplete.append(str(i))
    print(f"done {time.time():.6f} {','.join(incomplete) or '-'}", flush=True)
    shutdown()


async def w3_enqueue(runs: int) -> None:
    queue = await DBOS.retrieve_queue_async(W3_QUEUE)
    assert queue is not None
    for i, wid in enumerate(w3_ids(runs)):
        with SetWorkflowID(wid):
            await queue.enqueue_async(w3_run, i)


def w3(backend: str, runs: int) -> list[dict[str, object]]:
    total = runs * W3_STEPS
    with bench_db(backend, "dbos_bench") as (tmp, url):
        # The runs are submitted before A starts (a queue, with DBOS's default settings), so
        # every run is durably accepted and A is only their worker.
        launch(url, listen=[])
        DBOS.register_queue(W3_QUEUE)
        asyncio.run(w3_enqueue(runs))
        shutdown()
        env = {**os.environ, "BENCH_W3_DIR": tmp}
        argv = [sys.executable, "-m", "bench.anchors.dbos_w", "w3-worker", url]
        effects = os.path.join(tmp, "effects.log")
        a = subprocess.Popen([*argv, "A", str(runs)], env=env, stdout=subprocess.DEVNULL)
        try:
            deadline = time.time() + PHASE_DEADLINE
            lines = 0
            while lines < total // 2:
                if a.poll() is not None:
                    raise RuntimeError(f"W3: worker A exited ({a.returncode}) before the kill")
                if time.time() > deadline:
                    raise RuntimeError(f"W3: {lines} of {total} steps within {PHASE_DEADLINE} s")
                time.sleep(0.001)
                if os.path.exists(effects):
                    with open(effects) as f:
                        lines = sum(1 for _ in f)
            a.send_signal(signal.SIGKILL)
            t_kill = time.time()
            a.wait()
        finally:
            if a.poll() is None:
                a.kill()
                a.wait()
        with open(effects) as f:
            at_kill = sum(1 for _ in f)
        log(f"W3 dbos {backend}: SIGKILL A after {at_kill} of {total} steps")
        b = subprocess.run([*argv, "B", str(runs)], env=env, capture_output=True, text=True,
                           timeout=PHASE_DEADLINE + 60, check=False)
        done = [ln for ln in b.stdout.splitlines() if ln.startswith("done ")]
        if b.returncode != 0 or not done:
            raise RuntimeError(f"W3: worker B failed ({b.returncode}): {b.stderr[-500:]}")
        _, t_done, incomplete = done[-1].split()
        with open(effects) as f:
            effect_lines = Counter(ln.strip() for ln in f if ln.strip())
        with open(os.path.join(tmp, "starts.log")) as f:
            start_lines = Counter(ln.strip() for ln in f if ln.strip())
    expected = {f"{r},{s}" for r in range(runs) for s in range(W3_STEPS)}
    runs_missing = {int(key.split(",")[0]) for key in expected - set(effect_lines)}
    not_done = {int(i) for i in incomplete.split(",") if i != "-"}
    lost = len(not_done | runs_missing)  # not completed, or a step's effect never happened

    def r(metric: str, value: float, unit: str) -> dict[str, object]:
        return result(SYSTEM, backend, "W3", metric, value, unit)

    return [
        r("runs", runs, "count"),
        r("steps", total, "count"),
        r("steps_at_kill", at_kill, "count"),
        r("recovery_s", round(float(t_done) - t_kill, 3), "s"),
        r("repeated_steps", sum(n - 1 for n in start_lines.values() if n > 1), "count"),
        r("duplicate_effects", sum(n - 1 for n in effect_lines.values() if n > 1), "count"),
        r("lost_runs", lost, "count"),
    ]


# -- W4: queue throughput --------------------------------------------------------------------

W4_QUEUE = "w4"


@DBOS.workflow()
def w4_noop(i: int) -> None:
    return None


def w4_worker(url: str, executor_id: str) -> None:
    """A queue worker: DBOS launched with a unique executor id, listening to the W4 queue,
    until it is terminated."""
    launch(url, executor_id=executor_id, listen=[W4_QUEUE], sys_db_pool_size=W4_POOL)
    print(f"launched {time.time():.6f}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    os._exit(0)  # nothing of the worker's needs flushing: the jobs' states are in the database


def w4_query(url: str, q: str) -> tuple[Any, ...]:
    """One row of a query on DBOS's documented system tables (schema "dbos" on Postgres)."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(sqlite_path(url), timeout=30)
        try:
            row = conn.execute(q.format(t="workflow_status")).fetchone()
        finally:
            conn.close()
    else:
        import psycopg

        with psycopg.connect(url, autocommit=True) as pg:
            row = pg.execute(q.format(t="dbos.workflow_status").encode()).fetchone()
    assert row is not None
    return tuple(row)


def w4_done(url: str) -> int:
    return int(w4_query(url, "SELECT count(*) FROM {t} WHERE queue_name = 'w4' "
                             "AND status = 'SUCCESS'")[0])


async def w4_enqueue(jobs: int) -> float:
    queue = await DBOS.retrieve_queue_async(W4_QUEUE)
    assert queue is not None
    sem = asyncio.Semaphore(W4_ENQUEUE_INFLIGHT)

    async def enqueue(i: int) -> None:
        async with sem:
            with SetWorkflowID(f"w4-{i:06d}"):
                await queue.enqueue_async(w4_noop, i)  # type: ignore[arg-type]

    t0 = time.perf_counter()
    await asyncio.gather(*(enqueue(i) for i in range(jobs)))
    return time.perf_counter() - t0


def w4(backend: str, jobs: int) -> list[dict[str, object]]:
    with bench_db(backend, "dbos_bench") as (_, url):
        # The producer: a DBOS process that registers the queue and enqueues but does not
        # dequeue (listens to no queue), as a web server feeding workers would.
        launch(url, executor_id="w4-producer", listen=[])
        DBOS.register_queue(W4_QUEUE, worker_concurrency=W4_WORKER_CONCURRENCY,
                            polling_interval_sec=W4_POLLING_S)
        enqueue_s = asyncio.run(w4_enqueue(jobs))
        shutdown()
        argv = [sys.executable, "-m", "bench.anchors.dbos_w", "w4-worker", url]
        t_spawn = time.time()
        workers = [subprocess.Popen([*argv, f"w4-worker-{i}"], stdout=subprocess.DEVNULL)
                   for i in range(W4_PROCESSES)]
        try:
            deadline = time.time() + PHASE_DEADLINE
            while (done := w4_done(url)) < jobs:
                if time.time() > deadline:
                    raise RuntimeError(f"W4: {done} of {jobs} jobs drained within "
                                       f"{PHASE_DEADLINE:.0f} s")
                if any(w.poll() is not None for w in workers):
                    raise RuntimeError("W4: a worker process exited")
                time.sleep(0.02)
            t_all = time.time()
        finally:
            for w in workers:
                if w.poll() is None:
                    w.terminate()
            for w in workers:
                try:
                    w.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    w.kill()
                    w.wait()
        # first dequeue (started_at) and last completion (updated_at), in epoch ms
        first_ms, last_ms, used = w4_query(
            url, "SELECT min(started_at_epoch_ms), max(updated_at), count(DISTINCT executor_id) "
                 "FROM {t} WHERE queue_name = 'w4'")
    drain_s = (last_ms - first_ms) / 1000
    drain_wall = t_all - t_spawn

    def r(metric: str, value: float, unit: str) -> dict[str, object]:
        return result(SYSTEM, backend, "W4", metric, value, unit)

    return [
        r("jobs", jobs, "count"),
        r("enqueue_s", round(enqueue_s, 3), "s"),
        r("enqueue_per_s", round(jobs / enqueue_s, 1), "1/s"),
        r("workers", W4_PROCESSES, "count"),
        r("workers_that_ran_jobs", int(used), "count"),
        r("drain_wall_s", round(drain_wall, 3), "s"),
        r("drain_jobs_per_s", round(jobs / drain_wall, 1), "1/s"),
        r("first_job_s", round(first_ms / 1000 - t_spawn, 3), "s"),
        r("drain_s", round(drain_s, 3), "s"),
        r("drain_per_s", round(jobs / drain_s, 1) if drain_s > 0 else 0.0, "1/s"),
    ]


# -- W5: suspended runs ----------------------------------------------------------------------

w5_waiting = [0]


@DBOS.workflow()
async def w5_run(i: int) -> Any:
    w5_waiting[0] += 1  # in-process count of runs parked in recv (measurement only)
    answer = await DBOS.recv_async("approval", timeout_seconds=3600)
    return answer


async def until(pred: Any, deadline: float, what: str) -> float:
    while not pred():
        if time.perf_counter() > deadline:
            raise RuntimeError(f"W5 {what}: gave up after {PHASE_DEADLINE:.0f} s")
        await asyncio.sleep(0.05)
    return time.perf_counter()


def w5_done(url: str) -> int:
    return int(w4_query(url, "SELECT count(*) FROM {t} WHERE status = 'SUCCESS' "
                             "AND workflow_uuid LIKE 'w5-%'")[0])


async def w5_async(url: str, runs: int, fig: dict[str, float]) -> None:
    """Fills `fig` as the phases end, so that a phase that gives up still leaves the figures
    of the earlier ones."""
    # Warm-up outside the clock: one run through recv, send and finish.
    with SetWorkflowID("warmup"):
        warm = await DBOS.start_workflow_async(w5_run, -1)
    await until(lambda: w5_waiting[0] >= 1, time.perf_counter() + 30, "warm-up")
    await DBOS.send_async("warmup", {"approved": True, "i": -1}, "approval")
    assert await warm.get_result() == {"approved": True, "i": -1}
    await asyncio.sleep(0.5)
    fig["idle_rss_mib"] = current_rss_mib()
    w5_waiting[0] = 0

    async def start(i: int) -> Any:
        with SetWorkflowID(f"w5-{i:05d}"):
            return await DBOS.start_workflow_async(w5_run, i)

    t0 = time.perf_counter()
    for lo in range(0, runs, W5_CHUNK):  # started in chunks; no handles kept
        await asyncio.gather(*(start(i) for i in range(lo, min(lo + W5_CHUNK, runs))))
    fig["start_s"] = time.perf_counter() - t0
    fig["suspend_s"] = await until(lambda: w5_waiting[0] >= runs, t0 + PHASE_DEADLINE,
                                   "suspend") - t0
    await asyncio.sleep(0.5)
    fig["suspended_rss_mib"] = current_rss_mib()
    fig["rss_delta_mib"] = fig["suspended_rss_mib"] - fig["idle_rss_mib"]

    async def send(i: int) -> None:
        await DBOS.send_async(f"w5-{i:05d}", {"approved": True, "i": i}, "approval")

    t1 = time.perf_counter()
    for lo in range(0, runs, W5_SEND_CHUNK):
        await asyncio.gather(*(send(i) for i in range(lo, min(lo + W5_SEND_CHUNK, runs))))
    fig["resume_calls_s"] = time.perf_counter() - t1
    # Poll the number of finished workflows in DBOS's documented workflow_status table every
    # 50 ms on a connection of its own, as tether's W5 polls its runs table (10,000 handles'
    # get_result would be 10,000 pollers of DBOS's own).
    while (done := await asyncio.to_thread(w5_done, url)) < runs:
        if time.perf_counter() - t1 > PHASE_DEADLINE:
            raise RuntimeError(f"W5 resume: {done:,} of {runs:,} runs finished within "
                               f"{PHASE_DEADLINE:.0f} s of the first send")
        await asyncio.sleep(0.05)
    fig["resume_finish_s"] = time.perf_counter() - t1
    fig["finished_rss_mib"] = current_rss_mib()
    for i in random.Random(5).sample(range(runs), min(runs, 20)):
        handle = await DBOS.retrieve_workflow_async(f"w5-{i:05d}")
        answer = await handle.get_result()
        if answer != {"approved": True, "i": i}:
            raise RuntimeError(f"W5: run {i} finished with {answer!r}")


W5_UNITS = {"start_s": "s", "suspend_s": "s", "idle_rss_mib": "MiB",
            "suspended_rss_mib": "MiB", "rss_delta_mib": "MiB", "resume_calls_s": "s",
            "resume_finish_s": "s", "finished_rss_mib": "MiB"}


def w5(backend: str, runs: int) -> list[dict[str, object]]:
    fig: dict[str, float] = {}
    error: Exception | None = None
    with bench_db(backend, "dbos_bench") as (_, url):
        launch(url, threads=ASYNC_THREADS)
        try:
            asyncio.run(w5_async(url, runs, fig))
        except Exception as exc:  # the figures of the phases that ended are still printed
            error = exc
        shutdown()
    fig["peak_rss_mib"] = peak_rss_mib()
    s = suffix(runs)
    rows = [result(SYSTEM, backend, "W5", f"{k}_{s}", round(fig[k], 3), unit)
            for k, unit in {**W5_UNITS, "peak_rss_mib": "MiB"}.items() if k in fig]
    if error is not None:
        for row in rows:
            emit(row)
        raise error
    return rows


# -- entry point -----------------------------------------------------------------------------


def main(argv: list[str]) -> None:
    if argv and argv[0] == "w3-worker":
        w3_worker(argv[1], argv[2], int(argv[3]))
        return
    if argv and argv[0] == "w4-worker":
        w4_worker(argv[1], argv[2])
        return
    if len(argv) not in (2, 3) or argv[1] not in BACKENDS:
        raise SystemExit("usage: python -m bench.anchors.dbos_w W1|W2|W3|W4|W5 sqlite|postgres "
                         "[runs|jobs]")
    exit_on_sigterm()
    workload, backend = argv[0], argv[1]
    n = int(argv[2]) if len(argv) == 3 else None
    if workload == "W1":
        rows = w1(backend)
    elif workload == "W2":
        rows = w2(backend, n or 1000)
    elif workload == "W3":
        rows = w3(backend, n or W3_RUNS)
    elif workload == "W4":
        rows = w4(backend, n or W4_JOBS)
    elif workload == "W5":
        rows = w5(backend, n or W5_RUNS)
    else:
        raise SystemExit(f"unknown workload {workload!r}: W1, W2, W3, W4 or W5")
    for row in rows:
        emit(row)


if __name__ == "__main__":
    main(sys.argv[1:])
