"""Dashboard sessions live in the store (store/sessions.py), so signing out ends them on the
server: a copy of the cookie taken before is refused at once, and signing out is a form of the
session with its CSRF token (another page cannot sign the operator out). On every store, in
process: httpx clients holding the cookie, as a browser (or a thief) would."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest

from apps import inprocess
from tether import Agent, Command, Context, Runtime, finish
from tether.service.api import create_app
from tether.service.dashboard_auth import COOKIE, UiAuth

TOKEN = "s3cret-token-for-the-dashboard"


def agent() -> Agent:
    a = Agent("noop")

    @a.node(start=True)
    async def only(state: dict[str, object], ctx: Context) -> Command:
        return finish({})

    return a


@pytest.fixture
async def runtime(db_url: str) -> AsyncIterator[Runtime]:
    rt = inprocess.make_runtime(db_url, agent())
    await rt.open()
    try:
        yield rt
    finally:
        await rt.close()


def client(rt: Runtime, cookie: str | None = None) -> httpx.AsyncClient:
    c = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(rt, token=TOKEN)),
                          base_url="http://127.0.0.1")
    if cookie is not None:
        c.cookies.set(COOKIE, cookie, domain="127.0.0.1", path="/ui")
    return c


async def sign_in(c: httpx.AsyncClient) -> str:
    r = await c.post("/ui/login", data={"token": TOKEN, "next": "/ui"})
    assert r.status_code == 303 and r.headers["location"] == "/ui", r.text
    cookie = c.cookies.get(COOKIE)
    assert cookie
    return cookie


async def csrf_of(c: httpx.AsyncClient) -> str:
    r = await c.get("/ui")
    assert r.status_code == 200, r.text
    found = re.search(r'action="/ui/logout" class="logout"><input type="hidden" name="csrf" '
                      r'value="([^"]+)"', r.text)
    assert found, "the Sign out form carries the session's CSRF token"
    return found.group(1)


async def signed_in(c: httpx.AsyncClient) -> bool:
    r = await c.get("/ui", follow_redirects=False)
    assert r.status_code in (200, 303), r.text
    return r.status_code == 200


async def test_signing_out_ends_every_copy_of_the_session_at_once(runtime: Runtime) -> None:
    async with client(runtime) as browser, client(runtime) as other:
        cookie = await sign_in(browser)
        await sign_in(other)  # another operator's session, which must outlive this one's end
        csrf = await csrf_of(browser)
        async with client(runtime, cookie) as thief:
            assert await signed_in(thief)  # a copied cookie works while the session does

            r = await browser.post("/ui/logout", data={"csrf": csrf})
            assert r.status_code == 303 and r.headers["location"].startswith("/ui/login")
            assert not await signed_in(browser)

            # The copy taken before is refused everywhere, at once: pages, live views, forms.
            r = await thief.get("/ui", follow_redirects=False)
            assert r.status_code == 303 and r.headers["location"].startswith("/ui/login")
            assert "Sign out" not in r.text
            r = await thief.get("/ui/login", follow_redirects=False)  # the form, not a loop
            assert r.status_code == 200 and 'name="token"' in r.text
            assert (await thief.get("/ui/live", params={"topic": "overview"})).status_code == 401
            r = await thief.post("/ui/deployments/route", data={"csrf": csrf, "weight:v1": "1"})
            assert r.status_code == 401 and "Sign in first" in r.text
            r = await thief.post("/ui/logout", data={"csrf": csrf}, follow_redirects=False)
            assert r.status_code == 303 and "set-cookie" not in r.headers  # nothing to end

        async with client(runtime, cookie) as later:  # a new server process, the same store
            assert not await signed_in(later)
        assert await signed_in(other)
        await sign_in(browser)  # signing in again makes a new session
        assert await signed_in(browser)


@pytest.mark.parametrize("fields", [{"back": "run"}, {"csrf": ""}, {"csrf": "0" * 64}, {"csrf": "\u00e9"}])
async def test_sign_out_needs_the_sessions_csrf_token(runtime: Runtime,
                                                      fields: dict[str, str]) -> None:
    async with client(runtime) as browser, client(runtime) as other:
        cookie = await sign_in(browser)
        await sign_in(other)
        for form in (fields, {"csrf": await csrf_of(other)}):  # none, wrong, another session's
            r = await browser.post("/ui/logout", data=form)
            assert r.status_code == 403, (form, r.status_code)
            assert "stale" in r.text and "Nothing was changed" in r.text
            assert "set-cookie" not in r.headers
            assert browser.cookies.get(COOKIE) == cookie and await signed_in(browser)
        r = await browser.post("/ui/logout", content=f"csrf={await csrf_of(browser)}",
                               headers={"content-type": "text/plain"})
        assert r.status_code == 415 and await signed_in(browser)
        async with client(runtime, cookie) as copy:
            assert await signed_in(copy)  # the session stayed valid on the server too


async def test_a_session_is_stored_as_a_hash_and_expired_rows_go(runtime: Runtime) -> None:
    sessions = runtime.store.sessions
    async with client(runtime) as browser:
        cookie = await sign_in(browser)
    nonce = UiAuth(TOKEN).session(cookie)
    assert nonce is not None
    assert await sessions.session_alive(UiAuth.digest(nonce))
    assert not await sessions.session_alive(nonce)  # the table holds no session id

    old, new = "a" * 64, "b" * 64
    assert await sessions.open_session(old, -1.0) >= 0  # expired as soon as it is made
    assert not await sessions.session_alive(old)
    assert await sessions.open_session(new, 3600.0) == 1  # the next sign-in deletes it
    assert await sessions.open_session("c" * 64, 3600.0) == 0  # nothing else had expired
    assert await sessions.session_alive(new, touch_after=0.0)  # renews last_seen
    assert await sessions.session_alive(new)
    assert await sessions.revoke_session(new)
    assert not await sessions.session_alive(new) and not await sessions.revoke_session(new)
    assert await sessions.session_alive(UiAuth.digest(nonce))  # others are untouched


async def test_a_read_only_dashboard_still_signs_out(runtime: Runtime) -> None:
    app = create_app(runtime, token=TOKEN, read_only=True)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://127.0.0.1") as browser:
        cookie = await sign_in(browser)
        r = await browser.post("/ui/logout", data={"csrf": await csrf_of(browser)})
        assert r.status_code == 303 and r.headers["location"].startswith("/ui/login")
    async with client(runtime, cookie) as copy:
        assert not await signed_in(copy)
