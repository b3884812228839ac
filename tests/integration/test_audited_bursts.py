"""Audited starts, sends and answers made together (a burst of POST /runs, of POST
/runs/{id}/messages or of POST /runs/{id}/resume, each with its actor) share their group
commit as unaudited ones do: one set-based statement for the runs, the mail or the answers and
their audit rows. Each run created, message delivered and interrupt answered gets exactly one
audit row; a start that finds its run already there writes none, and whatever is refused
writes nothing (both stores)."""

from __future__ import annotations

import asyncio

import pytest

import tether
from apps import break_audit, eventually
from apps import observe_app as app
from apps.inprocess import working
from tether.errors import InvalidState, ResumeConflict, RunConflict, RunNotFound, StoreError


def runtime(db_url: str) -> tether.Runtime:
    return app.make_runtime().with_db(db_url)


async def test_a_burst_of_audited_starts_audits_each_run_created_once(db_url: str) -> None:
    async with runtime(db_url) as rt:
        await burst(rt)


async def burst(rt: tether.Runtime) -> None:
    await rt.start(app.agent, {"steps": 1}, thread_id="old", actor="alice")
    await rt.start(app.agent, {"steps": 1}, thread_id="taken", actor="alice")
    # All new: their group commits take the set-based statements.
    new = [f"r{i:02d}" for i in range(40)]
    fresh = await asyncio.gather(
        *(rt.start(app.agent, {"steps": 1, "i": i}, thread_id=t, actor="bob")
          for i, t in enumerate(new)),
        rt.start(app.agent, {"steps": 1}, actor="carol"))  # a new uuid
    assert all(r.created for r in fresh)
    assert [r.thread_id for r in fresh[:-1]] == new
    assert [r.state for r in fresh[:-1]] == [{"steps": 1, "i": i} for i in range(len(new))]
    # Mixed with starts that create nothing: each as it would go alone.
    more = [f"m{i:02d}" for i in range(10)]
    made = await asyncio.gather(
        *(rt.start(app.agent, {"steps": 1}, thread_id=t, actor="dave") for t in more),
        rt.start(app.agent, {"steps": 1}, thread_id="old", actor="dave"),  # the same run
        rt.start(app.agent, {"steps": 2}, thread_id="taken", actor="dave"),  # other input
        return_exceptions=True)
    *created, same, refused = made
    assert all(isinstance(r, tether.Run) and r.created for r in created), created
    assert isinstance(same, tether.Run) and not same.created
    assert isinstance(refused, RunConflict)
    events = await rt.audit(action="start", limit=1000)
    by_run: dict[str | None, list[str]] = {}
    for e in events:
        by_run.setdefault(e.thread_id, []).append(e.actor)
    assert by_run == {"old": ["alice"], "taken": ["alice"], fresh[-1].thread_id: ["carol"],
                      **{t: ["bob"] for t in new}, **{t: ["dave"] for t in more}}
    assert len({e.id for e in events}) == len(events)
    assert all(e.details == {"agent": "obs", "version": "v1", "idempotency_key": None}
               and e.target == e.thread_id and e.at > 0 for e in events)
    for t in new + more:
        assert (await rt.peek(t)).status == "queued"


async def test_a_burst_whose_audit_rows_cannot_be_written_starts_nothing(db_url: str) -> None:
    async with runtime(db_url) as rt:
        await unwritable(rt, db_url)


async def unwritable(rt: tether.Runtime, db_url: str) -> None:
    break_audit(db_url)
    made = await asyncio.gather(
        *(rt.start(app.agent, {"steps": 1}, thread_id=f"n{i}", actor="alice") for i in range(10)),
        return_exceptions=True)
    assert all(isinstance(r, StoreError) for r in made), made
    for i in range(10):
        with pytest.raises(tether.errors.RunNotFound):
            await rt.peek(f"n{i}")
    # Unaudited starts do not write to the audit table: they still work.
    quiet = await asyncio.gather(*(rt.start(app.agent, {"steps": 1}) for _ in range(5)))
    assert all(r.created for r in quiet)


async def test_a_burst_of_audited_sends_audits_each_message_delivered_once(db_url: str) -> None:
    async with runtime(db_url) as rt:
        await mail_burst(rt)


async def mail_burst(rt: tether.Runtime) -> None:
    to = [f"t{i}" for i in range(5)]
    for t in to:
        await rt.start(app.agent, {"steps": 1}, thread_id=t)
    await rt.start(app.agent, {"steps": 1}, thread_id="gone")
    await rt.cancel("gone")
    sent = await asyncio.gather(
        *(rt.send(to[i % 5], {"n": i}, sender=f"s{i}", actor="erin") for i in range(40)),
        rt.send("gone", {"n": -1}, actor="erin"),  # finished: refused
        rt.send("nobody", {"n": -2}, actor="erin"),  # no such run
        rt.send(to[0], {"n": 99}),  # not audited
        return_exceptions=True)
    *ids, finished, unknown, quiet = sent
    assert all(isinstance(i, int) for i in ids), ids
    assert isinstance(finished, InvalidState) and isinstance(unknown, RunNotFound)
    assert isinstance(quiet, int)
    for k, t in enumerate(to):
        inbox = await rt.inbox(t)
        got = [m.body["n"] for m in inbox if m.body["n"] != 99]
        assert sorted(got) == list(range(k, 40, 5))  # (concurrent sends: in any order)
        assert [m.id for m in inbox if m.body["n"] != 99] == [ids[n] for n in got]
    events = await rt.audit(action="send", limit=1000)
    assert sorted((e.thread_id, e.details["sender"]) for e in events) == sorted(
        (to[i % 5], f"s{i}") for i in range(40))
    assert all(e.actor == "erin" and e.target == e.thread_id and e.details["bytes"] > 0
               for e in events)


async def test_a_burst_of_audited_answers_audits_each_interrupt_answered_once(
        db_url: str) -> None:
    async with runtime(db_url) as rt:
        await answer_burst(rt)


async def answer_burst(rt: tether.Runtime) -> None:
    asking = [f"q{i:02d}" for i in range(20)]
    for t in asking:
        await rt.start(app.agent, {"steps": 2, "ask": 1}, thread_id=t)
    await rt.start(app.agent, {"steps": 1}, thread_id="busy")  # never waits for input
    async with working(rt, close=False):
        async def asked() -> bool:
            return len(await rt.interrupts(limit=1000)) == len(asking)

        await eventually(asked, what="every run to ask its question")
    answers = await asyncio.gather(
        *(rt.resume(t, {"ok": t}, actor="frank") for t in asking),
        rt.resume(asking[0], {"ok": "again"}, actor="frank"),  # the same interrupt twice
        rt.resume("busy", 1, actor="frank"),  # not waiting for input
        return_exceptions=True)
    *answered, twice, busy = answers
    assert isinstance(busy, InvalidState) and not isinstance(busy, ResumeConflict)
    won = [a for a in (*answered, twice) if isinstance(a, tether.Interrupt)]
    lost = [a for a in (*answered, twice) if not isinstance(a, tether.Interrupt)]
    assert len(won) == len(asking) and len(lost) == 1 and isinstance(lost[0], ResumeConflict)
    assert sorted(i.thread_id for i in won) == asking
    events = await rt.audit(action="resume", limit=1000)
    assert sorted(e.thread_id or "" for e in events) == asking
    assert all(e.actor == "frank" and e.details == {"interrupt_id": None} for e in events)
    assert await rt.interrupts(limit=1000) == []
