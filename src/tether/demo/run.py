"""The demo's parts. Each runs in a fresh temporary directory on embedded SQLite, with real
worker subprocesses (`python -m tether worker --app tether.demo.app:runtime`)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..config import ENV_PREFIX, TYPES
from ..errors import TetherError

con = Console()


@dataclass
class Outcome:
    part: str
    ok: bool
    summary: str
    details: list[str] = field(default_factory=list)


class Sandbox:
    """A temp dir with the demo database, a call log and an effect sink."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="tether-demo-")
        self.db = f"sqlite:///{os.path.join(self.dir, 'demo.db')}"
        self.calls = os.path.join(self.dir, "calls.log")
        self.sink = os.path.join(self.dir, "sink.log")
        # Every worker is given --db and every runtime here with_db(): no TETHER_* setting of
        # the shell reaches a part (a child that picks its own databases must get its own).
        self.env = {**own_settings_env(), "DEMO_CALL_LOG": self.calls, "DEMO_SINK": self.sink}
        os.environ.update({k: self.env[k] for k in ("DEMO_CALL_LOG", "DEMO_SINK")})

    def worker(self, **extra: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "tether", "worker", "--app", "tether.demo.app:runtime",
             "--db", self.db, "--concurrency", "50"],
            env={**self.env, **extra}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def lines(self, path: str) -> list[str]:
        if not os.path.exists(path):
            return []
        with open(path) as f:
            return [ln for ln in f.read().split("\n") if ln]

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def own_settings_env() -> dict[str, str]:
    """This process's environment without tether's settings (TETHER_DB, TETHER_APP, ...)."""
    drop = {ENV_PREFIX + name.upper() for name in (*TYPES, "app")}
    return {k: v for k, v in os.environ.items() if k not in drop}


class PartFailed(TetherError):
    """A child process of a demo part exited non-zero (its last error line says why)."""


async def child_output(*args: str, cwd: str | None = None) -> str:
    """The stdout of `python ARGS` (tether's settings not passed on); PartFailed with the last
    line of its stderr if it exits non-zero."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        cwd=cwd, env=own_settings_env())
    out, err = await proc.communicate()
    if proc.returncode != 0:
        last = next((ln for ln in reversed(err.decode(errors="replace").splitlines())
                     if ln.strip()), "no error output")
        raise PartFailed(f"`python {' '.join(args)}` exited with status {proc.returncode}: "
                         f"{last.strip()}")
    return out.decode()


CPU_WORKLOAD = ("-m", "tether.bench.workloads", "C", "sqlite", "200", "10", "100", "1")
"""Bench workload C at the demo's size: 200 I/O-bound runs beside 10 CPU-bound ones."""


def _runtime(box: Sandbox) -> Any:
    from . import app

    return app.runtime.with_db(box.db)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            _kill(proc)


async def part_crash(box: Sandbox, progress: Progress) -> Outcome:
    """Checkpoint resume after a real crash: SIGKILL worker A mid-run, worker B resumes."""
    from . import app

    rt = _runtime(box)
    await rt.migrate()
    runs, parts = 8, 6
    task = progress.add_task("crash: steps committed", total=runs * parts)
    async with rt:
        ids = [(await rt.start(app.research, {"topic": f"topic {i}", "parts": parts})).thread_id
               for i in range(runs)]
        a = box.worker()
        try:
            while True:
                await asyncio.sleep(0.05)
                done = sum([(await rt.get(t)).step for t in ids])
                progress.update(task, completed=done)
                if done >= runs * parts // 2:
                    break
        finally:
            _kill(a)
        before = {t: (await rt.get(t)).step for t in ids}
        killed_at = time.monotonic()
        b = box.worker()
        try:
            while True:
                runs_now = [await rt.get(t) for t in ids]
                progress.update(task, completed=sum(r.step for r in runs_now))
                if all(r.status.terminal for r in runs_now):
                    break
                await asyncio.sleep(0.05)
        finally:
            _stop(b)
        recovered = time.monotonic() - killed_at
        calls = Counter(box.lines(box.calls))
        dup_steps, workers_seen = 0, set[str]()
        statuses: Counter[str] = Counter()
        for t in ids:
            cps = await rt.checkpoints(t)
            dup_steps += len(cps) - len({c.step for c in cps})
            workers_seen |= {c.worker.rsplit(":", 1)[0] for c in cps}
            statuses[(await rt.get(t)).status.value] += 1
        repeated = sum(n - 1 for n in calls.values())
    ok = statuses["completed"] == runs and dup_steps == 0
    return Outcome("crash", ok,
                   f"SIGKILL after {sum(before.values())}/{runs * parts} steps; all {runs} runs "
                   f"completed {recovered:.1f}s later; 0 steps redone" if ok else "FAILED",
                   [f"steps before the kill per run: {sorted(before.values())}",
                    f"checkpoints committed twice: {dup_steps}",
                    f"LLM calls repeated (in flight at the kill, never journaled): {repeated}",
                    f"worker processes that committed steps: {len(workers_seen)}"])


