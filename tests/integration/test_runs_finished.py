"""Migration 0012's finished_at, which the latest-updated runs list walks: updated_at while a
run is terminal, NULL while it is open, whatever moved the run there. Real runs through the
Runtime on both stores (finish, failure, retry, cancel, an interrupt answered, a sleep, a
fork, mail), then every row checked in SQL. Postgres computes it (a generated column);
SQLite keeps it by triggers on status, exact only while no statement moves a finished run's
updated_at without setting its status: this test is what says so."""

from __future__ import annotations

from typing import Any

import pytest

from apps import eventually, inprocess
from apps.modes import modes_agent, rows_off
from tether import Agent
from tether.errors import InvalidState

WAIT = 20.0
CHECK = ("SELECT thread_id, status, updated_at, finished_at FROM runs WHERE finished_at IS "
         "DISTINCT FROM (CASE WHEN status IN ('completed', 'failed', 'cancelled') THEN "
         "updated_at END)")


def kinds() -> Agent:
    return modes_agent("kinds", 0.05)


def wrong(url: str) -> list[tuple[Any, ...]]:
    return rows_off(url, CHECK)


async def test_finished_at_is_updated_at_exactly_while_a_run_is_terminal(db_url: str) -> None:
    rt = inprocess.make_runtime(db_url, kinds(), poll_interval=0.02)
    queued = await rt.start("kinds", {"mode": "plain"})
    await rt.cancel(queued.thread_id)  # cancelled before any worker saw it
    async with inprocess.working(rt, concurrency=4, close=False):
        ids = {m: (await rt.start("kinds", {"mode": m})).thread_id
               for m in ("plain", "fail", "ask", "sleep")}
        for mode in ("plain", "fail", "sleep"):
            await rt.wait(ids[mode], timeout=WAIT)
        await eventually(lambda: _waiting(rt, ids["ask"]), "the run waits for its answer")
        assert wrong(db_url) == []
        await rt.send(ids["ask"], {"hello": 1})  # mail to a waiting run
        await rt.resume(ids["ask"], "yes")
        assert (await rt.wait(ids["ask"], timeout=WAIT)).status == "completed"
        await rt.retry(ids["fail"])  # failed -> queued: open again, then failed again
        assert (await rt.wait(ids["fail"], timeout=WAIT)).status == "failed"
        fork = await rt.fork(ids["plain"], 1)
        assert (await rt.wait(fork.thread_id, timeout=WAIT)).status == "completed"
        with pytest.raises(InvalidState):  # mail to a finished run: refused, nothing moved
            await rt.send(ids["plain"], {"late": True})
        await rt.cancel(ids["plain"])  # cancelling a finished run changes nothing
    try:
        rows = await rt.list_runs(limit=100)
        assert {r.status for r in rows} == {"completed", "failed", "cancelled"}
        assert wrong(db_url) == []
        by_update = await rt.list_runs(order="updated", limit=100)
        assert [r.thread_id for r in by_update] == [r.thread_id for r in sorted(
            rows, key=lambda r: (r.updated_at, r.thread_id), reverse=True)]
    finally:
        await rt.close()


async def _waiting(rt: Any, thread_id: str) -> bool:
    return str((await rt.peek(thread_id)).status) == "waiting"
