"""run_keys (Postgres, migration 0018): the runs' listing keys (thread_id, agent, version,
created_at), one row per run, which the database keeps in step with runs whatever writes
runs: runs started one by one and in a burst, children a step spawns, a run moved to another
version, a run inserted by hand, runs pruned, a TRUNCATE. After each, run_keys holds exactly
the runs' keys, and the listings that read it (an agent's, a version's, the newest) agree."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

import tether
from tether import Agent, Command, Context, finish
from tether.store.migrate import queries

pytestmark = pytest.mark.postgres

parent = Agent("rk_parent")
child = Agent("rk_child")


@parent.node(start=True)
async def fan_out(state: dict[str, Any], ctx: Context) -> Command:
    for i in range(2):
        ctx.spawn(child, {"i": i}, thread_id=f"{ctx.thread_id}-c{i}")
    return finish({"spawned": 2})


@child.node(start=True)
async def leaf(state: dict[str, Any], ctx: Context) -> Command:
    return finish({"leaf": state["i"]})


KEYS = b"SELECT thread_id, agent, version, created_at FROM {} ORDER BY thread_id"


def _in_step(pg: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    runs = pg.execute(KEYS.replace(b"{}", b"runs")).fetchall()
    keys = pg.execute(KEYS.replace(b"{}", b"run_keys")).fetchall()
    assert keys == runs
    return runs


async def test_run_keys_follow_every_write_of_runs(pg_url: str) -> None:
    rt = tether.Runtime(pg_url, agents=[parent, child], version="v1")
    with psycopg.connect(pg_url, autocommit=True) as pg:
        async with rt:
            await rt.start(parent, {}, thread_id="p1")
            await rt.start_many([{"agent": "rk_child", "input": {"i": 9}, "thread_id": f"b{i}"}
                                 for i in range(3)])
            assert [r[0] for r in _in_step(pg)] == ["b0", "b1", "b2", "p1"]

            stop = asyncio.Event()
            worker = asyncio.create_task(rt.work(concurrency=10, stop=stop))
            await asyncio.wait_for(rt.wait("p1"), 30)
            for t in ("p1-c0", "p1-c1", "b0", "b1", "b2"):
                await asyncio.wait_for(rt.wait(t), 30)
            stop.set()
            await asyncio.wait_for(worker, 30)
            assert len(_in_step(pg)) == 6  # the spawned children's keys came with them

            # A version move (the statement `runs upgrade` makes), and a run written by hand.
            pg.execute(b"UPDATE runs SET status = 'queued' WHERE thread_id = 'b2'")
            (moved, _), = pg.execute(queries("postgres")["move_runs"].encode(), {
                "ids": ["b2"], "from_version": "v1", "to_version": "v2"}).fetchall()
            assert moved == 1
            pg.execute(b"INSERT INTO runs (thread_id, agent, version, status, input, input_hash,"
                       b" created_at, updated_at) VALUES ('hand', 'rk_child', 'v3', 'completed',"
                       b" '{}', 'h', 1, 1)")
            rows = _in_step(pg)
            assert ("b2", "rk_child", "v2") in [r[:3] for r in rows]
            assert [r.thread_id for r in await rt.list_runs(version="v2")] == ["b2"]
            assert [r.thread_id for r in await rt.list_runs(version="v3")] == ["hand"]
            assert {r.thread_id for r in await rt.list_runs(agent="rk_child")} == {
                "p1-c0", "p1-c1", "b0", "b1", "b2", "hand"}
            assert [r.thread_id for r in await rt.list_runs(order="oldest", limit=1)] == ["hand"]

            # Pruned runs leave run_keys with their rows.
            report = await rt.prune(completed=0)
            assert report.runs >= 5
            left = _in_step(pg)
            assert [r[0] for r in left] == ["b2"]  # queued: not prunable
            assert [r.thread_id for r in await rt.list_runs()] == ["b2"]

        pg.execute(b"TRUNCATE runs CASCADE")
        assert _in_step(pg) == []
        # A TRUNCATE naming both (as a test harness empties every table) works as well.
        pg.execute(b"INSERT INTO runs (thread_id, agent, version, status, input, input_hash,"
                   b" created_at, updated_at) VALUES ('again', 'a', 'v', 'queued', '{}', 'h', 2, 2)")
        pg.execute(b"TRUNCATE runs, run_keys CASCADE")
        assert _in_step(pg) == []