async def part_queue(box: Sandbox, progress: Progress) -> Outcome:
    """A per-agent queue stepping Idle -> Processing -> Response -> Idle."""
    from . import app

    rt = _runtime(box)
    await rt.migrate()
    task = progress.add_task("queue: messages answered", total=3)
    seen: list[str] = []
    async with rt:
        stop = asyncio.Event()
        worker = asyncio.create_task(rt.work(concurrency=4, stop=stop))
        run = await rt.start(app.answerer, {})

        async def watch() -> None:
            async for ev in rt.subscribe(run.thread_id):
                if ev["type"] in ("idle", "processing", "response"):
                    seen.append(ev["type"])

        watcher = asyncio.create_task(watch())
        await asyncio.sleep(0.2)
        for i in range(3):
            await rt.send(run.thread_id, f"question {i + 1}")
            for _ in range(100):
                await asyncio.sleep(0.05)
                if (await rt.get(run.thread_id)).state.get("answered", 0) > i:
                    break
            progress.update(task, completed=i + 1)
        final = await rt.get(run.thread_id)
        watcher.cancel()
        stop.set()
        await worker
    cycle = " -> ".join(s.capitalize() for s in seen[:7])
    ok = final.state.get("answered") == 3 and final.actor_state == "idle"
    return Outcome("queue", ok, f"3 messages answered; states: {cycle}",
                   ["Idle means parked: the run is only a row, no task or connection held"])


async def part_hitl(box: Sandbox, progress: Progress) -> Outcome:
    """A run waits for a person (no worker held), is answered, and finishes."""
    from . import app

    rt = _runtime(box)
    await rt.migrate()
    task = progress.add_task("human in the loop", total=3)
    async with rt:
        run = await rt.start(app.approval, {"customer": "ada"})
        a = box.worker()
        try:
            for _ in range(200):
                await asyncio.sleep(0.05)
                if (await rt.get(run.thread_id)).status.value == "waiting":
                    break
        finally:
            _kill(a)  # nobody needs to stay up while a person thinks
        progress.update(task, completed=1)
        pending = await rt.interrupts(thread_id=run.thread_id)
        await rt.resume(run.thread_id, True)
        progress.update(task, completed=2)
        b = box.worker()
        try:
            final = await rt.wait(run.thread_id, timeout=30)
        finally:
            _stop(b)
        progress.update(task, completed=3)
    calls = len(box.lines(box.calls))
    ok = final.status.value == "completed" and final.state.get("approved") is True
    return Outcome("hitl", ok,
                   f"waited with worker A killed; answered; finished on worker B ({calls} LLM call)",
                   [f"question asked: {pending[0].payload['question'] if pending else '?'}",
                    "the drafted text was replayed from the journal, not re-generated"])


