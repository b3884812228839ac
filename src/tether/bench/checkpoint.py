"""W1 (checkpoint log: 200 threads x 20 super-steps, sequential) and W2 (R runs started at
once, 5 steps each, each step a simulated LLM call), with the worker in this process."""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import tether
from tether.tuning import gc_tuned

from .common import (
    Result,
    bench_db,
    checkpoint_times,
    peak_rss_mib,
    percentile,
    pg_bytes,
    query,
    sqlite_bytes,
    sqlite_path,
    stop_worker,
    suffix,
    timed_commits,
)
from .limits import W1_MSG_BYTES, RawCommits, raw_commit_probe

W1_THREADS, W1_STEPS = 200, 20
W1_RUN_DEADLINE = 15.0  # s for one 20-step W1 run before the workload is declared stuck
W1_BLOCK = 1  # runs per block: W1 and its raw reference alternate, block by block
# A checkpoint row's size in bytes, as the reference writes it: its columns' lengths (the
# numbers as 8 bytes each: step, attempt, started_at, finished_at).
W1_ROW_BYTES = ("SELECT avg(length(thread_id) + length(node) + coalesce(length(next_node), 0) "
                "+ length(kind) + length(data) + length(worker) + 32) FROM checkpoints")
W2_STEPS = 5
W2_DELAY = (0.05, 0.15)

w1_agent = tether.Agent("bench_w1")


@w1_agent.node(start=True)
async def w1_step(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    msg = f"{ctx.thread_id} step {ctx.step} ".ljust(W1_MSG_BYTES, ".")
    update = {"messages": tether.append([msg])}
    if ctx.step < W1_STEPS:
        return tether.goto("w1_step", update)
    return tether.finish(update)


async def w1_run(runtime: tether.Runtime, i: int,
                 commits: dict[str, list[tuple[float, float]]]) -> tether.Run:
    """W1's run i, started and waited for."""
    run = await runtime.start(w1_agent, {"messages": []}, thread_id=f"w1-{i:04d}")
    try:
        last = await runtime.wait(run.thread_id, timeout=W1_RUN_DEADLINE)
    except TimeoutError:
        raise RuntimeError(f"W1: run {i} did not finish within {W1_RUN_DEADLINE:.0f} s "
                           f"({sum(map(len, commits.values()))} checkpoints committed)") from None
    if last.status is not tether.RunStatus.COMPLETED:
        raise RuntimeError(f"W1 run {run.thread_id} ended {last.status}: {last.error}")
    return last


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
            # The reference: as many single-row commits as W1 makes checkpoints, of the same
            # row size, through the plain driver, alternating with W1 block by block (raw
            # then W1, W1 then raw, ...) so that both see the same disk as it drifts (within
            # seconds, on a shared disk: blocks of 20 runs still gave 0.56-0.86 for one code).
            # The reference runs on a thread: the loop stays free for the worker's own timers.
            (row_bytes,), = await query(url, W1_ROW_BYTES)
            raw = RawCommits(url, round(row_bytes))
            wall = 0.0
            last = None
            try:
                for block in range(0, W1_THREADS, W1_BLOCK):
                    runs = range(block, min(block + W1_BLOCK, W1_THREADS))
                    if block // W1_BLOCK % 2 == 0:
                        await asyncio.to_thread(raw.commit, len(runs) * W1_STEPS)
                    t0 = time.perf_counter()
                    for i in runs:
                        last = await w1_run(runtime, i, commits)
                    wall += time.perf_counter() - t0
                    if block // W1_BLOCK % 2 == 1:
                        await asyncio.to_thread(raw.commit, len(runs) * W1_STEPS)
            finally:
                raw.close()
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
    r("raw_commits_per_s", raw.rate, "1/s")
    r("raw_row_bytes", round(row_bytes), "bytes")
    r("checkpoints_vs_raw", round(checkpoints / wall / raw.rate, 3), "x")
    probe = (probe_before + probe_after) / 2
    r("raw_commit_inline_per_s", round(probe, 1), "1/s")
    r("checkpoints_vs_raw_inline", round(checkpoints / wall / probe, 3), "x")
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



async def w2_floor(runs: int) -> tuple[float, float]:
    """The same-run reference for W2: what its writes cost with no engine around them. A bare
    asyncio loop over sqlite3 (WAL, synchronous=FULL, group commit per loop iteration): each
    of `runs` tasks inserts its run row, then per step sleeps its W2 delay, inserts a journal
    row, then updates its run row and inserts a checkpoint row (two writes awaited per step,
    each in the next group commit, as tether does). (wall s, CPU s)."""
    loop = asyncio.get_running_loop()
    tmp = tempfile.mkdtemp(prefix="tether_floor_")
    conn = sqlite3.connect(os.path.join(tmp, "floor.db"), isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE runs (id TEXT PRIMARY KEY, step INT, input BLOB, at REAL)")
        conn.execute("CREATE TABLE cps (id TEXT, step INT, data BLOB, at REAL, "
                     "PRIMARY KEY (id, step)) WITHOUT ROWID")
        conn.execute("CREATE TABLE journal (id TEXT, step INT, result BLOB, "
                     "PRIMARY KEY (id, step)) WITHOUT ROWID")
        Stmt = tuple[str, tuple[Any, ...]]
        pending: list[tuple[tuple[Stmt, ...], asyncio.Future[None]]] = []

        def flush() -> None:
            batch = pending[:]
            pending.clear()
            conn.execute("BEGIN IMMEDIATE")
            for stmts, _ in batch:
                for sql, params in stmts:
                    conn.execute(sql, params)
            conn.execute("COMMIT")
            for _, fut in batch:
                fut.set_result(None)

        def write(*stmts: Stmt) -> asyncio.Future[None]:
            fut: asyncio.Future[None] = loop.create_future()
            if not pending:
                loop.call_soon(flush)
            pending.append((stmts, fut))
            return fut

        async def one(i: int) -> None:
            tid = f"w2-{i:05d}"
            await write(("INSERT INTO runs VALUES (?, 0, ?, ?)", (tid, b"{}", time.time())))
            for step, delay in enumerate(w2_delays(i), 1):
                await asyncio.sleep(delay)
                await write(("INSERT INTO journal VALUES (?, ?, ?)", (tid, step, b'"ok"')))
                await write(("UPDATE runs SET step = ?, at = ? WHERE id = ?",
                             (step, time.time(), tid)),
                            ("INSERT INTO cps VALUES (?, ?, ?, ?)",
                             (tid, step, b'{"a":{"replies":["ok"]}}', time.time())))

        with gc_tuned(runs):  # the collector settings a worker of that concurrency runs with
            t0, cpu0 = time.perf_counter(), time.process_time()
            await asyncio.gather(*(one(i) for i in range(runs)))
            return time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        conn.close()
        shutil.rmtree(tmp, ignore_errors=True)


async def w2_bare(runs: int) -> tuple[float, float]:
    """The bare asyncio loop for W2: the same `runs` coroutines making the same sleeps, with
    no persistence at all (under the collector settings a worker of that concurrency runs
    with). (wall s, CPU s)."""
    async def one(i: int) -> None:
        for delay in w2_delays(i):
            await asyncio.sleep(delay)

    with gc_tuned(runs):
        t0, cpu0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one(i) for i in range(runs)))
        return time.perf_counter() - t0, time.process_time() - cpu0


