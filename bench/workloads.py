"""tether on the shared benchmark workloads W1, W2 and L (see ../shared/WORKLOADS.md).

Each workload runs in a process of its own (bench/run.py starts one per workload, so peak RSS
is per workload) and prints one JSON line per result:

    {"system": "tether", "backend": "sqlite", "workload": "W1", "metric": "checkpoints_per_s",
     "value": 2345.6, "unit": "1/s"}

Run one directly with `python -m bench.workloads W1 sqlite` (W2 takes the number of runs:
`python -m bench.workloads W2 postgres 10000`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import resource
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import psycopg

import tether
from tether.store.base import StepCommit

PG_ADMIN_URL = os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
BACKENDS = ("sqlite", "postgres")

W1_THREADS, W1_STEPS, W1_MSG_BYTES = 200, 20, 256
W1_RUN_DEADLINE = 15.0  # s for one 20-step W1 run before the workload is declared stuck
W2_STEPS = 5
W2_DELAY = (0.05, 0.15)


@dataclass(frozen=True, slots=True)
class Result:
    backend: str
    workload: str
    metric: str
    value: float
    unit: str

    def to_json(self) -> str:
        return json.dumps({"system": "tether", "backend": self.backend, "workload": self.workload,
                           "metric": self.metric, "value": self.value, "unit": self.unit})


def emit(result: Result) -> None:
    print(result.to_json(), flush=True)


def peak_rss_mib() -> float:
    """This process's peak resident set size (VmHWM) in MiB."""
    with contextlib.suppress(OSError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation, as numpy's default does."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


# -- databases -------------------------------------------------------------------------------


def pg_url(dbname: str) -> str:
    return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + dbname


@contextlib.asynccontextmanager
async def bench_db(backend: str) -> AsyncIterator[str]:
    """A fresh, empty database for one workload: a file in a temporary directory (SQLite)
    or `tether_bench_<uuid>` (Postgres), removed at the end. Yields its URL."""
    if backend == "sqlite":
        tmp = tempfile.mkdtemp(prefix="tether_bench_")
        try:
            yield f"sqlite:///{os.path.join(tmp, 'bench.db')}"
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    if backend != "postgres":
        raise ValueError(f"unknown backend {backend!r}")
    name = f"tether_bench_{uuid.uuid4().hex}"
    async with await psycopg.AsyncConnection.connect(PG_ADMIN_URL, autocommit=True) as admin:
        await admin.execute(f'CREATE DATABASE "{name}"'.encode())
    try:
        yield pg_url(name)
    finally:
        async with await psycopg.AsyncConnection.connect(PG_ADMIN_URL, autocommit=True) as admin:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


def sqlite_path(url: str) -> str:
    return url.removeprefix("sqlite:///")


def sqlite_bytes(path: str) -> int:
    """The database file plus its WAL (the WAL is normally gone once the last connection
    has closed, having been checkpointed into the file)."""
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))