async def part_effect(box: Sandbox, progress: Progress) -> Outcome:
    """An effect performed once despite a crash between the side effect and its done mark."""
    from . import app

    rt = _runtime(box)
    await rt.migrate()
    task = progress.add_task("effect: charged once", total=2)
    async with rt:
        run = await rt.start(app.payments, {"customer": "ada", "amount": 42})
        a = box.worker(DEMO_EFFECT_DELAY="30")  # performs the charge, then stalls before "done"
        try:
            for _ in range(200):
                await asyncio.sleep(0.05)
                if box.lines(box.sink):
                    break
        finally:
            _kill(a)
        progress.update(task, completed=1)
        b = box.worker()
        try:
            for _ in range(400):
                effects = await rt.effects(run.thread_id)
                if effects and effects[0].status == "done":
                    break
                await asyncio.sleep(0.05)
        finally:
            _stop(b)
        progress.update(task, completed=2)
    deliveries = box.lines(box.sink)
    keys = {d.split(",")[0] for d in deliveries}
    ok = len(keys) == 1 and effects[0].status == "done"
    return Outcome("effect", ok,
                   f"handler called {len(deliveries)}x with one dedup key -> charged once "
                   "by an idempotent consumer",
                   [f"key: {next(iter(keys)) if keys else '-'}",
                    f"attempts recorded: {effects[0].attempts if effects else 0}"])


async def part_async(box: Sandbox, progress: Progress) -> Outcome:
    """500 and 10,000 concurrent simulated LLM calls: asyncio versus one thread per call; and
    CPU-bound steps beside I/O-bound runs, inline versus offloaded with ctx.cpu_call."""
    rows: list[dict[str, Any]] = []
    variants = [(k, n) for n in (500, 10_000) for k in ("asyncio", "threads")]
    task = progress.add_task("async vs threads", total=len(variants))
    for kind, n in variants:
        rows.append(json.loads(await child_output("-m", "tether.demo.concurrency", kind, str(n))))
        progress.advance(task)
    details = [f"{r['variant']:<7} n={r['n']:>6}: wall {r['wall_s']:.2f}s "
               f"({r['wall_s'] / r['ideal_s']:.1f}x ideal), peak RSS {r['peak_rss_mib']} MiB, "
               f"{r['kib_per_call']} KiB per live call, at most {r['max_alive']} alive, "
               f"virtual {r['virtual_peak_mib']:.0f} MiB" for r in rows]
    # Separate the I/O layer from the CPU layer: 200 I/O-bound runs beside 10 runs whose
    # steps burn 100 ms of CPU, inline on the loop versus ctx.cpu_call (bench workload C, on
    # fresh databases of its own in the sandbox).
    out = await child_output(*CPU_WORKLOAD, cwd=box.dir)
    cpu = {json.loads(line)["metric"]: json.loads(line)["value"]
           for line in out.splitlines() if line.startswith("{")}
    details.append(
        "CPU work beside 200 I/O-bound runs, their wall/ideal: alone "
        f"{cpu['w2_wall_over_ideal_alone']}x, CPU inline {cpu['w2_wall_over_ideal_cpu_inline']}x,"
        f" offloaded with ctx.cpu_call {cpu['w2_wall_over_ideal_cpu_offloaded']}x")
    big = {r["variant"]: r for r in rows if r["n"] == 10_000}
    return Outcome("async", True,
                   f"10,000 calls: asyncio {big['asyncio']['wall_s']:.2f}s, "
                   f"threads {big['threads']['wall_s']:.2f}s "
                   f"(threads never had more than {big['threads']['max_alive']} alive)", details)


