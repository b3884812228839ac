"""The checks in front of every HTTP request (tether.service.guard), on the app in-process:
Host names, writes from another site's page, writes a plain HTML form could send, wrong
tokens slowed per client, and /healthz's details kept for the token's holder."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

import tether
from apps import http_app
from tether.service import create_app
from tether.service.guard import Throttle, host_name, same_origin

TOKEN = "a-long-enough-token-for-tests"
CLIENT = {"X-Tether-Client": "tests"}


@pytest.fixture
async def make(db_url: str) -> AsyncIterator[Callable[..., Any]]:
    """make(**create_app kwargs) -> an httpx client on a fresh app over `db_url`."""
    opened: list[Any] = []

    async def factory(**kw: Any) -> tuple[httpx.AsyncClient, tether.Runtime]:
        rt = tether.Runtime(db_url, agents=[http_app.approval, http_app.failing],
                            version="v1", poll_interval=0.05)
        app = create_app(rt, **kw)
        life = app.router.lifespan_context(app)
        await life.__aenter__()
        c = httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                              base_url="http://127.0.0.1:8000")
        opened.append((life, c))
        return c, rt

    yield factory
    for life, c in reversed(opened):
        await c.aclose()
        await life.__aexit__(None, None, None)


def error_type(r: httpx.Response) -> str:
    assert r.headers["content-type"].startswith("application/json"), r.text
    kind: str = r.json()["error"]["type"]
    return kind


async def parked(c: httpx.AsyncClient, headers: dict[str, str] | None = None) -> str:
    r = await c.post("/runs", json={"agent": "approval", "input": {}}, headers=headers)
    assert r.status_code == 201, r.text
    tid: str = r.json()["thread_id"]
    return tid


# -- Host -------------------------------------------------------------------------------------


async def test_a_foreign_host_is_refused_with_421(make: Callable[..., Any]) -> None:
    c, _ = await make()
    tid = await parked(c)
    for path in ("/runs", f"/runs/{tid}", "/ui", "/openapi.json"):
        r = await c.get(path, headers={"Host": "evil.example"})
        assert r.status_code == 421, (path, r.text)
    r = await c.get("/runs", headers={"Host": "evil.example:8000"})
    assert r.status_code == 421 and error_type(r) == "MisdirectedRequest"
    assert "--allowed-host" in r.json()["error"]["message"]
    r = await c.post(f"/runs/{tid}/cancel", headers={"Host": "evil.example", **CLIENT})
    assert r.status_code == 421
    assert (await c.get(f"/runs/{tid}")).json()["status"] == "queued"
    # The loopback names, with or without a port; IPv6 in brackets.
    for host in ("127.0.0.1:8000", "localhost", "LOCALHOST:1", "[::1]:8000", "localhost."):
        assert (await c.get("/runs", headers={"Host": host})).status_code == 200, host
    # /healthz answers a probe under any name (its status only).
    r = await c.get("/healthz", headers={"Host": "10.1.2.3:8000"})
    assert r.status_code == 200 and r.json() == {"status": "ok"}


async def test_allowed_hosts_add_names(make: Callable[..., Any]) -> None:
    c, _ = await make(allowed_hosts=["tether.example.com", "[2001:db8::1]"])
    assert (await c.get("/runs", headers={"Host": "tether.example.com"})).status_code == 200
    assert (await c.get("/runs", headers={"Host": "[2001:db8::1]:80"})).status_code == 200
    assert (await c.get("/runs", headers={"Host": "other.example.com"})).status_code == 421
    anything, _ = await make(allowed_hosts=["*"])
    assert (await anything.get("/runs", headers={"Host": "any.example"})).status_code == 200


def test_host_names_and_origins() -> None:
    assert host_name("[::1]:8000") == "::1" and host_name("::1") == "::1"
    assert host_name("Example.COM.:443") == "example.com"
    assert same_origin("http://127.0.0.1:8000", "127.0.0.1:8000")
    assert same_origin("https://tether.example.com", "tether.example.com:443")
    assert same_origin("http://[::1]:8000", "[::1]:8000")
    assert not same_origin("http://127.0.0.1:9000", "127.0.0.1:8000")
    assert not same_origin("https://127.0.0.1:8000", "127.0.0.1")
    assert not same_origin("null", "127.0.0.1:8000")


# -- writes from other sites, writes a form could send ----------------------------------------


async def test_writes_from_another_sites_page_are_refused_token_or_not(
        make: Callable[..., Any]) -> None:
    for token in (None, TOKEN):
        auth = {"Authorization": f"Bearer {TOKEN}"} if token else {}
        c, rt = await make(token=token)
        tid = await parked(c, auth)
        foreign = [{"Origin": "http://127.0.0.1:9999"}, {"Origin": "http://evil.example"},
                   {"Origin": "null"}, {"Sec-Fetch-Site": "cross-site"},
                   {"Sec-Fetch-Site": "same-site"}]
        for headers in foreign:
            for method, path in (("POST", f"/runs/{tid}/cancel"),
                                 ("POST", "/deployments/v1/drain"),
                                 ("PUT", "/deployments"), ("POST", "/ui/runs/x/cancel")):
                r = await c.request(method, path, headers={**auth, **CLIENT, **headers},
                                    json={"weights": {"v1": 0}} if method == "PUT" else None)
                assert r.status_code == 403, (token, headers, path, r.text)
                if not path.startswith("/ui"):
                    assert error_type(r) == "CrossOrigin"
        assert (await rt.get(tid)).status == "queued"
        # Reading is not refused (a browser will not let that page read the answer), and
        # this server's own pages may post.
        r = await c.get("/runs", headers={**auth, "Origin": "http://evil.example"})
        assert r.status_code == 200
        same = {"Origin": "http://127.0.0.1:8000", "Sec-Fetch-Site": "same-origin"}
        r = await c.post(f"/runs/{tid}/cancel", headers={**auth, **CLIENT, **same})
        assert r.status_code == 200 and r.json()["status"] == "cancelled"


async def test_api_writes_need_json_or_a_client_header(make: Callable[..., Any]) -> None:
    c, rt = await make()
    tid = await parked(c)
    form = [{"content-type": "application/x-www-form-urlencoded"},
            {"content-type": "multipart/form-data; boundary=x"},
            {"content-type": "text/plain"}, {}]
    for headers in form:
        r = await c.post(f"/runs/{tid}/cancel", headers=headers, content=b"a=1")
        assert r.status_code == 415 and error_type(r) == "UnsupportedMediaType", r.text
        r = await c.post("/runs", headers=headers,
                         content=b'{"agent": "approval", "input": {}}')
        assert r.status_code == 415
    assert (await rt.get(tid)).status == "queued"
    assert len(await rt.list_runs()) == 1
    ok = await c.post(f"/runs/{tid}/cancel", headers={"content-type": "application/json"})
    assert ok.status_code == 200
    r = await c.post(f"/runs/{tid}/retry", headers=CLIENT)  # reaches the route: 409
    assert r.status_code == 409 and error_type(r) == "InvalidState"


# -- wrong tokens -----------------------------------------------------------------------------


async def test_wrong_tokens_are_slowed_per_client(make: Callable[..., Any]) -> None:
    c, _ = await make(token=TOKEN)
    codes = [(await c.get("/runs", headers={"Authorization": f"Bearer guess{i}"})).status_code
             for i in range(30)]
    assert codes[:Throttle.FREE] == [401] * Throttle.FREE
    assert codes.count(401) <= Throttle.FREE + 1 and 429 in codes, codes
    r = await c.get("/runs", headers={"Authorization": "Bearer guess"})
    assert r.status_code == 429 and error_type(r) == "TooManyRequests"
    assert 1 <= int(r.headers["retry-after"]) <= Throttle.MAX_DELAY
    # While it waits, even the right token is not checked (else a guess would show).
    r = await c.get("/runs", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 429
    # The dashboard's sign-in shares the count.
    r = await c.post("/ui/login", data={"token": "guess", "next": "/ui"})
    assert r.status_code == 429 and "try again" in r.text
    # No credentials at all is not a guess: a plain 401, and /healthz answers.
    assert (await c.get("/runs")).status_code == 401
    assert (await c.get("/healthz")).status_code == 200


async def test_dashboard_sign_in_failures_are_slowed(make: Callable[..., Any]) -> None:
    c, _ = await make(token=TOKEN)
    codes = [(await c.post("/ui/login", data={"token": f"guess{i}", "next": "/ui"})
              ).status_code for i in range(20)]
    assert codes[:Throttle.FREE] == [401] * Throttle.FREE and 429 in codes, codes
    r = await c.get("/runs", headers={"Authorization": "Bearer guess"})
    assert r.status_code == 429


def test_throttle_delays_grow_and_a_success_forgets() -> None:
    now = [1000.0]
    t = Throttle(clock=lambda: now[0])
    for _ in range(Throttle.FREE):
        assert t.wait("a") == 0
        t.failed("a")
    assert t.wait("a") == 1.0 and t.wait("b") == 0
    t.failed("a")
    assert t.wait("a") == 2.0
    for _ in range(20):
        t.failed("a")
    assert t.wait("a") == Throttle.MAX_DELAY
    now[0] += Throttle.MAX_DELAY
    assert t.wait("a") == 0
    t.succeeded("a")
    t.failed("a")
    assert t.wait("a") == 0
    now[0] += Throttle.FORGET + 1
    assert t.wait("a") == 0 and "a" not in t._failures


# -- /healthz ---------------------------------------------------------------------------------


async def test_healthz_details_need_the_token(make: Callable[..., Any]) -> None:
    secret = ('connection to server at "10.9.8.7", port 5433 failed: FATAL: password '
              'authentication failed for user "svc_tether" (database "prod_runs")')

    async def down() -> None:
        raise OSError(secret)

    c, rt = await make(token=TOKEN)
    assert (await c.get("/healthz")).json() == {"status": "ok"}
    rt.ping = down  # type: ignore[method-assign]
    r = await c.get("/healthz")
    assert r.status_code == 503 and r.json() == {"status": "unavailable"}
    for word in ("svc_tether", "10.9.8.7", "5433", "prod_runs", "sqlite", "v1"):
        assert word not in r.text
    r = await c.get("/healthz", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 503
    assert r.json()["error"] == f"database: {secret}"
    assert r.json()["db"] in ("sqlite", "postgres") and r.json()["version"] == "v1"
    wrong = await c.get("/healthz", headers={"Authorization": "Bearer wrong"})
    assert wrong.status_code == 401

    # Without a token, the details go to requests that name this server only (a
    # DNS-rebinding page names its own host).
    open_, rt2 = await make()
    rt2.ping = down  # type: ignore[method-assign]
    assert "svc_tether" in (await open_.get("/healthz")).text
    r = await open_.get("/healthz", headers={"Host": "evil.example"})
    assert r.status_code == 503 and r.json() == {"status": "unavailable"}


# -- /docs ------------------------------------------------------------------------------------


async def test_api_docs_pages_are_off_unless_asked(make: Callable[..., Any]) -> None:
    c, _ = await make()
    assert (await c.get("/docs")).status_code == 404
    assert (await c.get("/redoc")).status_code == 404
    assert (await c.get("/openapi.json")).status_code == 200
    on, _ = await make(api_docs=True)
    r = await on.get("/docs")
    assert r.status_code == 200 and "swagger" in r.text.lower()
    assert (await on.get("/redoc")).status_code == 200
