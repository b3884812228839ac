"""Many runs parked and answered at once, on every store. Parks that share a group commit (on
Postgres one multi-row statement, park_runs) each park their own run with its own interrupt
or timer; answers that share one (resume_interrupts) each resolve their own run's interrupt
exactly once, journal their own value and wake their own run; two answers to one interrupt in
flight together give one win and one ResumeConflict; an answer naming another interrupt or a
run that no longer waits is refused. Real databases, a real in-process worker."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from contextlib import closing
from typing import Any

import psycopg
import pytest

from apps import inprocess
from apps.inprocess import eventually
from tether import Agent, Command, Context, InvalidState, ResumeConflict, StoreError, finish
from tether.store import pg_commit

RUNS = 120
WAIT = 30.0
SLEEP_S = 0.3

asker = Agent("asker")


@asker.node(start=True)
async def ask(state: dict[str, Any], ctx: Context) -> Command:
    answer = ctx.interrupt({"i": state["i"]})
    return finish({"answer": answer})


sleeper = Agent("sleeper")


@sleeper.node(start=True)
async def nap(state: dict[str, Any], ctx: Context) -> Command:
    ctx.sleep(SLEEP_S)
    return finish({"slept": state["i"]})


@pytest.fixture
def bulk_rows(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> list[str]:
    """The JSON rows of every multi-row statement the Postgres group commit sends; the
    store's log captured at DEBUG (a rolled-back group commit says so there)."""
    rows_sent: list[str] = []
    json_rows = pg_commit._json_rows

    def spy(seq: Any) -> str | None:
        rows = json_rows(seq)
        if rows is not None:
            rows_sent.append(rows)
        return rows

    monkeypatch.setattr(pg_commit, "_json_rows", spy)
    caplog.set_level(logging.DEBUG, logger="tether.store.postgres")
    return rows_sent


async def _started(rt: Any, agent: str, n: int) -> list[str]:
    """n runs of `agent` started together (their first steps and parks pile up)."""
    return [r.thread_id for r in await asyncio.gather(
        *(rt.start(agent, {"i": i}) for i in range(n)))]


async def _all_waiting(rt: Any, ids: list[str]) -> bool:
    for t in ids:
        if str((await rt.peek(t)).status) != "waiting":
            return False
    return True


async def test_answers_in_one_group_commit_each_reach_their_own_run(
        db_url: str, bulk_rows: list[str], caplog: pytest.LogCaptureFixture) -> None:
    rt = inprocess.make_runtime(db_url, asker, poll_interval=0.02)
    async with inprocess.working(rt, concurrency=RUNS):
        ids = await _started(rt, "asker", RUNS)
        await eventually(lambda: _all_waiting(rt, ids), "every run waits", timeout=WAIT)
        first = await rt.interrupts(thread_id=ids[0])

        answered = await asyncio.gather(*(rt.resume(t, {"i": i}) for i, t in enumerate(ids)))
        assert [a.thread_id for a in answered] == ids
        assert all(a.status == "resolved" for a in answered)
        assert [a.value for a in answered] == [{"i": i} for i in range(RUNS)]
        assert answered[0].id == first[0].id
        done = await asyncio.gather(*(rt.wait(t, timeout=WAIT) for t in ids))
        assert [d.state["answer"] for d in done] == [{"i": i} for i in range(RUNS)]

        # Answered again: the run no longer waits.
        with pytest.raises(InvalidState):
            await rt.resume(ids[0], "again")

        # Two answers in flight for each of several runs: one wins, one conflicts.
        more = [(await rt.start("asker", {"i": i})).thread_id for i in range(20)]
        await eventually(lambda: _all_waiting(rt, more), "the new runs wait", timeout=WAIT)
        with pytest.raises((ResumeConflict, InvalidState)):
            await rt.resume(more[0], "x", interrupt_id="not-this-one")
        outcomes = await asyncio.gather(
            *(rt.resume(t, {"who": who}) for t in more for who in ("a", "b")),
            return_exceptions=True)
        for k, t in enumerate(more):
            pair = outcomes[2 * k:2 * k + 2]
            won = [o for o in pair if not isinstance(o, BaseException)]
            lost = [o for o in pair if isinstance(o, BaseException)]
            assert len(won) == 1 and len(lost) == 1, pair
            assert isinstance(lost[0], (ResumeConflict, InvalidState)), lost
            final = await rt.wait(t, timeout=WAIT)
            assert final.state["answer"] == won[0].value
            assert len(await rt.interrupts(thread_id=t, status=None)) == 1
    if db_url.startswith("postgres"):
        # The first burst went (at least partly) as multi-row statements, none rolled back.
        assert any('"tether.interrupt"' in rows for rows in bulk_rows), "no resume_interrupts"
        assert any('"kind":"interrupt"' in rows for rows in bulk_rows), "no park_runs"
        assert "retrying them one by one" not in caplog.text