async def part_deploy(box: Sandbox, progress: Progress) -> Outcome:
    """Two versions at once: half of new thread_ids to each, v1's in-flight runs finish on
    v1 uninterrupted, then v1 drains and retires."""
    from . import versions

    def worker(app: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "tether", "worker", "--app", f"tether.demo.versions:{app}",
             "--db", box.db, "--concurrency", "100", "--lease-ttl", "2"],
            env=box.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    async def until(check: Callable[[], Awaitable[bool]], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not await check():
            if time.monotonic() > deadline:
                raise TimeoutError("the deploy demo did not progress")
            await asyncio.sleep(0.1)

    rt = versions.v1().with_db(box.db, lease_ttl=2.0)
    await rt.migrate()
    task = progress.add_task("rainbow deploy", total=5)
    a = worker("v1")
    b: subprocess.Popen[bytes] | None = None
    async with rt:
        try:
            await until(lambda: _serving(rt, {"v1"}), 30)
            long = [await rt.start("ticket", {"steps": 8, "pause": 0.5}) for _ in range(20)]
            progress.update(task, completed=1)  # v1 alone, 20 long runs in flight
            b = worker("v2")
            await until(lambda: _serving(rt, {"v1", "v2"}), 30)
            await rt.route({"v1": 50, "v2": 50})
            new = [await rt.start("ticket", {"steps": 2}) for _ in range(200)]
            split = Counter(r.version for r in new)
            progress.update(task, completed=2)
            await rt.drain("v1")
            after = Counter([(await rt.start("ticket", {"steps": 1})).version
                             for _ in range(50)])
            refused = ""
            try:
                await rt.retire("v1")
            except TetherError as exc:
                refused = str(exc).split(":")[0]
            progress.update(task, completed=3)

            async def drained() -> bool:
                return any(d.version == "v1" and d.state == "drained"
                           for d in await rt.deployments())

            await until(drained, 90)
            progress.update(task, completed=4)
            await rt.retire("v1")
            finals = [await rt.wait(r.thread_id, timeout=60) for r in long + new]
            steady = [cp.attempt == 1 for r in long for cp in await rt.checkpoints(r.thread_id)]
            progress.update(task, completed=5)
        finally:
            _stop(a)
            if b is not None:
                _stop(b)
    answers = Counter(r.state.get("answer", "?").split(":")[0] for r in finals)
    ok = (all(r.status.value == "completed" for r in finals) and all(steady)
          and after == Counter({"v2": 50}) and bool(refused)
          and all(r.version == "v1" for r in long) and 70 <= split["v1"] <= 130)
    return Outcome("deploy", ok,
                   f"200 new runs routed 50/50: {split['v1']} on v1, {split['v2']} on v2; "
                   "20 long v1 runs finished on v1 uninterrupted; v1 drained and retired",
                   [f"after `drain v1`: {after['v2']} of 50 new runs on v2",
                    f"retire before drained: refused ({refused})",
                    f"answers: {answers['v1']} from v1, {answers['v2']} from v2 (v2 also "
                    "ran its new `review` node)"])


async def _serving(rt: Any, versions: set[str]) -> bool:
    return versions <= {w.version for w in await rt.workers() if w.alive}


PARTS: dict[str, Callable[[Sandbox, Progress], Awaitable[Outcome]]] = {
    "crash": part_crash, "queue": part_queue, "hitl": part_hitl, "effect": part_effect,
    "async": part_async, "deploy": part_deploy,
}


async def run_demo(parts: list[str]) -> int:
    t0 = time.monotonic()
    outcomes: list[Outcome] = []
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/"
                  "{task.total}"), TimeElapsedColumn(), console=con) as progress:
        for name in parts:
            box = Sandbox()
            try:
                outcomes.append(await PARTS[name](box, progress))
            except Exception as exc:  # a failed part is reported, the others still run
                why = str(exc) if isinstance(exc, TetherError) else repr(exc)
                outcomes.append(Outcome(name, False, f"error: {why}"))
            finally:
                box.close()
    table = Table("part", "result", "what happened", title="tether demo (embedded SQLite)")
    for o in outcomes:
        table.add_row(o.part, "[green]ok[/green]" if o.ok else "[red]FAILED[/red]",
                      "\n".join([o.summary, *o.details]))
    con.print(table)
    con.print(f"finished in {time.monotonic() - t0:.1f}s")
    failed = [o.part for o in outcomes if not o.ok]
    if failed:
        con.print(f"[red]FAILED[/red]: {', '.join(failed)} (exit status 1)")
    return 1 if failed else 0