async def pg_bytes(url: str) -> int:
    """pg_total_relation_size (heap, indexes, TOAST) of every table in the database."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind = 'r' AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
        )
        row = await cur.fetchone()
    return int(row[0]) if row else 0


async def stop_worker(stop: asyncio.Event, worker: asyncio.Task[None]) -> None:
    """Stop the in-process worker. A failure while shutting down is reported on stderr but
    does not void what was measured before it."""
    stop.set()
    try:
        await asyncio.wait_for(worker, timeout=60)
    except Exception as exc:
        print(f"warning: the worker failed while stopping: {exc!r}", file=sys.stderr, flush=True)


async def checkpoint_times(url: str) -> tuple[float, float]:
    """(latest step-1 checkpoint, latest checkpoint): finished_at in Unix seconds, taken just
    before each commit. The first says when the last run to be picked up got going."""
    q = "SELECT max(finished_at) FILTER (WHERE step = 1), max(finished_at) FROM checkpoints"
    if url.startswith("sqlite"):
        conn = sqlite3.connect(sqlite_path(url))
        try:
            row = conn.execute(q).fetchone()
        finally:
            conn.close()
    else:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as aconn:
            row = await (await aconn.execute(q.encode())).fetchone()
    assert row is not None
    return float(row[0]), float(row[1])


def timed_commits(runtime: tether.Runtime) -> dict[str, list[tuple[float, float]]]:
    """Wrap this runtime's store.commit_step (on the instance; src is untouched) to record,
    per run, when each commit was called and when it was acknowledged as durable."""
    store = runtime.store
    inner: Callable[[StepCommit], Awaitable[None]] = store.commit_step
    commits: dict[str, list[tuple[float, float]]] = {}
    clock = time.perf_counter

    async def commit_step(commit: StepCommit) -> None:
        t0 = clock()
        await inner(commit)
        commits.setdefault(commit.lease.thread_id, []).append((t0, clock()))

    store.commit_step = commit_step  # type: ignore[method-assign]
    return commits


# -- W1: checkpoint log ----------------------------------------------------------------------

w1_agent = tether.Agent("bench_w1")


@w1_agent.node(start=True)
async def w1_step(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    msg = f"{ctx.thread_id} step {ctx.step} ".ljust(W1_MSG_BYTES, ".")
    update = {"messages": tether.append([msg])}
    if ctx.step < W1_STEPS:
        return tether.goto("w1_step", update)
    return tether.finish(update)


async def w1(backend: str) -> list[Result]:
    """200 threads x 20 super-steps, one run at a time, worker in this process."""
    out: list[Result] = []
    async with bench_db(backend) as url:
        runtime = tether.Runtime(url, agents=[w1_agent], version="bench")
        await runtime.migrate()
        commits = timed_commits(runtime)
        probe_before = await raw_commit_probe(url, "probe_before")
        async with runtime:
            stop = asyncio.Event()
            worker = asyncio.create_task(runtime.work(concurrency=1, stop=stop))
            # Warm-up outside the clock: the worker's first claim, connections, statement caches.
            warm = await runtime.start(w1_agent, {"messages": []}, thread_id="warmup")
            await runtime.wait(warm.thread_id, timeout=W1_RUN_DEADLINE)
            t0 = time.perf_counter()
            last = None
            for i in range(W1_THREADS):
                run = await runtime.start(w1_agent, {"messages": []}, thread_id=f"w1-{i:04d}")
                try:
                    last = await runtime.wait(run.thread_id, timeout=W1_RUN_DEADLINE)
                except TimeoutError:
                    raise RuntimeError(f"W1: run {i} did not finish within {W1_RUN_DEADLINE:.0f} s "
                                       f"({sum(map(len, commits.values()))} checkpoints committed)") from None
                if last.status is not tether.RunStatus.COMPLETED:
                    raise RuntimeError(f"W1 run {run.thread_id} ended {last.status}: {last.error}")
            wall = time.perf_counter() - t0
            await stop_worker(stop, worker)
            assert last is not None and len(last.state["messages"]) == W1_STEPS
            assert all(len(m) == W1_MSG_BYTES for m in last.state["messages"])
        probe_after = await raw_commit_probe(url, "probe_after")
        commits.pop("warmup", None)
        latencies = [end - begin for cs in commits.values() for begin, end in cs]
        cycles = [b[1] - a[1] for cs in commits.values() for a, b in itertools.pairwise(cs)]
        checkpoints = len(latencies)
        if checkpoints != W1_THREADS * W1_STEPS:
            raise RuntimeError(f"W1 committed {checkpoints} checkpoints, expected "
                               f"{W1_THREADS * W1_STEPS}")
        if backend == "sqlite":
            size = sqlite_bytes(sqlite_path(url))  # the store is closed: WAL checkpointed
        else:
            size = await pg_bytes(url)

    def r(metric: str, value: float, unit: str) -> None:
        out.append(Result(backend, "W1", metric, value, unit))

    r("wall_s", round(wall, 3), "s")
    r("checkpoints_per_s", round(checkpoints / wall, 1), "1/s")
    r("latency_p50_ms", round(percentile(latencies, 0.50) * 1e3, 3), "ms")
    r("latency_p99_ms", round(percentile(latencies, 0.99) * 1e3, 3), "ms")
    r("step_p50_ms", round(percentile(cycles, 0.50) * 1e3, 3), "ms")
    r("step_p99_ms", round(percentile(cycles, 0.99) * 1e3, 3), "ms")
    r("bytes_on_disk", size, "bytes")
    raw = (probe_before + probe_after) / 2
    r("raw_commit_inline_per_s", round(raw, 1), "1/s")
    r("checkpoints_vs_raw_inline", round(checkpoints / wall / raw, 3), "x")
    r("peak_rss_mib", round(peak_rss_mib(), 1), "MiB")
    return out


# -- W2: concurrent runs ---------------------------------------------------------------------

w2_agent = tether.Agent("bench_w2")


async def simulated_llm(delay: float) -> str:
    await asyncio.sleep(delay)
    return "ok"


@w2_agent.node(start=True)
async def w2_step(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    reply = await ctx.call(simulated_llm, state["delays"][ctx.step - 1])
    update = {"replies": tether.append([reply])}
    if ctx.step < W2_STEPS:
        return tether.goto("w2_step", update)
    return tether.finish(update)


def w2_delays(run_index: int) -> list[float]:
    rng = random.Random(run_index)
    return [rng.uniform(*W2_DELAY) for _ in range(W2_STEPS)]


def w2_deadline(runs: int) -> float:
    """Give up after this many seconds from the first start (about 85x ideal at 1,000 runs)."""
    return 60.0 if runs <= 1000 else 600.0


def w2_suffix(runs: int) -> str:
    return f"{runs // 1000}k" if runs % 1000 == 0 else str(runs)


async def w2(backend: str, runs: int) -> list[Result]:
    """`runs` runs started at once, 5 steps each, each step one journaled simulated LLM call;
    one worker with concurrency = runs in this process."""
    delays = [w2_delays(i) for i in range(runs)]
    ideal = max(sum(d) for d in delays)
    async with bench_db(backend) as url:
        runtime = tether.Runtime(url, agents=[w2_agent], version="bench")
        await runtime.migrate()
        async with runtime:
            stop = asyncio.Event()
            worker = asyncio.create_task(runtime.work(concurrency=runs, stop=stop))
            await asyncio.sleep(0)  # the worker is up and polling before the clock starts
            t0_unix, t0 = time.time(), time.perf_counter()
            started = await asyncio.gather(*(
                runtime.start(w2_agent, {"delays": d, "replies": []}, thread_id=f"w2-{i:05d}")
                for i, d in enumerate(delays)
            ))
            t_started = time.perf_counter()
            finished: list[tether.Run] = []

            async def wait(thread_id: str) -> tether.Run:
                run = await runtime.wait(thread_id)
                finished.append(run)
                return run

            deadline = w2_deadline(runs)
            try:
                async with asyncio.timeout(deadline - (time.perf_counter() - t0)):
                    done = await asyncio.gather(*(wait(r.thread_id) for r in started))
            except TimeoutError:
                raise RuntimeError(f"W2: {len(finished)} of {runs} runs finished within "
                                   f"{deadline:.0f} s") from None
            wall = time.perf_counter() - t0
            first_steps, last_step = await checkpoint_times(url)
            await stop_worker(stop, worker)
        bad = [r for r in done if r.status is not tether.RunStatus.COMPLETED
               or len(r.state["replies"]) != W2_STEPS]
        if bad:
            raise RuntimeError(f"W2: {len(bad)} runs did not complete 5 steps, e.g. {bad[0]}")
    s = w2_suffix(runs)
    return [
        Result(backend, "W2", f"wall_s_{s}", round(wall, 3), "s"),
        Result(backend, "W2", f"ideal_s_{s}", round(ideal, 3), "s"),
        Result(backend, "W2", f"wall_over_ideal_{s}", round(wall / ideal, 3), "x"),
        Result(backend, "W2", f"start_s_{s}", round(t_started - t0, 3), "s"),
        Result(backend, "W2", f"last_first_step_s_{s}", round(first_steps - t0_unix, 3), "s"),
        Result(backend, "W2", f"last_checkpoint_s_{s}", round(last_step - t0_unix, 3), "s"),
        Result(backend, "W2", f"peak_rss_mib_{s}", round(peak_rss_mib(), 1), "MiB"),
    ]


# -- L: physical limits ----------------------------------------------------------------------

PAYLOAD = b"x" * W1_MSG_BYTES
BATCH = 100


def _rate(rows: int, seconds: float) -> float:
    return round(rows / seconds, 1)


def sqlite_raw(path: str, synchronous: str, batch: int, seconds: float,
               table: str | None = None) -> float:
    """Rows/s of INSERT + COMMIT into a WAL database, `batch` rows per commit, for about
    `seconds` seconds."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    table = table or f"raw_{synchronous.lower()}_{batch}"
    conn.execute(f"CREATE TABLE {table} (thread_id TEXT NOT NULL, step INTEGER NOT NULL, "
                 "data BLOB NOT NULL, PRIMARY KEY (thread_id, step)) WITHOUT ROWID")
    q = f"INSERT INTO {table} VALUES (?, ?, ?)"
    n = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while True:
        conn.execute("BEGIN IMMEDIATE")
        for _ in range(batch):
            conn.execute(q, ("t", n, PAYLOAD))
            n += 1
        conn.execute("COMMIT")
        if time.perf_counter() >= deadline:
            break
    elapsed = time.perf_counter() - t0
    conn.close()
    return _rate(n, elapsed)


