"""Migration 0017's idle_at, which the latest-updated runs list walks for the resting runs:
updated_at while a run is queued, waiting or sleeping, NULL while it runs or once finished,
whatever moved it there. Real runs through the Runtime on both stores (queued before any
worker, an interrupt asked and answered, mail, a sleep, a failure retried, a cancel, parked
runs moved to another version), then every row checked in SQL. Postgres computes it (a
generated column); SQLite's statements that change a run's status set idle_at and finished_at
themselves (the `resting` fragment; migration 0018): the second test checks every row each
statement writes."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from typing import Any

import pytest

from apps import eventually, inprocess
from apps.modes import modes_agent, rows_off
from tether import Agent, Command, Context, RetryPolicy, finish, receive

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
    both columns in its own statement (migration 0018 dropped the triggers that kept them):
    triggers made for this test log any row a statement leaves inexact, and the log stays
    empty."""
    if not db_url.startswith("sqlite"):
        pytest.skip("Postgres computes both columns (generated columns)")
    path = db_url.removeprefix("sqlite:///")
    with closing(sqlite3.connect(path)) as db:
        db.executescript("""
            CREATE TABLE fired (column_name TEXT, thread_id TEXT, status TEXT);
            CREATE TRIGGER check_idle AFTER UPDATE ON runs
            WHEN NEW.idle_at IS NOT (CASE WHEN NEW.status IN ('queued', 'waiting', 'sleeping')
                                          THEN NEW.updated_at END)
            BEGIN INSERT INTO fired VALUES ('idle_at', NEW.thread_id, NEW.status); END;
            CREATE TRIGGER check_finished AFTER UPDATE ON runs
            WHEN NEW.finished_at IS NOT (CASE WHEN NEW.status IN ('completed', 'failed',
                                              'cancelled') THEN NEW.updated_at END)
            BEGIN INSERT INTO fired VALUES ('finished_at', NEW.thread_id, NEW.status); END;
            CREATE TRIGGER check_new AFTER INSERT ON runs
            WHEN NEW.idle_at IS NOT (CASE WHEN NEW.status IN ('queued', 'waiting', 'sleeping')
                                          THEN NEW.updated_at END)
              OR NEW.finished_at IS NOT NULL
            BEGIN INSERT INTO fired VALUES ('insert', NEW.thread_id, NEW.status); END;
        """)
    await _every_move_of_a_run(db_url)
    await _the_other_moves(db_url)
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT * FROM fired").fetchall() == []


mover = Agent("mover", retry=RetryPolicy(attempts=2, initial=0.01))


@mover.node(start=True)
async def move(state: dict[str, Any], ctx: Context) -> Command:
    mode = state["mode"]
    if mode == "mail" and not ctx.inbox:
        return receive()
    if mode == "join":
        await ctx.join([ctx.spawn("mover", {"mode": "plain"})])
    if mode == "flaky" and ctx.attempt == 1:
        raise RuntimeError("once")  # retried: queued again until its backoff ends
    return finish({"mode": mode})


async def _the_other_moves(db_url: str) -> None:
    """Mail that wakes an actor, a parent woken by its child, a retried attempt, a lease taken
    back by an operator and one taken over after it expired."""
    rt = inprocess.make_runtime(db_url, mover, poll_interval=0.02)
    try:
        ghost = (await rt.start("mover", {"mode": "plain"})).thread_id
        expired = (await rt.start("mover", {"mode": "plain"})).thread_id
        claimed = await rt.store.claim_runs("ghost", "v1", ["mover"], 2, 30.0)
        assert {r.thread_id for r in claimed} == {ghost, expired}
        assert sorted(await rt.release_worker("ghost")) == sorted([ghost, expired])
        assert len(await rt.store.claim_runs("gone", "v1", ["mover"], 1, 0.0)) == 1  # expired
        async with inprocess.working(rt, concurrency=4, close=False):
            ids = {m: (await rt.start("mover", {"mode": m})).thread_id
                   for m in ("mail", "join", "flaky")}
            await eventually(lambda: _status(rt, ids["mail"], "waiting"), "an actor waits")
            await rt.send(ids["mail"], {"hello": 1})
            for thread_id in (*ids.values(), ghost, expired):
                assert (await rt.wait(thread_id, timeout=WAIT)).status == "completed"
    finally:
        await rt.close()


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
