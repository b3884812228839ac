"""Crafted input is a 4xx with the usual error, never a 500 or a traceback in the log (issue
28 item 4): non-ASCII bytes in the session cookie and the CSRF field, a sign-in form with too
many fields, a route weight of 10**30, a 5000-digit fork step, non-ASCII digits in numbers;
over the HTTP API (JSON errors) and the dashboard (its page), in process on every store."""

from __future__ import annotations

import logging
import re
from typing import Any

import httpx
import pytest

from apps import inprocess
from tether import Agent, Command, Context, finish
from tether.service.api import create_app

FORM = {"content-type": "application/x-www-form-urlencoded"}
JSON = {"content-type": "application/json"}


def one_step() -> Agent:
    agent = Agent("one")

    @agent.node(start=True)
    async def only(state: dict[str, Any], ctx: Context) -> Command:
        return finish({"n": 1})

    return agent


@pytest.mark.parametrize("token", [None, "s3cret-token-for-tests"])
async def test_crafted_input_is_a_4xx_without_a_traceback(
        db_url: str, token: str | None, caplog: pytest.LogCaptureFixture) -> None:
    rt = inprocess.make_runtime(db_url, one_step())
    async with inprocess.working(rt):
        run = await rt.start("one", {})
        await rt.wait(run.thread_id, timeout=inprocess.WAIT)
        tid = run.thread_id
        app = create_app(rt, token=token)
        bearer = {"Authorization": f"Bearer {token}"} if token else {}
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            caplog.set_level(logging.WARNING)
            statuses: dict[str, int] = {}

            async def ui(name: str, r: httpx.Response) -> None:
                statuses[name] = r.status_code
                # A bad cookie is no session: sign in again (303), or a new one (no token).
                assert r.status_code < 500, (name, r.text)
                if r.status_code != 303:
                    assert r.headers["content-type"].startswith("text/html"), name

            async def api(name: str, r: httpx.Response) -> None:
                statuses[name] = r.status_code
                assert 400 <= r.status_code < 500, (name, r.text)
                assert isinstance(r.json()["error"]["message"], str), name

            # Before signing in.
            for mac in (b"1.abc.\xe9", "1.\u00e9.x".encode(), b"1.a.\xc3\xa9"):
                await ui(f"cookie {mac!r}", await c.get(
                    "/ui", headers=[(b"cookie", b"tether_ui=" + mac)]))
            await ui("login fields", await c.post(
                "/ui/login", content=b"a=1&b=2&c=3&d=4&e=5&f=6&token=x", headers=FORM))
            assert statuses["login fields"] == 400
            assert {statuses[k] for k in statuses if k.startswith("cookie")} == {
                200 if token is None else 303}
            if token is not None:
                r = await c.post("/ui/login", data={"token": token, "next": "/ui"})
                assert r.status_code == 303, r.text
            page = await c.get(f"/ui/runs/{tid}")
            found = re.search(r'name="csrf" value="([^"]+)"', page.text)
            assert found, page.text
            csrf = found.group(1)

            # Signed in (or no token): the dashboard's forms and pages.
            await ui("csrf non-ASCII", await c.post(
                f"/ui/runs/{tid}/cancel", content="csrf=\u00e9".encode(), headers=FORM))
            assert statuses["csrf non-ASCII"] == 403
            for step in ("9" * 5000, "\u0663", "\u00b2"):
                await ui(f"fork {step[:3]}", await c.post(
                    f"/ui/runs/{tid}/fork", data={"csrf": csrf, "step": step}))
                assert statuses[f"fork {step[:3]}"] == 400
            await ui("route 10**30", await c.post(
                "/ui/deployments/route", data={"csrf": csrf, "weight:v1": str(10**30)}))
            assert statuses["route 10**30"] == 400
            for path in (f"/ui/runs/{tid}/steps/\u00b2", f"/ui/runs/{tid}?steps=\u00b2",
                         "/ui/runs?limit=" + "9" * 5000, "/ui/runs?limit=\u00b2"):
                await ui(path[:30], await c.get(path))
                assert statuses[path[:30]] == 400, path
            r = await c.get("/ui/live", params={"topic": "run:no-such-run", "fp": ""})
            assert r.status_code == 404

            # The HTTP API.
            await api("put weights", await c.put(
                "/deployments", json={"weights": {"v1": 10**30}}, headers=bearer))
            await api("fork 5000 digits", await c.post(
                f"/runs/{tid}/fork", content=b'{"step": ' + b"9" * 5000 + b"}",
                headers={**JSON, **bearer}))
            await api("fork 10**30", await c.post(
                f"/runs/{tid}/fork", json={"step": 10**30}, headers=bearer))
        errors = [rec for rec in caplog.records
                  if rec.levelno >= logging.WARNING and rec.name.startswith("tether")]
        assert errors == [], [(rec.name, rec.getMessage()) for rec in errors]
