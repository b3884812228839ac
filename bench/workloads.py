"""tether on the shared benchmark workloads W1, W2, W5 and L (see ../shared/WORKLOADS.md), the
effect dispatcher (E) and the megaagent example at scale (M).

Each workload runs in a process of its own (bench/run.py starts one per workload, so peak RSS
is per workload) and prints one JSON line per result:

    {"system": "tether", "backend": "sqlite", "workload": "W1", "metric": "checkpoints_per_s",
     "value": 2345.6, "unit": "1/s"}

Run one directly with `python -m bench.workloads W1 sqlite` (W2 and W5 take the number of runs,
E the number of effects, M the number of agents and a timeout in seconds:
`python -m bench.workloads W2 postgres 10000`, `python -m bench.workloads M sqlite 1000 300`).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
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
from pathlib import Path
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
W5_CONCURRENCY = 1000  # worker slots; a run holds one only until it parks at the interrupt
W5_PHASE_DEADLINE = 120.0  # s for each of suspend and resume before the workload gives up
W5_RESUME_CHUNK = 500  # runtime.resume calls in flight at once
E_EFFECTS_PER_RUN = 10  # E dispatch: N effects requested by N / 10 runs, 10 per step
E_DEADLINE = 120.0  # s to produce the effects, and for the overhead runs' effects to drain
E_DISPATCH_DEADLINE = 60.0  # s of dispatch before the workload reports what it got and gives up
E_OVERHEAD_ROUNDS, E_OVERHEAD_THREADS, E_OVERHEAD_STEPS = 10, 10, 20
MEGA_RUN = Path(__file__).resolve().parent.parent / "examples" / "megaagent" / "run.py"


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


class PartialFailure(RuntimeError):
    """A workload that failed after measuring something: the results it has are printed
    before the error."""

    def __init__(self, message: str, results: list[Result]) -> None:
        super().__init__(message)
        self.results = results


def emit(result: Result) -> None:
    print(result.to_json(), flush=True)


def peak_rss_mib() -> float:
    """This process's peak resident set size (VmHWM) in MiB."""
    with contextlib.suppress(OSError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def current_rss_mib() -> float:
    """This process's resident set size right now (VmRSS) in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


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


# -- W5: suspended runs ----------------------------------------------------------------------

w5_agent = tether.Agent("bench_w5")


@w5_agent.node(start=True)
async def w5_ask(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    answer = ctx.interrupt({"question": "approve?", "i": state["i"]})
    return tether.finish({"answer": answer})


class StatusCounts:
    """Counts runs by status with one SQL query on a connection of its own (not the runtime's
    store): what a dashboard polling the database would see."""

    Q = "SELECT status, count(*) FROM runs GROUP BY status"

    def __init__(self, url: str) -> None:
        self.url = url
        self._sqlite: sqlite3.Connection | None = None
        self._pg: psycopg.AsyncConnection[Any] | None = None

    async def __aenter__(self) -> StatusCounts:
        if self.url.startswith("sqlite"):
            self._sqlite = sqlite3.connect(sqlite_path(self.url), isolation_level=None)
        else:
            self._pg = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._sqlite is not None:
            self._sqlite.close()
        if self._pg is not None:
            await self._pg.close()

    async def get(self) -> dict[str, int]:
        if self._sqlite is not None:
            rows = self._sqlite.execute(self.Q).fetchall()  # a few ms; readers never block in WAL
        else:
            assert self._pg is not None
            rows = await (await self._pg.execute(self.Q.encode())).fetchall()
        return {str(status): int(n) for status, n in rows}

    async def until(self, status: str, n: int, deadline: float, what: str,
                    interval: float = 0.05) -> float:
        """Poll until `n` runs have `status`; returns perf_counter() at that poll. Raises
        RuntimeError (with the counts) at perf_counter() >= deadline."""
        while True:
            counts = await self.get()
            now = time.perf_counter()
            if counts.get(status, 0) >= n:
                return now
            if now >= deadline:
                raise RuntimeError(f"{what}: {counts.get(status, 0):,} of {n:,} runs {status} "
                                   f"when the workload gave up (runs by status: {counts})")
            await asyncio.sleep(interval)


async def w5(backend: str, runs: int) -> list[Result]:
    """`runs` runs each reach ctx.interrupt; one in-process worker. Time to suspend all, RSS
    while they are suspended against idle RSS, time to resume all and finish."""
    async with bench_db(backend) as url:
        runtime = tether.Runtime(url, agents=[w5_agent], version="bench")
        await runtime.migrate()
        async with runtime, StatusCounts(url) as counts:
            stop = asyncio.Event()
            worker = asyncio.create_task(runtime.work(concurrency=W5_CONCURRENCY, stop=stop))
            # Warm-up outside the clock: one run through interrupt, resume and finish (imports,
            # connections, statement caches), then let the worker settle before idle RSS.
            await runtime.start(w5_agent, {"i": -1}, thread_id="warmup")
            await counts.until("waiting", 1, time.perf_counter() + 30, "W5 warm-up")
            await runtime.resume("warmup", {"approved": True, "i": -1})
            warm = await runtime.wait("warmup", timeout=30)
            assert warm.state["answer"] == {"approved": True, "i": -1}, warm.state
            await asyncio.sleep(0.5)
            idle_rss = current_rss_mib()

            t0 = time.perf_counter()
            for lo in range(0, runs, 1000):  # started in chunks; no Run objects kept
                await asyncio.gather(*(
                    runtime.start(w5_agent, {"i": i}, thread_id=f"w5-{i:05d}")
                    for i in range(lo, min(lo + 1000, runs))))
            t_started = time.perf_counter()
            t_suspended = await counts.until("waiting", runs, t0 + W5_PHASE_DEADLINE,
                                             "W5 suspend")
            await asyncio.sleep(0.5)  # let the worker finish its bookkeeping
            suspended_rss = current_rss_mib()
            by_status = await counts.get()
            if by_status.get("waiting", 0) != runs:
                raise RuntimeError(f"W5: expected {runs} waiting runs, found {by_status}")

            async def resume(i: int) -> None:
                await runtime.resume(f"w5-{i:05d}", {"approved": True, "i": i})

            t1 = time.perf_counter()
            for lo in range(0, runs, W5_RESUME_CHUNK):
                await asyncio.gather(*(resume(i) for i in range(lo, min(lo + W5_RESUME_CHUNK, runs))))
            t_resumed = time.perf_counter()
            t_done = await counts.until("completed", runs + 1, t1 + W5_PHASE_DEADLINE,
                                        "W5 resume")
            finished_rss = current_rss_mib()
            await stop_worker(stop, worker)
            by_status = await counts.get()
            if by_status != {"completed": runs + 1}:
                raise RuntimeError(f"W5: runs by status at the end: {by_status}")
            for i in random.Random(5).sample(range(runs), min(runs, 20)):
                run = await runtime.get(f"w5-{i:05d}")
                if run.state.get("answer") != {"approved": True, "i": i}:
                    raise RuntimeError(f"W5: run {i} finished with {run.state}")
    s = w2_suffix(runs)

    def r(metric: str, value: float, unit: str) -> Result:
        return Result(backend, "W5", f"{metric}_{s}", round(value, 3), unit)

    return [
        r("start_s", t_started - t0, "s"),
        r("suspend_s", t_suspended - t0, "s"),
        r("idle_rss_mib", idle_rss, "MiB"),
        r("suspended_rss_mib", suspended_rss, "MiB"),
        r("rss_delta_mib", suspended_rss - idle_rss, "MiB"),
        r("resume_calls_s", t_resumed - t1, "s"),
        r("resume_finish_s", t_done - t1, "s"),
        r("finished_rss_mib", finished_rss, "MiB"),
        r("peak_rss_mib", peak_rss_mib(), "MiB"),
    ]


# -- E: effects ------------------------------------------------------------------------------

e_producer = tether.Agent("bench_e_producer")


@e_producer.node(start=True)
async def e_produce(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    for i in range(state["n"]):
        ctx.effect("noop", {"i": i})
    return tether.finish({})


async def noop_effect(payload: Any, key: str) -> None:
    return None


async def without_dispatch(runtime: tether.Runtime, stop: asyncio.Event, concurrency: int,
                           name: str) -> asyncio.Task[None]:
    """Start the runtime's in-process worker, then register effect `name`'s no-op handler:
    the worker's dispatcher takes the handler names when it is built, so this worker commits
    the effects its steps request (ctx.effect finds the handler) but never performs them.
    src is untouched; callers check the outbox to be sure."""
    worker = asyncio.create_task(runtime.work(concurrency=concurrency, stop=stop))
    while not runtime._workers:
        if worker.done():
            await worker  # raises what stopped it
        await asyncio.sleep(0.001)
    runtime.effect(name)(noop_effect)
    return worker


async def outbox_counts(url: str) -> dict[str, int]:
    q = "SELECT status, count(*) FROM outbox GROUP BY status"
    if url.startswith("sqlite"):
        conn = sqlite3.connect(sqlite_path(url))
        try:
            rows = conn.execute(q).fetchall()
        finally:
            conn.close()
    else:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as aconn:
            rows = await (await aconn.execute(q.encode())).fetchall()
    return {str(status): int(n) for status, n in rows}


async def e_dispatch(backend: str, effects: int, analyze: bool = False) -> list[Result]:
    """`effects` effects committed first (by effects/10 runs, 10 per step, with no dispatcher
    running), then one worker dispatches them to a no-op handler: effects/s from its first
    claim to its last done mark. `analyze`: run ANALYZE on the database first (a diagnostic:
    the planner then has statistics of the filled outbox). Raises PartialFailure with the
    rate so far if the effects are not all done within E_DISPATCH_DEADLINE seconds."""
    per_run = E_EFFECTS_PER_RUN
    n_runs = effects // per_run
    async with bench_db(backend) as url:
        producer = tether.Runtime(url, agents=[e_producer], version="bench")
        await producer.migrate()
        async with producer:
            stop = asyncio.Event()
            worker = await without_dispatch(producer, stop, 1000, "noop")
            for lo in range(0, n_runs, 1000):
                await asyncio.gather(*(
                    producer.start(e_producer, {"n": per_run}, thread_id=f"e-{i:05d}")
                    for i in range(lo, min(lo + 1000, n_runs))))
            async with StatusCounts(url) as counts:
                await counts.until("completed", n_runs, time.perf_counter() + E_DEADLINE,
                                   "E produce")
            await stop_worker(stop, worker)
        before = await outbox_counts(url)
        if before != {"pending": n_runs * per_run}:
            raise RuntimeError(f"E: expected {n_runs * per_run} pending effects, found {before}")
        if analyze:
            if backend == "sqlite":
                conn = sqlite3.connect(sqlite_path(url))
                try:
                    conn.execute("ANALYZE")
                finally:
                    conn.close()
            else:
                async with await psycopg.AsyncConnection.connect(url, autocommit=True) as aconn:
                    await aconn.execute(b"ANALYZE")

        runtime = tether.Runtime(url, agents=[e_producer], version="bench")
        runtime.effect("noop")(noop_effect)
        store = runtime.store
        claim_inner, complete_inner = store.claim_effects, store.complete_effect
        clock = time.perf_counter
        first_claim: list[float] = []
        claims: list[int] = []
        done = [0]
        all_done = asyncio.Event()
        last_done = [0.0]
        total = n_runs * per_run

        async def claim_effects(*args: Any, **kwargs: Any) -> Any:
            t = clock()
            got = await claim_inner(*args, **kwargs)
            if got:
                if not first_claim:
                    first_claim.append(t)
                claims.append(len(got))
            return got

        async def complete_effect(*args: Any, **kwargs: Any) -> bool:
            ok = await complete_inner(*args, **kwargs)
            if ok:
                done[0] += 1
                last_done[0] = clock()
                if done[0] >= total:
                    all_done.set()
            return ok

        store.claim_effects = claim_effects  # type: ignore[method-assign]
        store.complete_effect = complete_effect  # type: ignore[method-assign]
        async with runtime:
            stop = asyncio.Event()
            worker = asyncio.create_task(runtime.work(concurrency=100, stop=stop))
            try:
                await asyncio.wait_for(all_done.wait(), E_DISPATCH_DEADLINE)
                timed_out = False
            except TimeoutError:
                timed_out = True
                last_done[0] = clock()  # the rate so far
            await stop_worker(stop, worker)
        after = await outbox_counts(url)
        if not timed_out and after != {"done": total}:
            raise RuntimeError(f"E: effects by status after dispatch: {after}")
    sfx = "_analyzed" if analyze else ""
    n_done = after.get("done", 0)
    wall = last_done[0] - first_claim[0] if first_claim else float(E_DISPATCH_DEADLINE)
    out = [
        Result(backend, "E", f"effects_done{sfx}", n_done, "count"),
        Result(backend, "E", f"dispatch_s{sfx}", round(wall, 3), "s"),
        Result(backend, "E", f"effects_per_s{sfx}", round(n_done / wall, 1), "1/s"),
        Result(backend, "E", f"claim_batches{sfx}", len(claims), "count"),
        Result(backend, "E", f"claim_batch_mean{sfx}",
               round(sum(claims) / len(claims), 1) if claims else 0, "count"),
    ]
    if timed_out:
        raise PartialFailure(f"E dispatch{' after ANALYZE' if analyze else ''}: {n_done:,} of "
                             f"{total:,} effects done within {E_DISPATCH_DEADLINE:.0f} s "
                             f"(by status: {after})", out)
    return out


e_plain = tether.Agent("bench_e_plain")
e_fx = tether.Agent("bench_e_fx")


@e_plain.node(start=True)
async def e_plain_step(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    msg = f"{ctx.thread_id} step {ctx.step} ".ljust(W1_MSG_BYTES, ".")
    update = {"messages": tether.append([msg])}
    if ctx.step < E_OVERHEAD_STEPS:
        return tether.goto("e_plain_step", update)
    return tether.finish(update)


@e_fx.node(start=True)
async def e_fx_step(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    msg = f"{ctx.thread_id} step {ctx.step} ".ljust(W1_MSG_BYTES, ".")
    ctx.effect("noop", {"step": ctx.step})
    update = {"messages": tether.append([msg])}
    if ctx.step < E_OVERHEAD_STEPS:
        return tether.goto("e_fx_step", update)
    return tether.finish(update)


async def e_overhead(backend: str) -> list[Result]:
    """W1-style sequential runs (concurrency 1) in three variants, interleaved in rounds:
    `plain` (no effect), `effect` (one ctx.effect per step; the same worker's dispatcher
    performs them as they commit) and `effect_nodispatch` (one ctx.effect per step, on a
    second database whose worker does not dispatch): the commit path's own cost apart from
    the dispatcher's competing claims and done marks."""
    variants = ("plain", "effect", "effect_nodispatch")
    walls = dict.fromkeys(variants, 0.0)
    async with bench_db(backend) as url, bench_db(backend) as url_nd:
        runtime = tether.Runtime(url, agents=[e_plain, e_fx], version="bench")
        runtime.effect("noop")(noop_effect)
        runtime_nd = tether.Runtime(url_nd, agents=[e_fx], version="bench")
        await runtime.migrate()
        await runtime_nd.migrate()
        commits = timed_commits(runtime)
        commits_nd = timed_commits(runtime_nd)
        async with runtime, runtime_nd:
            stop = asyncio.Event()
            worker = asyncio.create_task(runtime.work(concurrency=1, stop=stop))
            worker_nd = await without_dispatch(runtime_nd, stop, 1, "noop")
            target = {"plain": (runtime, e_plain), "effect": (runtime, e_fx),
                      "effect_nodispatch": (runtime_nd, e_fx)}
            for kind in variants:  # warm-up: connections, statement caches
                rt, agent = target[kind]
                warm = await rt.start(agent, {"messages": []}, thread_id=f"warm-{kind}")
                await rt.wait(warm.thread_id, timeout=W1_RUN_DEADLINE)
            for rnd in range(E_OVERHEAD_ROUNDS):
                order = variants[rnd % 3:] + variants[:rnd % 3]
                for kind in order:
                    rt, agent = target[kind]
                    t0 = time.perf_counter()
                    for i in range(E_OVERHEAD_THREADS):
                        tid = f"{kind}-{rnd:02d}-{i:03d}"
                        await rt.start(agent, {"messages": []}, thread_id=tid)
                        run = await rt.wait(tid, timeout=W1_RUN_DEADLINE)
                        if run.status is not tether.RunStatus.COMPLETED:
                            raise RuntimeError(f"E overhead: run {tid} ended {run.status}: "
                                               f"{run.error}")
                    walls[kind] += time.perf_counter() - t0
            t_drain = time.perf_counter()
            expected = (E_OVERHEAD_ROUNDS * E_OVERHEAD_THREADS + 1) * E_OVERHEAD_STEPS
            while (await outbox_counts(url)).get("done", 0) < expected:
                if time.perf_counter() - t_drain > E_DEADLINE:
                    raise RuntimeError(f"E overhead: effects not all done: "
                                       f"{await outbox_counts(url)}")
                await asyncio.sleep(0.01)
            drain = time.perf_counter() - t_drain
            await stop_worker(stop, worker)
            await stop_worker(stop, worker_nd)
        nd = await outbox_counts(url_nd)
        if nd != {"pending": expected}:
            raise RuntimeError(f"E overhead: the non-dispatching worker's outbox is {nd}")
    checkpoints = E_OVERHEAD_ROUNDS * E_OVERHEAD_THREADS * E_OVERHEAD_STEPS
    commits.update(commits_nd)  # thread ids differ between the two
    lat = {k: [end - begin for tid, cs in commits.items() if tid.startswith(k + "-")
               for begin, end in cs] for k in variants}
    for k, xs in lat.items():
        if len(xs) != checkpoints:
            raise RuntimeError(f"E overhead: {len(xs)} {k} checkpoints, expected {checkpoints}")
    rate = {k: checkpoints / w for k, w in walls.items()}
    p50 = {k: percentile(xs, 0.5) * 1e3 for k, xs in lat.items()}
    out = [Result(backend, "E", f"checkpoints_per_s_{k}", round(rate[k], 1), "1/s")
           for k in variants]
    out += [Result(backend, "E", f"{k}_vs_plain", round(rate[k] / rate["plain"], 3), "x")
            for k in variants[1:]]
    out += [Result(backend, "E", f"commit_p50_ms_{k}", round(p50[k], 3), "ms") for k in variants]
    out += [Result(backend, "E", f"commit_p50_overhead_ms_{k}", round(p50[k] - p50["plain"], 3),
                   "ms") for k in variants[1:]]
    out.append(Result(backend, "E", "effects_drain_after_last_run_s", round(drain, 3), "s"))
    return out


async def e_workload(backend: str, effects: int) -> list[Result]:
    """Dispatch on a fresh outbox as a user gets it, dispatch again after ANALYZE (each with
    its own database), then the commit overhead. A dispatch that gives up does not stop the
    rest; the workload fails at the end with its message."""
    out: list[Result] = []
    errors: list[str] = []
    for analyze in (False, True):
        try:
            out += await e_dispatch(backend, effects, analyze)
        except PartialFailure as exc:
            out += exc.results
            errors.append(str(exc))
    out += await e_overhead(backend)
    out.append(Result(backend, "E", "peak_rss_mib", round(peak_rss_mib(), 1), "MiB"))
    if errors:
        raise PartialFailure("; ".join(errors), out)
    return out


# -- M: the megaagent example at scale -------------------------------------------------------


async def run_counts(url: str) -> dict[str, int]:
    """Runs by status, read directly (for the message of a run that gave up)."""
    try:
        async with StatusCounts(url) as counts:
            return await counts.get()
    except Exception as exc:  # the database may be gone or locked: the message says so
        return {"error": repr(exc)}  # type: ignore[dict-item]


async def mega(backend: str, agents: int, timeout: float) -> list[Result]:
    """examples/megaagent/run.py's main (one in-process worker, verifies every result was
    counted once) on a fresh database; gives up after `timeout` seconds."""
    spec = importlib.util.spec_from_file_location("megaagent_run", MEGA_RUN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    async with bench_db(backend) as url:
        argv = ["--agents", str(agents), "--db", url, "--timeout", str(timeout)]
        try:
            # run.py prints progress (and a dict) on stdout: keep stdout for JSON lines.
            with contextlib.redirect_stdout(sys.stderr):
                async with asyncio.timeout(timeout):
                    fig = await module.main(argv)
        except TimeoutError:
            raise RuntimeError(f"M: {agents:,} agents did not finish within {timeout:g} s "
                               f"(runs by status: {await run_counts(url)})") from None
        tables = await pg_bytes(url) if backend == "postgres" else None
    s = w2_suffix(agents)
    n = fig["agents"]
    out = [
        Result(backend, "M", f"agents_{s}", n, "count"),
        Result(backend, "M", f"wall_s_{s}", fig["wall_s"], "s"),
        Result(backend, "M", f"messages_{s}", fig["messages"], "count"),
        Result(backend, "M", f"messages_per_s_{s}", fig["messages_per_s"], "1/s"),
        Result(backend, "M", f"peak_rss_mib_{s}", fig["peak_rss_mib"], "MiB"),
        Result(backend, "M", f"db_bytes_{s}", fig["db_bytes"], "bytes"),
    ]
    if tables is not None:
        out.append(Result(backend, "M", f"table_bytes_{s}", tables, "bytes"))
    out.append(Result(backend, "M", f"cost_per_agent_ms_{s}", round(fig["wall_s"] / n * 1e3, 3),
                      "ms"))
    return out


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


async def run_workload(workload: str, backend: str, arg: str | None,
                       timeout: float = 300.0) -> list[Result]:
    if workload == "W1":
        return await w1(backend)
    if workload == "W2":
        return await w2(backend, int(arg or 1000))
    if workload == "W5":
        return await w5(backend, int(arg or 10000))
    if workload == "E":
        return await e_workload(backend, int(arg or 10000))
    if workload == "M":
        return await mega(backend, int(arg or 1000), timeout)
    if workload == "L":
        return await limits(backend, float(arg or 2.0))
    raise SystemExit(f"unknown workload {workload!r}: W1, W2, W5, E, M or L")


def main(argv: list[str]) -> None:
    if len(argv) not in (2, 3, 4) or argv[1] not in BACKENDS:
        raise SystemExit("usage: python -m bench.workloads W1|W2|W5|E|M|L sqlite|postgres "
                         "[runs|effects|agents|seconds] [timeout (M)]")
    timeout = float(argv[3]) if len(argv) == 4 else 300.0
    try:
        results = asyncio.run(run_workload(argv[0], argv[1], argv[2] if len(argv) >= 3 else None,
                                           timeout))
    except PartialFailure as exc:
        for result in exc.results:
            emit(result)
        print(exc, file=sys.stderr, flush=True)  # the last line: bench.run's error row
        raise SystemExit(1) from None
    for result in results:
        emit(result)


if __name__ == "__main__":
    main(sys.argv[1:])

