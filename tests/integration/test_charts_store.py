"""The charts' queries (store/charts.py, queries/charts.sql) on both stores: real runs through
the Runtime, then the figures of the last hour and an agent's edges checked against what the
runs did; and their plans, which must read index ranges, never a whole table."""

from __future__ import annotations

import shutil
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from apps import inprocess
from tether import Agent, Command, Context, RetryPolicy, finish, goto
from tether.store import charts
from tether.store.migrate import queries

State = dict[str, Any]
RUNS = 3


def agents() -> list[Agent]:
    two = Agent("two")

    @two.node(start=True)
    async def first(state: State, ctx: Context) -> Command:
        return goto("second", {"n": 1})

    @two.node
    async def second(state: State, ctx: Context) -> Command:
        return finish({"n": 2})

    bad = Agent("bad", retry=RetryPolicy(attempts=1))

    @bad.node(start=True)
    async def boom(state: State, ctx: Context) -> Command:
        raise RuntimeError("no")

    return [two, bad]


async def test_the_last_hour_and_the_edges_are_what_the_runs_did(db_url: str) -> None:
    rt = inprocess.make_runtime(db_url, *agents(), poll_interval=0.02)
    async with inprocess.working(rt, concurrency=4, close=False):
        ids = [(await rt.start("two", {})).thread_id for _ in range(RUNS)]
        failed = (await rt.start("bad", {})).thread_id
        for tid in [*ids, failed]:
            await rt.wait(tid, timeout=inprocess.WAIT)
    try:
        store = rt.store
        query = charts.reader(store)
        w = await charts.window(query, await store.now(), "hour")
        assert w.runs_total == RUNS + 1 and w.steps_total == 2 * RUNS
        assert w.step_latency["two"].n == 2 * RUNS and w.run_latency["two"].n == RUNS
        assert w.run_latency["bad"].n == 1 and w.statuses == {"completed": RUNS, "failed": 1}
        assert w.queue_wait["two"].n == RUNS and w.queue_wait["bad"].n == 1
        assert w.failures == {"exception": 1} and w.failed_by_agent == {"bad": 1}
        assert all(s.p50 is not None and s.p50 >= 0 for s in w.step_latency.values())
        day = await charts.window(query, await store.now(), "day")
        assert (day.runs_total, day.steps_total) == (RUNS + 1, 2 * RUNS)
        (runs, runs_est), (steps, steps_est) = await charts.throughput(query, await store.now())
        assert (sum(runs), sum(steps)) == (RUNS + 1, 2 * RUNS)
        assert not (runs_est or steps_est or w.runs_estimated or w.steps_estimated)
        e = await charts.edges(query, charts.id_list(store, ids))
        assert e.counts == {("first", "second"): RUNS, ("second", None): RUNS} and not e.cut
        assert (await charts.edges(query, charts.id_list(store, ids[:1]), limit=1)).cut
        assert await charts.path(query, ids[0]) == [(1, "first", "second"), (2, "second", None)]
        (last_run, last_step), = await query("charts_tip", {})
        assert last_run is not None and last_step is not None
    finally:
        await rt.close()


