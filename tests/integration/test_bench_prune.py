"""The prune bench's set-based fill writes what a real run of 10 journaled steps writes: the
same tables, rows and columns (NULL where a real run has NULL, the same types and values
but for its ids, times, worker and call name), on both stores; and the pruner takes it whole."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
from typing import Any

import psycopg
from bench.prune import fill

from apps.inprocess import WAIT, make_runtime, working
from tether import Agent, Command, Context, finish, goto

TABLES = ("runs", "checkpoints", "journal", "outbox", "mailbox", "interrupts", "group_members")
FREE = {"thread_id", "input_hash", "created_at", "updated_at", "started_at", "finished_at",
        "worker", "name", "agent", "version", "input"}
"""Columns whose values differ between any two runs (compared by type and NULL-ness only)."""


def rows(db_url: str, thread_id: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(db_url.removeprefix("sqlite:///"))
        conn.row_factory = sqlite3.Row
        try:
            for t in TABLES:
                order = "step" if t in ("checkpoints", "journal") else "thread_id"
                got = conn.execute(f"SELECT * FROM {t} WHERE thread_id = ? ORDER BY {order}",
                                   (thread_id,)).fetchall()
                out[t] = [dict(r) for r in got]
        finally:
            conn.close()
        return out
    with psycopg.connect(db_url) as pg:
        for t in TABLES:
            order = "step" if t in ("checkpoints", "journal") else "thread_id"
            cur = pg.execute(f"SELECT * FROM {t} WHERE thread_id = %s ORDER BY {order}",
                             (thread_id,))
            names = [d.name for d in cur.description or ()]
            out[t] = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    return out


def shape(col: str, value: Any) -> tuple[str, int | None]:
    """A free column's value as its type and, for the ids and hashes, its length."""
    return type(value).__name__, len(value) if col in ("thread_id", "input_hash") else None


async def test_the_fill_writes_rows_shaped_as_a_real_run(db_url: str) -> None:
    agent = Agent("bench")

    @agent.node(start=True)
    async def step(state: dict[str, Any], ctx: Context) -> Command:
        await ctx.call(lambda: 1)
        k = state.get("k", 0) + 1
        return finish({"k": k}) if k == 10 else goto("step", {"k": k})

    rt = make_runtime(db_url, agent)
    async with working(rt):
        real = await rt.start("bench", {"i": 0})
        await asyncio.wait_for(rt.wait(real.thread_id), WAIT)
    await fill(db_url, 0, 3, 10)
    want = rows(db_url, real.thread_id)
    (filled,) = rows(db_url, hashlib.md5(b"bench0").hexdigest())["runs"]
    got = rows(db_url, filled["thread_id"])
    assert {t: len(r) for t, r in got.items()} == {t: len(r) for t, r in want.items()}
    assert len(want["checkpoints"]) == len(want["journal"]) == 10
    for t in TABLES:
        for w, g in zip(want[t], got[t], strict=True):
            assert w.keys() == g.keys(), t
            for col in w:
                if col in FREE:
                    assert shape(col, g[col]) == shape(col, w[col]), (t, col, g[col], w[col])
                else:
                    assert g[col] == w[col], (t, col, g[col], w[col])
    rt = make_runtime(db_url, agent)
    try:
        report = await rt.prune(completed="30d")  # only the filled runs are 40 days old
    finally:
        await rt.close()
    assert (report.runs, report.rows) == (3, 3 * 21)
    assert rows(db_url, filled["thread_id"]) == {t: [] for t in TABLES}
    assert len(rows(db_url, real.thread_id)["checkpoints"]) == 10