def observed(runtime: tether.Runtime) -> Callable[[], int | None]:
    """$TETHER_BENCH_OBSERVE (comma-separated): "metrics" attaches the Prometheus counters,
    "tracing" the OpenTelemetry observer on an SDK provider whose batch processor exports to
    a no-op exporter; what the observability costs a W2 worker. Diagnostics: "sdk_only" with
    "tracing" sets the SDK up but traces nothing, "null_observer" attaches an observer that
    stores nothing and hears nothing (what being observed at all costs). Returns the flush to call
    after the measured part (the exporter's backlog is not the worker's cost): the number of
    spans the exporter got (None without tracing), so that spans the processor dropped (its
    queue full) cannot pass for cheap ones."""
    wanted = {w.strip() for w in os.environ.get("TETHER_BENCH_OBSERVE", "").split(",") if w}
    from .. import observe

    flushes: list[Callable[[], object]] = []
    exported: list[int] = []
    if "metrics" in wanted:
        observe.enable_metrics(runtime, "TETHER_BENCH_OBSERVE=metrics")
    if "tracing" in wanted:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )

        class Nowhere(SpanExporter):
            def export(self, spans: Sequence[object]) -> SpanExportResult:
                exported.append(len(spans))
                return SpanExportResult.SUCCESS

        provider = TracerProvider()
        # The processor's defaults but for a queue that cannot fill up (the no-op exporter
        # keeps up; the count of spans exported checks that none was dropped).
        provider.add_span_processor(BatchSpanProcessor(Nowhere(), max_queue_size=1 << 20))
        if "sdk_only" not in wanted:
            observe.enable_tracing(runtime, provider.get_tracer("tether"))
        flushes.append(provider.shutdown)
    if "null_observer" in wanted:
        runtime.hub.observe(_NullObserver())
    def flush() -> int | None:
        for f in flushes:
            f()
        return sum(exported) if "tracing" in wanted else None

    return flush


