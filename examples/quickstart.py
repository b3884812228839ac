"""Quickstart: a run survives a killed worker (embedded SQLite, no server needed).

    python examples/quickstart.py                  # on a fresh SQLite file, removed afterwards
    python examples/quickstart.py --db URL         # on a database of yours

Starts 5 research runs, runs a worker in a subprocess, SIGKILLs it mid-run, starts a second
worker, and shows that every run finished from its last checkpoint: no step committed twice,
and journaled LLM calls were only repeated for the call in flight at the kill.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter

import tether

agent = tether.Agent("researcher")
# Where the worker subprocesses log each LLM call they start: main() chooses it.
CALL_LOG = os.environ.get("QUICKSTART_CALL_LOG", "")


async def fake_llm(prompt: str) -> str:
    """A simulated LLM call: slow, and logged so we can count real invocations."""
    if CALL_LOG:
        with open(CALL_LOG, "a") as f:  # logged when the call starts
            f.write(prompt + "\n")
    await asyncio.sleep(random.uniform(0.15, 0.3))
    return f"notes on {prompt}"


@agent.node(start=True)
async def plan(state: dict, ctx: tether.Context) -> tether.Command:
    return tether.goto("research", {"topics": [f"{state['question']} #{i}" for i in range(4)],
                                    "notes": []})


@agent.node
async def research(state: dict, ctx: tether.Context) -> tether.Command:
    done = len(state["notes"])
    topic = state["topics"][done]
    note = await ctx.call(fake_llm, f"{ctx.thread_id}|{topic}")
    nxt = "research" if done + 1 < len(state["topics"]) else "write"
    return tether.goto(nxt, {"notes": tether.append([note])})


@agent.node
async def write(state: dict, ctx: tether.Context) -> tether.Command:
    return tether.finish({"report": " / ".join(state["notes"])})


def make_runtime(db: str | None) -> tether.Runtime:
    return tether.Runtime(db, agents=[agent], version="v1", lease_ttl=2.0, poll_interval=0.1)


# The app of the worker subprocesses (`tether worker --app quickstart:runtime --db URL`): the
# database is the one main() chose, given as --db.
runtime = make_runtime(None)


def _worker(db: str, call_log: str) -> subprocess.Popen[bytes]:
    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "QUICKSTART_CALL_LOG": call_log, "PYTHONPATH": here}
    return subprocess.Popen(
        [sys.executable, "-m", "tether", "worker", "--app", "quickstart:runtime",
         "--db", db, "--concurrency", "10"],
        env=env, stdout=subprocess.DEVNULL,
    )


async def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="A run survives a killed worker.")
    p.add_argument("--db", help="a database URL (default: a fresh SQLite file in a temporary "
                                "folder, removed afterwards)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tether-quickstart-") as tmp:
        db = args.db or f"sqlite:///{os.path.join(tmp, 'quickstart.db')}"
        await demo(db, args.db or "a fresh SQLite file", os.path.join(tmp, "calls.log"))


async def demo(db: str, where: str, call_log: str) -> None:
    from rich.console import Console
    from rich.table import Column, Table

    con = Console()
    runtime = make_runtime(db)
    await runtime.migrate()  # as `tether migrate` does; nothing if up to date
    async with runtime:
        batch = uuid.uuid4().hex[:6]  # short whole ids, new on each run of the example
        runs = [await runtime.start(agent, {"question": f"q{i}"}, thread_id=f"q{i}-{batch}")
                for i in range(5)]
        con.print(f"started {len(runs)} runs on {where}; starting worker A")
        a = _worker(db, call_log)
        while True:  # kill A once about half of all steps are committed
            await asyncio.sleep(0.1)
            steps = sum([(await runtime.get(r.thread_id)).step for r in runs])
            if steps >= 15:
                break
        a.send_signal(signal.SIGKILL)
        a.wait()
        before = {r.thread_id: (await runtime.get(r.thread_id)).step for r in runs}
        con.print(f"[red]SIGKILLed worker A[/red] after {sum(before.values())} committed steps; "
                  "starting worker B (it takes over once A's 2 s leases expire)")
        t0 = time.monotonic()
        b = _worker(db, call_log)
        try:
            done = [await runtime.wait(r.thread_id, timeout=60) for r in runs]
        finally:
            b.send_signal(signal.SIGTERM)
            b.wait()
        con.print(f"all runs finished {time.monotonic() - t0:.1f} s after the kill")
        calls = Counter(open(call_log).read().split("\n")[:-1])
        # Fits 80 columns: the id and status are never cut, the headings wrap between words.
        table = Table(Column("thread_id", no_wrap=True), Column("status", no_wrap=True),
                      "steps before kill", "steps total", "steps committed twice",
                      "LLM calls repeated")
        for r in done:
            cps = await runtime.checkpoints(r.thread_id)
            dup_steps = len(cps) - len({c.step for c in cps})
            repeated = sum(n - 1 for k, n in calls.items() if k.startswith(r.thread_id))
            table.add_row(r.thread_id, r.status.value, str(before[r.thread_id]),
                          str(r.step), str(dup_steps), str(repeated))
        con.print(table)
        con.print("LLM calls are repeated only for a call in flight at the kill (its result "
                  "was never journaled); every other call was replayed from the journal.")


if __name__ == "__main__":
    asyncio.run(main())
