"""The audit log: every operator action is a row, written in the action's own transaction
(an action that did not happen leaves none, and an audit row that cannot be written undoes
its action), with the actor, target and details; read by run and action through
runtime.audit, GET /audit and `tether audit`."""

from __future__ import annotations

import asyncio
import getpass
import json
from typing import Any

import httpx
import pytest

import tether
from apps import break_audit, eventually
from apps import observe_app as app
from apps.inprocess import WAIT, working
from tether.cli import main
from tether.errors import InvalidState, RunConflict, RunNotFound, StoreError
from tether.retry import RetryPolicy
from tether.service import create_app

flaky = tether.Agent("flaky")


@flaky.node(start=True)
async def boom(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    if state.get("effect"):
        ctx.effect("doomed", {})
        return tether.finish({})
    raise ValueError("no")


def runtime(db_url: str) -> tether.Runtime:
    rt = app.make_runtime().with_db(db_url)
    rt.add_agent(flaky)
    flaky.retry = RetryPolicy(attempts=1)

    @rt.effect("doomed", retry=RetryPolicy(attempts=1))
    async def doomed(payload: Any, key: str) -> None:
        raise RuntimeError("never works")

    return rt


def version_2(db_url: str) -> tether.Runtime:
    """The observe app's runtime as version v2."""
    rt = tether.Runtime(db_url, agents=[app.agent], version="v2", poll_interval=0.05)
    rt.effect("note")(app.make_runtime().effect_handlers["note"].fn)
    return rt


def actions(events: list[tether.types.AuditEvent]) -> list[tuple[str, str | None, str | None]]:
    return [(e.action, e.thread_id, e.target) for e in events]


async def test_every_operator_action_is_recorded(db_url: str) -> None:
    rt = runtime(db_url)
    who = "alice"
    await rt.start(app.agent, {"steps": 2, "ask": 1}, thread_id="a", actor=who)
    await rt.start(flaky, {}, thread_id="f", actor=who)
    await rt.start(flaky, {"effect": True}, thread_id="e", actor=who)
    async with working(rt, close=False):
        async def waiting() -> bool:
            return (await rt.peek("a")).status == "waiting"

        await eventually(waiting, what="run a to wait for input")
        await rt.send("a", {"hello": 1}, actor=who)
        await rt.resume("a", "yes", actor=who)
        assert (await rt.wait("a", timeout=WAIT)).status == "completed"
        assert (await rt.wait("f", timeout=WAIT)).status == "failed"
        assert (await rt.wait("e", timeout=WAIT)).status == "completed"

        async def dead() -> bool:
            return bool(await rt.effects("e", status="dead"))

        await eventually(dead, what="the effect to be dead")
    [effect] = await rt.effects("e")
    assert len(await rt.retry_effect(effect.key, "e", actor="bob")) == 1
    forked = await rt.fork("a", 1, new_thread_id="a2", actor="bob")
    await rt.cancel(forked.thread_id, actor="bob")
    await rt.retry("f", actor="bob")
    await rt.release_worker("nobody:1:x", actor="bob")  # held nothing: not an action done
    events = await rt.audit()
    assert actions(events) == [
        ("retry", "f", "f"), ("cancel", "a2", "a2"), ("fork", "a", "a2"),
        ("effect.retry", "e", effect.key), ("resume", "a", "a"), ("send", "a", "a"),
        ("start", "e", "e"), ("start", "f", "f"), ("start", "a", "a")]
    assert [e.actor for e in events] == ["bob"] * 4 + ["alice"] * 5
    assert [e.id for e in events] == sorted((e.id for e in events), reverse=True)
    assert events[-1].details == {"agent": "obs", "version": "v1", "idempotency_key": None}
    assert events[2].details == {"step": 1}
    assert events[5].details["bytes"] > 0
    assert all(e.at > 0 for e in events)
    assert actions(await rt.audit(thread_id="a")) == [
        ("fork", "a", "a2"), ("resume", "a", "a"), ("send", "a", "a"), ("start", "a", "a")]
    assert actions(await rt.audit(action="start", limit=2)) == [("start", "e", "e"),
                                                                ("start", "f", "f")]
    older = await rt.audit(action="start", before=events[7].id)
    assert actions(older) == [("start", "a", "a")]
    with pytest.raises(tether.errors.DefinitionError, match="unknown audit action"):
        await rt.audit(action="explode")
    # Library calls without an actor are not operator actions: nothing recorded.
    await rt.start(app.agent, {"steps": 1}, thread_id="quiet")
    await rt.cancel("quiet")
    assert len(await rt.audit()) == len(events)
    await rt.close()


async def test_an_action_that_did_not_happen_leaves_no_row(db_url: str) -> None:
    rt = runtime(db_url)
    await rt.start(app.agent, {"steps": 1}, thread_id="x", actor="alice")
    await rt.start(app.agent, {"steps": 1}, thread_id="x", actor="alice")  # the same run
    with pytest.raises(RunConflict):
        await rt.start(app.agent, {"steps": 2}, thread_id="x", actor="alice")
    with pytest.raises(InvalidState):
        await rt.resume("x", 1, actor="alice")  # not waiting
    with pytest.raises(RunNotFound):
        await rt.cancel("nope", actor="alice")
    with pytest.raises(RunNotFound):
        await rt.send("nope", {}, actor="alice")
    with pytest.raises(InvalidState):
        await rt.retry("x", actor="alice")
    assert await rt.retry_effect("no-such-key", actor="alice") == []
    await rt.cancel("x", actor="alice")
    await rt.cancel("x", actor="alice")  # already cancelled: nothing changed
    assert actions(await rt.audit()) == [("cancel", "x", "x"), ("start", "x", "x")]
    await rt.close()


async def test_an_audit_row_that_cannot_be_written_undoes_its_action(db_url: str) -> None:
    rt = runtime(db_url)
    await rt.start(app.agent, {"steps": 1}, thread_id="kept")
    await rt.open()
    break_audit(db_url)
    with pytest.raises(StoreError):
        await rt.cancel("kept", actor="alice")
    with pytest.raises(StoreError):
        await rt.start(app.agent, {"steps": 1}, thread_id="never", actor="alice")
    with pytest.raises(StoreError):
        await rt.send("kept", {"m": 1}, actor="alice")
    assert (await rt.peek("kept")).status == "queued"
    assert await rt.inbox("kept") == []
    with pytest.raises(RunNotFound):
        await rt.peek("never")
    await rt.close()


async def test_get_audit_names_the_token(db_url: str) -> None:
    rt = runtime(db_url)
    asgi = create_app(rt, token="s3cret", token_name="ci-bot")
    headers = {"Authorization": "Bearer s3cret"}
    async with asgi.router.lifespan_context(asgi), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=asgi), base_url="http://127.0.0.1", headers=headers) as c:
        r = await c.post("/runs", json={"agent": "obs", "input": {"steps": 1}, "thread_id": "h"})
        assert r.status_code == 201
        assert (await c.post("/runs/h/cancel")).status_code == 200
        page = (await c.get("/audit")).json()
        assert [(e["action"], e["actor"], e["thread_id"]) for e in page["events"]] == [
            ("cancel", "ci-bot", "h"), ("start", "ci-bot", "h")]
        assert page["next_cursor"] is None
        one = (await c.get("/audit", params={"limit": 1})).json()
        assert [e["action"] for e in one["events"]] == ["cancel"]
        two = (await c.get("/audit", params={"limit": 1, "cursor": one["next_cursor"]})).json()
        # The last page says so even when it is full (one paging shape, as GET /runs).
        assert [e["action"] for e in two["events"]] == ["start"] and two["next_cursor"] is None
        only = (await c.get("/audit", params={"action": "start", "limit": 1})).json()
        assert only["next_cursor"] is None
        assert (await c.get("/audit", params={"cursor": "x"})).status_code == 422
        assert (await c.get("/audit", params={"thread_id": "other"})).json()["events"] == []
        bad = await c.get("/audit", params={"action": "explode"})
        assert bad.status_code == 422
        assert (await c.get("/audit", params={"limit": 0})).status_code == 422
        assert (await c.get("/audit", headers={"Authorization": "Bearer no"})).status_code == 401