class _NullObserver:
    """An observer of nothing: no trace context stored, no run observed."""

    def run_created(self, new: object, parent: object, traceparent: str | None,
                    at: float) -> str | None:
        return None

    def run_observer(self, run: object, worker: str) -> None:
        return None

    def effect(self, effect: object, outcome: str, started: float, finished: float) -> None:
        pass

    def worker_started(self, worker: object) -> None:
        pass

    def worker_stopped(self, worker: object) -> None:
        pass


W2_PATHS = ("handover", "queued")


async def w2(backend: str, runs: int, path: str = "handover") -> list[Result]:
    """`runs` runs started at once, 5 steps each, each step one journaled simulated LLM call;
    one worker with concurrency = runs in this process, started as a program writes it
    (`runtime.work(concurrency=runs)`, no other argument). `path`: "handover", the runs are
    started while the worker runs (each handed to it as it is created); "queued", all are
    started before the worker (queued, then claimed), as after a burst or a restart. The
    clock starts before the first start either way."""
    delays = [w2_delays(i) for i in range(runs)]
    ideal = max(sum(d) for d in delays)
    async with bench_db(backend) as url:
        runtime = tether.Runtime(url, agents=[w2_agent], version="bench")
        await runtime.migrate()
        flush = observed(runtime)
        async with runtime:
            stop = asyncio.Event()

            def start_worker() -> asyncio.Task[None]:
                return asyncio.create_task(runtime.work(concurrency=runs, stop=stop))

            if path == "handover":
                worker = start_worker()
                await asyncio.sleep(0)  # the worker is up and polling before the clock starts
            t0_unix, t0, cpu0 = time.time(), time.perf_counter(), time.process_time()
            started = await asyncio.gather(*(
                runtime.start(w2_agent, {"delays": d, "replies": []}, thread_id=f"w2-{i:05d}")
                for i, d in enumerate(delays)
            ))
            t_started = time.perf_counter()
            if path == "queued":
                worker = start_worker()
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
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            first_steps, last_step = await checkpoint_times(url)
            await stop_worker(stop, worker)
        spans = flush()
        bad = [r for r in done if r.status is not tether.RunStatus.COMPLETED
               or len(r.state["replies"]) != W2_STEPS]
        if bad:
            raise RuntimeError(f"W2: {len(bad)} runs did not complete 5 steps, e.g. {bad[0]}")
    s = suffix(runs)
    measured = [
        Result(backend, "W2", f"wall_s_{s}", round(wall, 3), "s"),
        Result(backend, "W2", f"ideal_s_{s}", round(ideal, 3), "s"),
        Result(backend, "W2", f"wall_over_ideal_{s}", round(wall / ideal, 3), "x"),
        Result(backend, "W2", f"cpu_s_{s}", round(cpu, 3), "s"),
        Result(backend, "W2", f"cpu_us_per_step_{s}", round(cpu / (runs * W2_STEPS) * 1e6, 1),
               "us"),
        Result(backend, "W2", f"start_s_{s}", round(t_started - t0, 3), "s"),
        Result(backend, "W2", f"last_first_step_s_{s}", round(first_steps - t0_unix, 3), "s"),
        Result(backend, "W2", f"last_checkpoint_s_{s}", round(last_step - t0_unix, 3), "s"),
        Result(backend, "W2", f"peak_rss_mib_{s}", round(peak_rss_mib(), 1), "MiB"),
    ]
    if spans is not None:
        measured.append(Result(backend, "W2", f"spans_exported_{s}", spans, "spans"))
    if os.environ.get("TETHER_BENCH_W2_FLOOR") == "0":  # bench.observe: the floor is not its
        return measured                                 # reference, and it takes a while
    floor_wall, floor_cpu = await w2_floor(runs)
    bare_wall, bare_cpu = await w2_bare(runs)
    return [
        *measured,
        Result(backend, "W2", f"bare_wall_over_ideal_{s}", round(bare_wall / ideal, 3), "x"),
        Result(backend, "W2", f"bare_cpu_s_{s}", round(bare_cpu, 3), "s"),
        Result(backend, "W2", f"wall_vs_bare_{s}", round(wall / bare_wall, 3), "x"),
        Result(backend, "W2", f"wall_vs_floor_{s}", round(wall / floor_wall, 3), "x"),
        Result(backend, "W2", f"floor_wall_over_ideal_{s}", round(floor_wall / ideal, 3), "x"),
        Result(backend, "W2", f"floor_cpu_s_{s}", round(floor_cpu, 3), "s"),
        Result(backend, "W2", f"cpu_vs_floor_{s}", round(cpu / floor_cpu, 3), "x"),
    ]
