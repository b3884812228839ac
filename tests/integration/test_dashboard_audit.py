"""Every dashboard action (cancel, resume, fork, retry an effect, retry a run, route, drain)
goes through the Runtime call with `actor=`, so it lands in the audit log
(runtime.audit()): the token's name when the server has a token, else "dashboard". On every
store, in process: the dashboard's forms posted with their session cookie and CSRF token."""

from __future__ import annotations

import functools
import re
from typing import Any

import httpx
import pytest

from apps import inprocess
from tether import Agent, Command, Context, RetryPolicy, Runtime, finish, goto
from tether.service.api import create_app

WAIT = 20.0
make_runtime = functools.partial(inprocess.make_runtime, poll_interval=0.02)


def agents() -> list[Agent]:
    ask, two, boom, mail = Agent("ask"), Agent("two"), Agent("boom", retry=RetryPolicy(
        attempts=1)), Agent("mail")

    @ask.node(start=True)
    async def question(state: dict[str, Any], ctx: Context) -> Command:
        return finish({"answer": ctx.interrupt({"ok?": 1})})

    @two.node(start=True)
    async def one(state: dict[str, Any], ctx: Context) -> Command:
        return goto("second", {"n": 1})

    @two.node
    async def second(state: dict[str, Any], ctx: Context) -> Command:
        return finish({"n": 2})

    @boom.node(start=True)
    async def fail(state: dict[str, Any], ctx: Context) -> Command:
        raise RuntimeError("nope")

    @mail.node(start=True)
    async def send(state: dict[str, Any], ctx: Context) -> Command:
        ctx.effect("relay", {"to": "ops"}, key="relay-1")
        return finish({})

    return [ask, two, boom, mail]


async def refused(payload: dict[str, Any], key: str) -> None:
    raise ConnectionError("relay down")


class Browser:
    """A dashboard session: its cookie (kept by the client) and the CSRF token of a page."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.c = client
        self.csrf = ""

    async def open(self, path: str) -> str:
        r = await self.c.get(path)
        assert r.status_code == 200, r.text
        found = re.search(r'name="csrf" value="([^"]+)"', r.text)
        if found:
            self.csrf = found.group(1)
        return r.text

    async def post(self, path: str, **fields: str) -> httpx.Response:
        r = await self.c.post(path, data={"csrf": self.csrf, **fields})
        assert r.status_code == 303, (path, r.status_code, r.text[-600:])
        return r


@pytest.mark.parametrize("token, actor", [(None, "dashboard"), ("s3cret", "alice")])
async def test_each_dashboard_action_is_audited_with_its_actor(
        db_url: str, token: str | None, actor: str) -> None:
    rt = make_runtime(db_url, *agents())
    rt.effect("relay", retry=RetryPolicy(attempts=1))(refused)
    other = Runtime(db_url, agents=agents(), version="v2", poll_interval=0.02)
    async with inprocess.working(rt), inprocess.working(other):
        asked = await rt.start("ask", {})
        done = await rt.start("two", {})
        failed = await rt.start("boom", {})
        mailed = await rt.start("mail", {})
        queued = await rt.start("ask", {})  # cancelled while it waits
        await rt.wait(asked.thread_id, timeout=WAIT, until="waiting")
        await rt.wait(queued.thread_id, timeout=WAIT, until="waiting")
        await rt.wait(done.thread_id, timeout=WAIT)
        await rt.wait(failed.thread_id, timeout=WAIT)
        await inprocess.eventually(
            lambda: _dead(rt, mailed.thread_id), "the effect to die", WAIT)
        await inprocess.eventually(
            lambda: _versions(rt, {"v1", "v2"}), "a worker of each version", WAIT)

        app = create_app(rt, token=token, token_name=actor if token else None)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://127.0.0.1") as c:
            ui = Browser(c)
            if token is not None:
                r = await c.post("/ui/login", data={"token": token, "next": "/ui"})
                assert r.status_code == 303, r.text
            await ui.open("/ui/interrupts")  # a page with forms: its CSRF token
            await ui.post(f"/ui/runs/{queued.thread_id}/cancel")
            pending = (await rt.interrupts(thread_id=asked.thread_id))[0]
            await ui.post("/ui/interrupts/resume", thread_id=asked.thread_id,
                          interrupt_id=pending.id, value="true")
            await ui.post(f"/ui/runs/{done.thread_id}/fork", step="1")
            await ui.post("/ui/effects/retry", key="relay-1", thread_id=mailed.thread_id)
            await ui.post(f"/ui/runs/{failed.thread_id}/retry")
            await ui.post("/ui/deployments/route", **{"weight:v1": "30", "weight:v2": "70"})
            await ui.post("/ui/deployments/drain", version="v1")

        events = await rt.audit(limit=100)
        got = {(e.action, e.thread_id) for e in events if e.actor == actor}
        assert got >= {("cancel", queued.thread_id), ("resume", asked.thread_id),
                       ("fork", done.thread_id), ("effect.retry", mailed.thread_id),
                       ("retry", failed.thread_id)}, got
        assert {e.action for e in events if e.actor == actor} >= {"route", "drain"}
        assert {e.actor for e in events} == {actor}  # every action here was the dashboard's
        assert [d.weight for d in await rt.deployments() if d.version in ("v1", "v2")] == [0, 70]


async def _dead(rt: Runtime, thread_id: str) -> bool:
    return [e.status for e in await rt.effects(thread_id)] == ["dead"]


async def _versions(rt: Runtime, want: set[str]) -> bool:
    return {w.version for w in await rt.workers() if w.alive} >= want