def test_the_cli_records_the_os_user(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    async def start() -> None:
        async with tether.Runtime(db_url, agents=[app.agent]) as rt:
            await rt.start(app.agent, {"steps": 1}, thread_id="c")

    asyncio.run(start())
    assert main(["runs", "cancel", "c", "--db", db_url]) == 0
    capsys.readouterr()
    assert main(["audit", "--json", "--db", db_url, "--thread", "c"]) == 0
    [event] = json.loads(capsys.readouterr().out)
    assert (event["action"], event["actor"], event["target"]) == ("cancel", getpass.getuser(), "c")
    assert main(["audit", "--db", db_url, "--action", "start"]) == 0
    assert main(["audit", "--db", db_url, "--action", "explode"]) == 2


async def test_prune_records_each_batch_it_removed(db_url: str) -> None:
    rt = runtime(db_url)
    async with working(rt, close=False):
        for i in range(3):
            run = await rt.start(app.agent, {"steps": 1}, thread_id=f"p{i}", actor="alice")
            assert (await rt.wait(run.thread_id, timeout=WAIT)).status == "completed"

        async def effects_done() -> bool:  # a run with an effect still to perform stays
            return len(await rt.effects(status="done")) == 3

        await eventually(effects_done, what="the runs' effects done")
    await asyncio.sleep(0.05)  # "0s" ago is strictly before now
    await rt.prune(completed="0s", dry_run=True, actor="ops")  # changes nothing: no row
    assert [e.action for e in await rt.audit(action="prune")] == []
    report = await rt.prune(completed="0s", actor="ops")
    assert report.runs == 3
    [event] = await rt.audit(action="prune")
    assert (event.actor, event.thread_id) == ("ops", None)
    assert event.details["runs"] == 3 and event.details["completed"] == "0s"
    await rt.prune(completed="0s", actor="ops")  # nothing left to remove: no row
    assert len(await rt.audit(action="prune")) == 1
    # The audit log outlives the runs it names.
    assert [e.thread_id for e in await rt.audit(action="start")] == ["p2", "p1", "p0"]
    await rt.close()


async def test_deploy_actions_are_recorded_with_their_change(db_url: str) -> None:
    v1 = runtime(db_url)
    v2 = version_2(db_url)
    async with working(v1, close=False), working(v2, close=False):
        async def both_registered() -> bool:
            return {w.version for w in await v1.workers() if w.alive} == {"v1", "v2"}

        await eventually(both_registered, what="a worker of v1 and of v2 to register")
        await v1.start(app.agent, {"steps": 2, "ask": 1}, thread_id="parked", version="v1")

        async def parked() -> bool:
            return (await v1.peek("parked")).status == "waiting"

        await eventually(parked, what="the v1 run to wait for input")
        with pytest.raises(tether.errors.DefinitionError):
            await v1.route({"v1": 0, "v2": 0}, actor="carol")  # refused: no row
        await v1.route({"v1": 50, "v2": 50}, actor="carol")
        await v1.drain("v1", actor="carol")
        with pytest.raises(InvalidState, match="open runs"):
            await v1.retire("v1", actor="carol")  # the parked run is still on v1: no row
        await v1.upgrade("v1", "v2", dry_run=True, actor="carol")  # plans only: no row
        moved = await v1.upgrade("v1", "v2", actor="carol")
        assert moved.moved == ("parked",)
        await v1.retire("v1", actor="carol")
        await v2.resume("parked", "ok")
        assert (await v2.wait("parked", timeout=WAIT)).status == "completed"
    events = await v1.audit()
    assert actions(events) == [("retire", None, "v1"), ("upgrade", None, "v2"),
                               ("drain", None, "v1"), ("route", None, None)]
    assert all(e.actor == "carol" for e in events)
    assert events[1].details == {"from": "v1", "to": "v2", "thread_ids": None,
                                 "skip_refused": False, "runs": 1}
    assert events[3].details == {"weights": {"v1": 50, "v2": 50}}
    assert [e.action for e in await v1.audit(action="upgrade")] == ["upgrade"]
    await v1.close()
    await v2.close()


async def test_post_runs_takes_a_version(db_url: str) -> None:
    rt = runtime(db_url)
    v2 = version_2(db_url)
    async with working(v2, close=False):
        async def registered() -> bool:
            return any(w.version == "v2" for w in await rt.workers())

        await eventually(registered, what="the v2 worker to register")
        asgi = create_app(rt)
        async with asgi.router.lifespan_context(asgi), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=asgi), base_url="http://127.0.0.1") as http:
            r = await http.post("/runs", json={"agent": "obs", "input": {"steps": 1},
                                               "thread_id": "on-v2", "version": "v2"})
            assert r.status_code == 201, r.text
            assert r.json()["version"] == "v2"
            r = await http.post("/runs", json={"agent": "obs", "thread_id": "bad",
                                               "version": "v9"})
            assert r.status_code == 422 and "unknown version 'v9'" in r.text
            r = await http.post("/runs", json={"agent": "obs", "version": ""})
            assert r.status_code == 422
        assert (await v2.wait("on-v2", timeout=WAIT)).version == "v2"
    with pytest.raises(RunNotFound):
        await rt.peek("bad")
    await rt.close()
    await v2.close()