def pg_raw(url: str, connections: int, batch: int, seconds: float,
           table: str | None = None, drop: bool = False) -> float:
    """Rows/s of INSERT + COMMIT via psycopg, `batch` rows per commit (single rows in
    autocommit, batches in one transaction with executemany), one thread per connection."""
    table = table or f"raw_{connections}_{batch}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (thread_id TEXT NOT NULL, step INTEGER NOT NULL, "
                     "data BYTEA NOT NULL, PRIMARY KEY (thread_id, step))".encode())
    q = f"INSERT INTO {table} VALUES (%s, %s, %s)".encode()
    conns = [psycopg.connect(url, autocommit=True) for _ in range(connections)]
    counts = [0] * connections
    barrier = threading.Barrier(connections + 1)
    deadline = [0.0]

    def insert(i: int) -> None:
        conn, key, n = conns[i], f"t{i}", 0
        cur = conn.cursor()
        cur.execute(q, (key, -1, PAYLOAD))  # prepare outside the clock
        barrier.wait()
        while True:
            if batch == 1:
                cur.execute(q, (key, n, PAYLOAD))
            else:
                with conn.transaction():
                    cur.executemany(q, [(key, n + j, PAYLOAD) for j in range(batch)])
            n += batch
            if time.perf_counter() >= deadline[0]:
                break
        counts[i] = n

    threads = [threading.Thread(target=insert, args=(i,)) for i in range(connections)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    deadline[0] = t0 + seconds
    barrier.wait()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    for c in conns:
        c.close()
    if drop:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP TABLE {table}".encode())
    return _rate(sum(counts), elapsed)


async def raw_commit_probe(url: str, name: str, seconds: float = 1.0) -> float:
    """Single-row INSERT + COMMIT rate on the same storage as the workload, right now: the
    disk's fsync rate drifts, so W1 is also compared with a probe taken around it. On
    SQLite it is a separate file beside the database (WAL, synchronous=FULL); on Postgres a
    table in the same database, dropped afterwards."""
    if url.startswith("sqlite"):
        path = os.path.join(os.path.dirname(sqlite_path(url)), f"{name}.db")
        return await asyncio.to_thread(sqlite_raw, path, "FULL", 1, seconds, "probe")
    return await asyncio.to_thread(pg_raw, url, 1, 1, seconds, name, True)


async def limits(backend: str, seconds: float) -> list[Result]:
    out: list[Result] = []
    async with bench_db(backend) as url:
        if backend == "sqlite":
            path = sqlite_path(url)
            for sync in ("NORMAL", "FULL"):
                for batch, label in ((1, "single"), (BATCH, "batch100")):
                    rate = await asyncio.to_thread(sqlite_raw, path, sync, batch, seconds)
                    out.append(Result(backend, "L", f"{label}_{sync.lower()}_rows_per_s", rate,
                                      "1/s"))
        else:
            for connections in (1, 16):
                for batch, label in ((1, "single"), (BATCH, "batch100")):
                    rate = await asyncio.to_thread(pg_raw, url, connections, batch, seconds)
                    out.append(Result(backend, "L", f"{label}_{connections}conn_rows_per_s",
                                      rate, "1/s"))
    out.append(Result(backend, "L", "peak_rss_mib", round(peak_rss_mib(), 1), "MiB"))
    return out


# -- entry point for one workload process ----------------------------------------------------


async def run_workload(workload: str, backend: str, arg: str | None) -> list[Result]:
    if workload == "W1":
        return await w1(backend)
    if workload == "W2":
        return await w2(backend, int(arg or 1000))
    if workload == "L":
        return await limits(backend, float(arg or 2.0))
    raise SystemExit(f"unknown workload {workload!r}: W1, W2 or L")


def main(argv: list[str]) -> None:
    if len(argv) not in (2, 3) or argv[1] not in BACKENDS:
        raise SystemExit("usage: python -m bench.workloads W1|W2|L sqlite|postgres [runs|seconds]")
    results = asyncio.run(run_workload(argv[0], argv[1], argv[2] if len(argv) == 3 else None))
    for result in results:
        emit(result)


if __name__ == "__main__":
    main(sys.argv[1:])

