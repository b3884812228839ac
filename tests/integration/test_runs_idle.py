"""Migration 0017's idle_at, which the latest-updated runs list walks for the resting runs:
updated_at while a run is queued, waiting or sleeping, NULL while it runs or once finished,
whatever moved it there. Real runs through the Runtime on both stores (queued before any
worker, an interrupt asked and answered, mail, a sleep, a failure retried, a cancel, parked
runs moved to another version), then every row checked in SQL. Postgres computes it (a
generated column); SQLite's statements that change a run's status set idle_at and finished_at
themselves (the `resting` fragment), with triggers on status and version behind them for any
other writer: the second test drops the triggers and checks the statements alone."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from typing import Any

import pytest

from apps import eventually, inprocess
from apps.modes import modes_agent, rows_off
from tether import Agent

WAIT = 20.0
CHECK = ("SELECT thread_id, status, updated_at, idle_at FROM runs WHERE idle_at IS "
         "DISTINCT FROM (CASE WHEN status IN ('queued', 'waiting', 'sleeping') THEN "
         "updated_at END)")


FINISHED = ("SELECT thread_id, status, updated_at, finished_at FROM runs WHERE finished_at IS "
            "DISTINCT FROM (CASE WHEN status IN ('completed', 'failed', 'cancelled') THEN "
            "updated_at END)")


def resting() -> Agent:
    return modes_agent("resting", 3600)


def wrong(url: str) -> list[tuple[Any, ...]]:
    return rows_off(url, CHECK) + rows_off(url, FINISHED)


async def _status(rt: Any, thread_id: str, status: str) -> bool:
    return str((await rt.peek(thread_id)).status) == status


async def _by_update_is_sorted(rt: Any) -> None:
    every = await rt.list_runs(limit=1000)
    by_update = await rt.list_runs(order="updated", limit=1000)
    assert [r.thread_id for r in by_update] == [r.thread_id for r in sorted(
        every, key=lambda r: (r.updated_at, r.thread_id), reverse=True)]
    for status in ("queued", "waiting", "sleeping", "running", "completed"):
        mine = await rt.list_runs(order="updated", status=status, limit=1000)
        assert {r.status for r in mine} <= {status}
        assert len(mine) == len([r for r in every if r.status == status]), status


async def test_idle_at_is_updated_at_exactly_while_a_run_rests(db_url: str) -> None:
    await _every_move_of_a_run(db_url)


async def test_sqlite_statements_set_idle_at_and_finished_at_themselves(db_url: str) -> None:
    """Every status change (claim, park, resume, mail, finish, fail, retry, cancel, move) sets
    both columns in its own statement, so the triggers behind them never have work to do: each
    trigger also logs when its WHEN holds, and the log stays empty. A statement that left the
    columns to a trigger would write each row twice."""
    if not db_url.startswith("sqlite"):
        pytest.skip("Postgres computes both columns (generated columns)")
    path = db_url.removeprefix("sqlite:///")
    with closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE fired (name TEXT, thread_id TEXT, status TEXT)")
        for (name, sql) in db.execute("SELECT name, sql FROM sqlite_master WHERE name IN "
                                      "('runs_idle_status', 'runs_finished_status')").fetchall():
            db.execute(f"DROP TRIGGER {name}")
            db.execute(sql.replace("BEGIN", f"BEGIN INSERT INTO fired VALUES ('{name}', "
                                   "NEW.thread_id, NEW.status);", 1))
        db.commit()
    await _every_move_of_a_run(db_url)
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT * FROM fired").fetchall() == []


async def _every_move_of_a_run(db_url: str) -> None:
    rt = inprocess.make_runtime(db_url, resting(), poll_interval=0.02)
    queued = await rt.start("resting", {"mode": "plain"})  # queued, no worker yet
    early = await rt.start("resting", {"mode": "plain"})
    await rt.cancel(early.thread_id)
    assert wrong(db_url) == []
    await _by_update_is_sorted(rt)
    async with inprocess.working(rt, concurrency=4, close=False):
        ids = {m: (await rt.start("resting", {"mode": m})).thread_id
               for m in ("plain", "fail", "ask", "sleep")}
        await rt.wait(queued.thread_id, timeout=WAIT)
        for mode in ("plain", "fail"):
            await rt.wait(ids[mode], timeout=WAIT)
        await eventually(lambda: _status(rt, ids["ask"], "waiting"), "a run waits")
        await eventually(lambda: _status(rt, ids["sleep"], "sleeping"), "a run sleeps")
        assert wrong(db_url) == []
        await _by_update_is_sorted(rt)
        # Parked runs moved to another version: updated_at moves, the status stays.
        await rt.store.deploys.move_runs(
            "v1", "v2", [ids["ask"], ids["sleep"]], lambda rows: [r.thread_id for r in rows])
        assert (await rt.peek(ids["ask"])).version == "v2"
        assert wrong(db_url) == []
        await _by_update_is_sorted(rt)
        await rt.store.deploys.move_runs(
            "v2", "v1", [ids["ask"], ids["sleep"]], lambda rows: [r.thread_id for r in rows])
        await rt.send(ids["ask"], {"hello": 1})  # mail to a waiting run
        await rt.resume(ids["ask"], "yes")
        assert (await rt.wait(ids["ask"], timeout=WAIT)).status == "completed"
        await rt.retry(ids["fail"])  # failed -> queued -> running -> failed
        assert (await rt.wait(ids["fail"], timeout=WAIT)).status == "failed"
        await rt.cancel(ids["sleep"])  # a sleeping run cancelled
        assert wrong(db_url) == []
    try:
        assert wrong(db_url) == []
        await _by_update_is_sorted(rt)
    finally:
        await rt.close()
