"""CPU of one W1 step commit on SQLite, with synchronous=OFF so that the disk is left out:
`python -m bench.w1_commit_cpu [commits]`. Prints thread CPU time per commit (us) of
  - a raw commit (BEGIN IMMEDIATE, a 347-byte INSERT, COMMIT through sqlite3), by statement;
  - the store's commit_step of a W1 step (a run that advances), by statement, the rest being
    the store's Python and the hop through the event loop;
  - the UPDATE of a step commit that keeps the run running, setting status (commit_run) or
    leaving it out (commit_run_on), on the store's schema.
Each in its own temporary directory, removed at the end."""

from __future__ import annotations

import asyncio
import collections
import hashlib
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from typing import Any

import orjson

from tether.store.base import Lease, NewRun, StepCommit
from tether.store.sqlite import SQLiteStore

DATA = b'{"a":{"messages":["' + b"." * 256 + b'"]}}'  # a W1 checkpoint's data (279 bytes)


def raw(tmp: str, n: int) -> dict[str, float]:
    conn = sqlite3.connect(f"{tmp}/raw.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("CREATE TABLE w1_raw (thread_id TEXT NOT NULL, step INTEGER NOT NULL, "
                 "data BLOB NOT NULL, PRIMARY KEY (thread_id, step)) WITHOUT ROWID")
    payload, parts = b"x" * 347, collections.Counter[str]()
    clock = time.thread_time
    for i in range(n):
        t0 = clock()
        conn.execute("BEGIN IMMEDIATE")
        t1 = clock()
        conn.execute("INSERT INTO w1_raw VALUES ('t', ?, ?)", (i, payload))
        t2 = clock()
        conn.execute("COMMIT")
        t3 = clock()
        parts["BEGIN IMMEDIATE"] += t1 - t0
        parts["INSERT"] += t2 - t1
        parts["COMMIT"] += t3 - t2
    conn.close()
    return {k: v / n * 1e6 for k, v in parts.items()}


class _Timed:
    """The store's write connection, each execute's thread CPU time added up by statement."""

    def __init__(self, conn: sqlite3.Connection, parts: collections.Counter[str]) -> None:
        self._conn, self._parts = conn, parts

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        t0 = time.thread_time()
        cur = self._conn.execute(sql, *args)
        self._parts[sql.strip().split("\n")[0][:48]] += time.thread_time() - t0
        return cur


async def store_step(tmp: str, n: int) -> tuple[float, dict[str, float]]:
    store = SQLiteStore(f"sqlite:///{tmp}/t.db?synchronous=OFF")
    await store.open(check_schema=False)
    await store.migrate()
    opened = store._conns._open
    assert opened is not None
    parts = collections.Counter[str]()
    opened.write = _Timed(opened.write, parts)  # type: ignore[assignment]
    total, done = 0.0, 0
    try:
        for r in range(n // 20 + 5):
            data = orjson.dumps({"messages": []})
            run, _ = await store.create_run(NewRun(f"r{r}", "a", "v1", "w1_step", data,
                                                   hashlib.sha256(data).hexdigest()),
                                            lease=("w1", 30.0))
            lease = Lease(run.thread_id, "w1", run.epoch)
            if r == 5:  # warmed up
                parts.clear()
                total, done = 0.0, 0
            t0 = time.thread_time()
            for step in range(1, 21):
                await store.commit_step(StepCommit(
                    lease=lease, step=step, node="w1_step", next_node="w1_step", kind="d",
                    data=DATA, attempt=1, started_at=1.5, finished_at=2.5, status="running"))
            total += time.thread_time() - t0
            done += 20
        return total / done * 1e6, {k: v / done * 1e6 for k, v in parts.items()}
    finally:
        await store.close()


async def status_update(tmp: str, n: int) -> dict[str, float]:
    store = SQLiteStore(f"sqlite:///{tmp}/u.db")
    await store.open(check_schema=False)
    await store.migrate()
    q = store._q
    await store.close()
    conn = sqlite3.connect(f"{tmp}/u.db", isolation_level=None)
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("INSERT INTO runs (thread_id, agent, version, status, node, input, input_hash, "
                 "epoch, attempt, created_at, updated_at) VALUES ('t0', 'a', 'v1', 'running', "
                 "'n', x'7b7d', 'h', 1, 1, 0, 0)")
    took: dict[str, list[float]] = {"commit_run": [], "commit_run_on": []}
    step = 0
    for _ in range(7):
        for name, runs in took.items():
            conn.execute("BEGIN IMMEDIATE")
            t0 = time.thread_time()
            for _ in range(n):
                step += 1
                conn.execute(q[name], {"thread_id": "t0", "epoch": 1, "step": step,
                                       "next_node": "n", "status": "running", "wake_at": None,
                                       "waiting_for": None}).fetchall()
            runs.append((time.thread_time() - t0) / n * 1e6)
            conn.execute("COMMIT")
    conn.close()
    return {k: statistics.median(v) for k, v in took.items()}


def main(argv: list[str]) -> None:
    n = int(argv[0]) if argv else 4000
    tmp = tempfile.mkdtemp(prefix="tether_w1cpu_")
    try:
        parts = raw(tmp, n)
        print(f"raw commit: {sum(parts.values()):.1f} us CPU "
              + ", ".join(f"{k} {v:.1f}" for k, v in parts.items()))
        total, sql = asyncio.run(store_step(tmp, n))
        print(f"store commit_step (W1 advance): {total:.1f} us CPU, of which SQLite "
              f"{sum(sql.values()):.1f}:")
        for k, v in sorted(sql.items(), key=lambda kv: -kv[1]):
            print(f"  {v:6.1f}  {k}")
        for k, v in asyncio.run(status_update(tmp, max(n // 2, 1))).items():
            print(f"{k}: {v:.1f} us CPU per UPDATE of a run that stays running (median of 7)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
