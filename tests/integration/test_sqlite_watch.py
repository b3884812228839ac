"""SQLite has no notification between processes: while a worker claims, its store watches for
other connections' commits (sqlite_watch.py) and wakes the worker when one has queued a run
for it, long before its next poll; another process busy writing other things wakes it for
nothing (each claim is a write transaction, which would take the lock from that process)."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import tether
from tether import RunStatus

agent = tether.Agent("echo")


@agent.node(start=True)
async def echo(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    return tether.finish({"echoed": True})


# Another process: its own runtime (no worker) starts one run, which is queued.
START = """
import asyncio, sys
import tether
agent = tether.Agent("echo")

@agent.node(start=True)
async def echo(state, ctx):
    return tether.finish({})

async def main():
    async with tether.Runtime(sys.argv[1], agents=[agent]) as rt:
        run = await rt.start("echo", {}, thread_id=sys.argv[2])
        assert run.status == "queued", run.status

asyncio.run(main())
"""

POLL = 10.0  # the worker's poll: far longer than any wake-up the test waits for


async def _worker(url: str) -> tuple[tether.Runtime, asyncio.Event, asyncio.Task[None]]:
    rt = tether.Runtime(url, agents=[agent], poll_interval=POLL)
    await rt.migrate()
    stop = asyncio.Event()
    task = asyncio.create_task(rt.work(stop=stop))
    for _ in range(3000):
        if any(w.alive for w in await rt.workers()):
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # its first claim is done: it now waits up to POLL for work
    return rt, stop, task


async def _stop(rt: tether.Runtime, stop: asyncio.Event, task: asyncio.Task[None]) -> None:
    stop.set()
    await asyncio.wait_for(task, 30)
    await rt.close()


async def test_a_run_queued_by_another_process_is_claimed_at_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    rt, stop, task = await _worker(url)
    try:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", START, url, "t1")
        assert await asyncio.wait_for(proc.wait(), 60) == 0
        t0 = time.monotonic()
        done = await asyncio.wait_for(rt.wait("t1"), 3)  # the poll would take up to 10 s
        assert done.status is RunStatus.COMPLETED
        assert time.monotonic() - t0 < 3
    finally:
        await _stop(rt, stop, task)


async def test_another_process_busy_writing_does_not_make_the_worker_claim(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    rt, stop, task = await _worker(url)
    claims = 0
    claim_runs = rt.store.claim_runs

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal claims
        claims += 1
        return await claim_runs(*args, **kwargs)

    monkeypatch.setattr(rt.store, "claim_runs", counted)
    commits = 0
    done = threading.Event()

    def busy() -> None:  # another connection (as another process would) commits every ms
        nonlocal commits
        db = sqlite3.connect(tmp_path / "t.db", isolation_level=None, timeout=5)
        try:
            db.execute("CREATE TABLE IF NOT EXISTS scratch (n INTEGER)")
            while not done.wait(0.001):
                db.execute("INSERT INTO scratch VALUES (1)")
                commits += 1
        finally:
            db.close()

    thread = threading.Thread(target=busy)
    thread.start()
    try:
        await asyncio.sleep(1.0)
    finally:
        done.set()
        thread.join()
        await _stop(rt, stop, task)
    assert commits > 100
    assert claims <= 1  # its poll (every 10 s) at most, not one claim per commit seen