async def test_a_busy_minute_is_estimated_within_its_read_budget(db_url: str) -> None:
    """6,000 steps spread evenly over one minute: more than the slices' caps, so the count is
    an estimate, marked so and close (the rows are even); a quiet minute stays exact."""
    rt = inprocess.make_runtime(db_url, *agents())
    await rt.open()
    try:
        now = await rt.store.now()
        busy = (now // 60 - 2) * 60  # two minutes back: a complete bucket
        rows = [(f"r{i}", 1, busy + i * 0.01) for i in range(6000)]
        rows += [(f"q{i}", 1, busy - 60 + i) for i in range(7)]  # the minute before: 7 steps
        sql = ("INSERT INTO checkpoints (thread_id, step, node, next_node, kind, data, worker, "
               "attempt, started_at, finished_at) VALUES ({0}, {0}, 'n', NULL, 's', '{{}}', "
               "'w', 1, {0}, {0})")
        if db_url.startswith("sqlite"):
            with closing(sqlite3.connect(db_url.removeprefix("sqlite:///"))) as db, db:
                db.executemany(sql.format("?"), [(t, s, f, f) for t, s, f in rows])
        else:
            with psycopg.connect(db_url, autocommit=True) as pg, pg.cursor() as cur:
                cur.executemany(sql.format("%s").encode(), [(t, s, f, f) for t, s, f in rows])
        w = await charts.window(charts.reader(rt.store), now, "hour")
        b = int(busy // 60) - int(w.since // 60)
        assert w.steps_estimated and w.steps[b - 1] == 7
        assert 5400 <= w.steps[b] <= 6600, w.steps[b]
    finally:
        await rt.close()


PARAMS = {"since": 0.0, "width": 60.0, "limit": 10, "thread_id": "r1", "slice": 5.0, "n": 12,
          "cap": 100}
NAMES = [n for n in queries("sqlite") if n.startswith(("charts_", "agent_"))]


def test_sqlite_chart_queries_read_index_ranges(sqlite_template: Path, tmp_path: Path) -> None:
    path = tmp_path / "charts.db"
    shutil.copyfile(sqlite_template, path)
    q = queries("sqlite")
    with closing(sqlite3.connect(path)) as db:
        for analyzed in (False, True):
            if analyzed:
                db.execute("ANALYZE")
            for name in NAMES:
                plan = [r[3] for r in db.execute("EXPLAIN QUERY PLAN " + q[name],
                                                 {**PARAMS, "ids": '["r1"]'})]
                whole = [p for p in plan if p.startswith(("SCAN runs", "SCAN checkpoints"))]
                # The one walk allowed: runs_failed, a partial index of failed runs, LIMITed.
                assert whole in ([], ["SCAN runs USING INDEX runs_failed"]), (name, plan)
                if name in ("charts_steps_finished", "charts_step_sample"):
                    assert any("checkpoints_finished" in p for p in plan), (name, plan)


def _scans(node: dict[str, Any]) -> list[tuple[str, str]]:
    here = ([(node["Node Type"], node.get("Index Name") or node.get("Relation Name", ""))]
            if "Scan" in node["Node Type"] and "Relation Name" in node else [])
    return here + [s for child in node.get("Plans", []) for s in _scans(child)]


@pytest.mark.postgres
def test_postgres_chart_queries_read_index_ranges(pg_url: str) -> None:
    q = queries("postgres")
    with psycopg.connect(pg_url, autocommit=True) as pg:
        # Enough rows that a sequential scan of either table is never the cheap plan.
        pg.execute(b"""
            INSERT INTO runs (thread_id, agent, version, status, node, input, input_hash,
                              created_at, updated_at, error)
            SELECT 'r' || i, 'a', 'v', CASE WHEN i % 50 = 0 THEN 'failed' ELSE 'completed' END,
                   NULL, '{}', 'h', i, i + 1, NULL
            FROM generate_series(1, 20000) i""")
        pg.execute(b"""
            INSERT INTO checkpoints (thread_id, step, node, next_node, kind, data, worker,
                                     attempt, started_at, finished_at)
            SELECT 'r' || i, 1, 'n', NULL, 's', '{}', 'w', 1, i, i + 0.5
            FROM generate_series(1, 20000) i""")
        pg.execute(b"ANALYZE runs")
        pg.execute(b"ANALYZE checkpoints")
        for name in NAMES:
            params = {**PARAMS, "since": 19_000.0, "ids": ["r1", "r2"]}
            (plan,), = pg.execute(("EXPLAIN (FORMAT JSON) " + q[name]).encode(),
                                  params).fetchall()
            scans = _scans(plan[0]["Plan"])
            assert not [s for s in scans if s[0] == "Seq Scan"], (name, scans)
            assert orjson.dumps(plan)  # a plan was read
