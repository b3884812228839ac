"""W3: crash and resume. R runs x S steps in `tether worker` process A; each step performs one
side effect outside the engine, then sleeps 20 ms. A is SIGKILLed after about half of all
steps; worker B is started at once. Measured: seconds from the kill until every run is
complete, steps executed more than once, duplicate side effects, runs lost.

Two variants, both honest about what a user gets:

- `plain`: the node appends "run,step" to the effects log itself (O_APPEND, one write(2), so
  it is in the kernel once the call returns). A step in flight at the kill ran on A and runs
  again on B from its last checkpoint: its side effect happens twice.
- `outbox`: the node requests the effect with `ctx.effect`; it is committed with the step's
  checkpoint and performed after the commit by a handler that appends "run,step,key" to the
  log unless the key is there already (a dedup by key under flock, as an idempotent handler
  must be). A step in flight at the kill re-executes, but its effect was never committed;
  an effect performed whose done mark was lost is delivered again and absorbed by the dedup.
  The node also appends "run,step" to an executions log, to count re-executed steps.

The workers are the user's `tether worker --app tether.bench.crash:make_runtime` with
`--lease-ttl W3_LEASE_TTL` (2 s, what one sets for fast recovery; the default is 30 s).
"""

from __future__ import annotations

import asyncio
import collections
import fcntl
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import tether

from .common import (
    PartialFailure,
    Result,
    StatusCounts,
    WorkerProcesses,
    append_line,
    bench_db,
)

W3_RUNS, W3_STEPS = 100, 10
W3_STEP_SLEEP = 0.020
W3_LEASE_TTL = 2.0
W3_CONCURRENCY = 100  # tether worker's default
W3_DEADLINE = 120.0  # s after the kill before the runs still not complete count as lost
APP = "tether.bench.crash:make_runtime"
LOG_ENV = "TETHER_BENCH_W3_LOG"  # the side effect: "run,step" (plain) or "run,step,key" lines
EXEC_ENV = "TETHER_BENCH_W3_EXEC"  # outbox variant: "run,step" per execution of a step
REDELIVERED_ENV = "TETHER_BENCH_W3_REDELIVERED"  # keys the handler found done already
VARIANTS = ("plain", "outbox")

plain_agent = tether.Agent("bench_w3")
outbox_agent = tether.Agent("bench_w3_outbox")