async def test_timers_parked_together_each_wake_their_own_run(
        db_url: str, bulk_rows: list[str], caplog: pytest.LogCaptureFixture) -> None:
    rt = inprocess.make_runtime(db_url, sleeper, poll_interval=0.02)
    async with inprocess.working(rt, concurrency=RUNS):
        t0 = asyncio.get_running_loop().time()
        ids = await _started(rt, "sleeper", RUNS)
        done = await asyncio.gather(*(rt.wait(t, timeout=WAIT) for t in ids))
        assert asyncio.get_running_loop().time() - t0 >= SLEEP_S
        assert [d.state["slept"] for d in done] == list(range(RUNS))
        for t in ids[:5]:  # each slept once: one journaled timer, one parked step
            steps = await rt.checkpoints(t)
            assert len(steps) == 1, steps
    if db_url.startswith("postgres"):
        assert any('"kind":"sleep"' in rows for rows in bulk_rows), "no park_runs of timers"
        assert "retrying them one by one" not in caplog.text


async def test_answers_given_together_on_sqlite_go_as_one_statement_each_kind(
        db_url: str) -> None:
    """The store's answers gathered in one go join one group commit job: one resolve, one
    journal and one wake statement for all (traced on the write connection), each caller
    getting its own row; a second answer to the same run in the job, a wrong interrupt id and
    a value JSON cannot carry as a string (a NUL) are answered one by one."""
    if not db_url.startswith("sqlite"):
        pytest.skip("SQLite's group commit (Postgres: resume_interrupts, above)")
    rt = inprocess.make_runtime(db_url, asker, poll_interval=0.02)
    async with inprocess.working(rt, concurrency=40):
        ids = await _started(rt, "asker", 40)
        await eventually(lambda: _all_waiting(rt, ids), "every run waits", timeout=WAIT)
        store = rt.store
        opened = store._conns._open
        statements: list[str] = []
        opened.write.set_trace_callback(statements.append)
        values = [b'{"n":%d,"s":"h\xc3\xa9"}' % i for i in range(30)]
        got = await asyncio.gather(
            *(store.resume_interrupt(t, v) for t, v in zip(ids[:30], values, strict=True)),
            store.resume_interrupt(ids[0], b'"again"'),
            store.resume_interrupt(ids[30], b'"x"', "not-this-one"))
        opened.write.set_trace_callback(None)
        assert [g is not None and g.thread_id for g in got[:30]] == ids[:30]
        assert [bytes(g.value) for g in got[:30] if g is not None] == values
        assert got[30] is None and got[31] is None
        # (traced with their comments: the set forms' first lines name them)
        for kind in ("resolve_interrupt for many", "journal_value for many",
                     "wake_waiting for many"):
            assert sum(s.startswith(f"-- {kind}") for s in statements) == 1, (kind, statements)
        nul = await store.resume_interrupt(ids[31], b'"a\\u0000b"')
        assert nul is not None and bytes(nul.value) == b'"a\\u0000b"'
        done = await asyncio.gather(*(rt.wait(t, timeout=WAIT) for t in [*ids[:30], ids[31]]))
        assert [d.state["answer"] for d in done[:30]] == [
            {"n": i, "s": "h\u00e9"} for i in range(30)]
        assert done[30].state["answer"] == "a\x00b"
        assert str((await rt.peek(ids[30])).status) == "waiting"  # the wrong id: not answered


def _execute(url: str, sql: str, params: tuple[Any, ...]) -> None:
    if url.startswith("sqlite"):
        with closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as db:
            db.execute(sql.replace("%s", "?"), params)
            db.commit()
    else:
        with psycopg.connect(url, autocommit=True) as pg:
            pg.execute(sql.replace("'{}'", "'\\x7b7d'::bytea").encode(), params)


async def test_an_answer_that_fails_fails_alone(db_url: str) -> None:
    """An answer whose write fails (here: its journal row is already there) fails with a
    StoreError, and the answers that shared its group commit are answered all the same."""
    rt = inprocess.make_runtime(db_url, asker, poll_interval=0.02)
    async with inprocess.working(rt, concurrency=8):
        ids = await _started(rt, "asker", 6)
        await eventually(lambda: _all_waiting(rt, ids), "every run waits", timeout=WAIT)
        bad = (await rt.interrupts(thread_id=ids[2]))[0]
        _execute(db_url, "INSERT INTO journal (thread_id, step, idx, name, result) VALUES "
                 "(%s, %s, 0, 'tether.interrupt', '{}')", (ids[2], bad.step))
        got = await asyncio.gather(*(rt.store.resume_interrupt(t, b'{"ok":true}') for t in ids),
                                   return_exceptions=True)
        assert isinstance(got[2], StoreError), got[2]
        assert [g.thread_id for k, g in enumerate(got) if k != 2] == [  # type: ignore[union-attr]
            t for k, t in enumerate(ids) if k != 2]
        for k, t in enumerate(ids):
            if k != 2:
                assert (await rt.wait(t, timeout=WAIT)).state["answer"] == {"ok": True}
        assert str((await rt.peek(ids[2])).status) == "waiting"  # its answer left no trace
        assert (await rt.interrupts(thread_id=ids[2]))[0].status == "pending"