def _next(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    if ctx.step >= state["steps"]:
        return tether.finish({"finished": True})
    return tether.goto("step")


@plain_agent.node(name="step", start=True)
async def plain_step(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    append_line(os.environ[LOG_ENV], f"{state['run']},{ctx.step}\n")
    await asyncio.sleep(W3_STEP_SLEEP)
    return _next(state, ctx)


@outbox_agent.node(name="step", start=True)
async def outbox_step(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    append_line(os.environ[EXEC_ENV], f"{state['run']},{ctx.step}\n")
    ctx.effect("w3.append", {"run": state["run"], "step": ctx.step})
    await asyncio.sleep(W3_STEP_SLEEP)
    return _next(state, ctx)


class DedupLog:
    """An append-only file of "...,key" lines that takes each key once, across processes:
    under an exclusive flock, read the lines added since this process last looked, then
    append unless the key is among them."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.keys: set[str] = set()
        self.offset = 0

    def append_once(self, line: str, key: str) -> bool:
        """Append `line,key`; False (nothing written) if the key is in the file already."""
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            if size > self.offset:
                new = os.pread(fd, size - self.offset, self.offset).decode()
                self.keys.update(raw.rsplit(",", 1)[1] for raw in new.splitlines())
                self.offset = size
            if key in self.keys:
                return False
            data = f"{line},{key}\n".encode()
            os.write(fd, data)
            self.keys.add(key)
            self.offset += len(data)
            return True
        finally:
            os.close(fd)  # releases the lock


_logs: dict[str, DedupLog] = {}


async def append_effect(payload: dict[str, Any], key: str) -> None:
    """The outbox variant's handler: idempotent on `key`."""
    path = os.environ[LOG_ENV]
    log = _logs.setdefault(path, DedupLog(path))
    if not log.append_once(f"{payload['run']},{payload['step']}", key):
        append_line(os.environ[REDELIVERED_ENV], key + "\n")


def make_runtime() -> tether.Runtime:
    """The app `tether worker --app tether.bench.crash:make_runtime` loads (db: $TETHER_DB)."""
    rt = tether.Runtime(os.environ.get("TETHER_DB"), agents=[plain_agent, outbox_agent],
                        version="bench")
    rt.effect("w3.append")(append_effect)
    return rt


def count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0


def read_pairs(path: Path) -> collections.Counter[tuple[int, int]]:
    """(run, step) -> how many lines of the log name it."""
    if not path.exists():
        return collections.Counter()
    return collections.Counter((int(a[0]), int(a[1])) for a in
                               (raw.split(",") for raw in path.read_text().splitlines()))


async def until_lines(path: Path, n: int, workers: WorkerProcesses, deadline: float) -> int:
    """Poll the log until it has `n` lines; returns the count seen."""
    while True:
        seen = count_lines(path)
        if seen >= n:
            return seen
        workers.check()
        if time.perf_counter() > deadline:
            raise RuntimeError(f"W3: worker A wrote {seen} of the {n} steps to wait for")
        await asyncio.sleep(0.002)


async def w3(backend: str, variant: str = "plain", runs: int = W3_RUNS, steps: int = W3_STEPS,
             lease_ttl: float = W3_LEASE_TTL) -> list[Result]:
    if variant not in VARIANTS:
        raise ValueError(f"W3 variant must be one of {VARIANTS}, got {variant!r}")
    agent = plain_agent if variant == "plain" else outbox_agent
    total = runs * steps
    tmp = Path(tempfile.mkdtemp(prefix="tether_bench_w3_"))
    log, redelivered = tmp / "effects.log", tmp / "redelivered.log"
    executions = log if variant == "plain" else tmp / "executions.log"
    env = {LOG_ENV: str(log), EXEC_ENV: str(executions), REDELIVERED_ENV: str(redelivered)}
    try:
        async with bench_db(backend) as url:
            runtime = tether.Runtime(url, agents=[agent], version="bench")
            await runtime.migrate()
            async with runtime:
                for lo in range(0, runs, 500):
                    await asyncio.gather(*(
                        runtime.start(agent, {"run": i, "steps": steps}, thread_id=f"w3-{i:05d}")
                        for i in range(lo, min(lo + 500, runs))))
            with WorkerProcesses(url, APP, tmp, env) as workers:
                async with StatusCounts(url) as counts:
                    a = workers.start(concurrency=W3_CONCURRENCY, lease_ttl=lease_ttl)
                    await until_lines(executions, total // 2, workers, time.perf_counter() + 60)
                    workers.kill(a)
                    t_kill = time.perf_counter()
                    steps_at_kill = count_lines(executions)
                    done_at_kill = (await counts.get()).get("completed", 0)
                    workers.start(concurrency=W3_CONCURRENCY, lease_ttl=lease_ttl)
                    deadline = t_kill + lease_ttl + W3_DEADLINE
                    why = ""
                    try:
                        t_done: float | None = await counts.until(
                            "completed", runs, deadline, "W3", interval=0.01, check=workers.check)
                    except RuntimeError as exc:  # gave up, or worker B died: the runs are lost
                        t_done, why = None, f" ({exc})"
                    settled = None
                    if variant == "outbox" and t_done is not None:
                        while (await counts.outbox()).get("done", 0) < total:
                            workers.check()
                            if time.perf_counter() > deadline:
                                break
                            await asyncio.sleep(0.01)
                        else:
                            settled = time.perf_counter() - t_kill
                    workers.stop()
                    status = await counts.get()
            async with tether.Runtime(url, agents=[agent], version="bench") as rt:
                by_run = {i: await rt.checkpoints(f"w3-{i:05d}") for i in range(runs)}
                finished = {i for i in range(runs)
                            if (await rt.get(f"w3-{i:05d}")).status is tether.RunStatus.COMPLETED}
        execs, effects = read_pairs(executions), read_pairs(log)
        redeliveries = count_lines(redelivered)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    want = {(i, k) for i in range(runs) for k in range(1, steps + 1)}
    missing_runs = {i for i, _ in want - set(effects)}
    lost = sorted(set(range(runs)) - finished | missing_runs)
    reclaimed = sum(1 for cps in by_run.values() for cp in cps if cp.attempt > 1)
    double_committed = sum(n - 1 for n in collections.Counter(
        (i, cp.step) for i, cps in by_run.items() for cp in cps).values() if n > 1)
    sfx = "" if variant == "plain" else "_outbox"
    out = [
        ("runs", runs, "count"), ("steps", total, "count"),
        ("steps_at_kill", steps_at_kill, "count"), ("runs_done_at_kill", done_at_kill, "count"),
        ("recovery_s", round(t_done - t_kill, 3) if t_done is not None else -1.0, "s"),
        ("repeated_steps", sum(n - 1 for n in execs.values() if n > 1), "count"),
        ("repeated_steps_ckpt", reclaimed, "count"),
        ("double_committed_steps", double_committed, "count"),
        ("duplicate_effects", sum(n - 1 for n in effects.values() if n > 1), "count"),
        ("lost_runs", len(lost), "count"),
        ("lease_ttl_s", lease_ttl, "s"),
    ]
    if variant == "outbox":
        out.insert(5, ("effects_settled_s", round(settled, 3) if settled is not None else -1.0,
                       "s"))
        out.append(("redelivered_effects", redeliveries, "count"))
    results = [Result(backend, "W3", f"{m}{sfx}", v, u) for m, v, u in out]
    if lost or t_done is None:
        raise PartialFailure(f"W3 {variant}: {len(lost)} runs lost (not complete within "
                             f"{W3_DEADLINE:g} s of the kill, or a step's effect missing): "
                             f"{lost[:5]}; runs by status {status}{why}", results)
    return results
