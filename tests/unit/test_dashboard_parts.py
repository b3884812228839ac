"""The dashboard's pure parts: the state diff, sessions and CSRF tokens, the runs filter and
its cursor, the live hub's one poller for every topic, and the shipped templates and assets."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Awaitable, Callable
from importlib import resources

import orjson
import pytest

from tether.service import dashboard_auth
from tether.service.dashboard import STATIC
from tether.service.dashboard_auth import UiAuth
from tether.service.dashboard_input import Refused, RunFilter, decode_cursor, encode_cursor
from tether.service.dashboard_live import LiveHub
from tether.service.dashboard_render import (
    MISSING,
    Change,
    age,
    environment,
    state_diff,
    states_at,
    timeline,
)
from tether.store.base import CheckpointRecord

# -- state diff ---------------------------------------------------------------------------------


def test_diff_by_path_with_adds_removes_changes_and_appends() -> None:
    old = {"n": 1, "seen": [1], "last": {"step": 1, "even": False}, "gone": "x", "same": [1, 2]}
    new = {"n": 2, "seen": [1, 2, 3], "last": {"step": 2, "even": False}, "same": [1, 2],
           "fresh": {"a": 1}}
    assert state_diff(old, new) == [
        Change("fresh", "added", MISSING, {"a": 1}),
        Change("gone", "removed", "x", MISSING),
        Change("last.step", "changed", 1, 2),
        Change("n", "changed", 1, 2),
        Change("seen", "appended", [1], [2, 3]),
    ]


def test_diff_tells_json_types_apart_and_lists_that_did_not_only_grow() -> None:
    assert state_diff({"a": 1}, {"a": True}) == [Change("a", "changed", 1, True)]
    assert state_diff({"a": 1}, {"a": 1.0}) == [Change("a", "changed", 1, 1.0)]
    assert state_diff({"a": [1, 2]}, {"a": [2, 1, 3]}) == [Change("a", "changed", [1, 2], [2, 1, 3])]
    assert state_diff({"a": [1, 2]}, {"a": [1]}) == [Change("a", "changed", [1, 2], [1])]
    assert state_diff({"a": {"b": 1}}, {"a": {"b": 1}}) == []
    assert state_diff([1], {"a": 1}) == [Change("(state)", "changed", [1], {"a": 1})]


def test_age_picks_the_largest_unit() -> None:
    assert [age(100.0 - d, 100.0) for d in (5, 125, 7300, 200000)] == ["5s", "2m", "2h", "2d"]
    assert age(None, 1.0) == "" and age(200.0, 100.0) == "0s"


# -- sessions, CSRF -----------------------------------------------------------------------------


def test_sessions_are_signed_by_the_token_and_expire(monkeypatch: pytest.MonkeyPatch) -> None:
    auth = UiAuth("s3cret")
    assert auth.required and auth.check_token(" s3cret ") and not auth.check_token("s3cre")
    cookie = auth.new_session()
    nonce = auth.session(cookie)
    assert nonce is not None
    assert UiAuth("s3cret").session(cookie) == nonce  # a restart with the same token
    assert UiAuth("other").session(cookie) is None  # a changed token ends every session
    issued, rest = cookie.split(".", 1)
    assert auth.session(f"{int(issued) + 1}.{rest}") is None  # the time is signed too
    assert auth.session(cookie[:-1] + ("0" if cookie[-1] != "0" else "1")) is None
    for bad in (None, "", "x", "1.2", "a.b.c", "." * 300):
        assert auth.session(bad) is None
    later = time.time() + dashboard_auth.SESSION_TTL + 1
    monkeypatch.setattr(dashboard_auth.time, "time", lambda: later)
    assert auth.session(cookie) is None


def test_the_store_keeps_a_hash_of_the_session_id_not_the_id() -> None:
    auth = UiAuth("s3cret")
    nonce = auth.session(auth.new_session())
    assert nonce is not None and len(nonce) >= 43  # 32 random bytes
    digest = UiAuth.digest(nonce)
    assert digest == hashlib.sha256(nonce.encode()).hexdigest() and nonce not in digest


def test_csrf_tokens_belong_to_one_session() -> None:
    auth = UiAuth(None)
    assert not auth.required and not auth.check_token("")
    a, b = (auth.session(auth.new_session()) for _ in range(2))
    assert a is not None and b is not None and a != b
    assert auth.check_csrf(a, auth.csrf(a))
    assert not auth.check_csrf(a, auth.csrf(b))
    assert not auth.check_csrf(a, None) and not auth.check_csrf(None, auth.csrf(a))
    assert not UiAuth(None).check_csrf(a, auth.csrf(a))  # another process's random key


# -- the runs filter ----------------------------------------------------------------------------


def test_runs_filter_round_trips_through_the_url() -> None:
    f = RunFilter.parse({"status": "failed", "agent": " writer ", "limit": "100"})
    assert f == RunFilter("failed", "writer", 100, None)
    assert RunFilter.parse(dict(kv.split("=") for kv in f.query().split("&"))) == f
    assert RunFilter.parse({}) == RunFilter() and RunFilter().query() == ""


@pytest.mark.parametrize(("query", "message"), [
    ({"status": "bogus"}, "Unknown status 'bogus'"),
    ({"limit": "7"}, "Page size must be one of"),
    ({"limit": "-1"}, "Page size must be one of"),
    ({"agent": "x" * 201}, "at most 200"),
    ({"agent": "a\x00b"}, "without NUL"),
    ({"cursor": "not-a-cursor"}, "page cursor"),
    ({"cursor": "W10"}, "page cursor"),  # base64 of []
    ({"cursor": "x" * 2000}, "too long"),
])
def test_runs_filter_refuses_bad_input_plainly(query: dict[str, str], message: str) -> None:
    with pytest.raises(Refused, match=message) as exc:
        RunFilter.parse(query)
    assert exc.value.status == 400


def test_cursor_decodes_what_it_encoded() -> None:
    class R:
        created_at = 1790000000.25
        thread_id = "t-1"

    assert decode_cursor(encode_cursor(R())) == (1790000000.25, "t-1")  # type: ignore[arg-type]


# -- live hub -----------------------------------------------------------------------------------


async def test_one_poller_per_topic_tells_each_follower_what_it_has_not_seen() -> None:
    hub = LiveHub(poll=0.01)
    calls = 0
    value = "v1"

    async def probe() -> str:
        nonlocal calls
        calls += 1
        return value

    async with hub.follow("t", probe, "v1") as a, hub.follow("t", probe, "v0") as b:
        assert hub.followers("t") == 2
        await asyncio.wait_for(b.get(), 2)  # b's page was rendered before v1: told at once
        await asyncio.sleep(0.05)
        assert a.empty()  # a has seen v1
        before = calls
        await asyncio.sleep(0.1)
        assert 3 <= calls - before <= 15  # one poller for both followers
        value = "v2"
        await asyncio.wait_for(a.get(), 2)
        await asyncio.wait_for(b.get(), 2)
    assert hub.followers("t") == 0
    settled = calls
    await asyncio.sleep(0.05)
    assert calls == settled  # the last follower stopped the poller


async def test_tabs_on_many_views_share_one_poller() -> None:
    hub = LiveHub(poll=0.01)
    calls: dict[str, int] = {}

    def probe(topic: str) -> Callable[[], Awaitable[str]]:
        async def fingerprint() -> str:
            calls[topic] = calls.get(topic, 0) + 1
            return "v1"
        return fingerprint

    def live_tasks() -> list[asyncio.Task[object]]:
        return [t for t in asyncio.all_tasks() if "live" in t.get_name()]

    async with contextlib.AsyncExitStack() as stack:
        for i in range(5):
            await stack.enter_async_context(hub.follow(f"run:{i}", probe(f"run:{i}"), "v1"))
        assert len(live_tasks()) == 1  # not one per view
        await asyncio.sleep(0.1)
        assert set(calls) == {f"run:{i}" for i in range(5)}  # and it polls each of them
    await asyncio.sleep(0.05)
    assert live_tasks() == []  # the last tab gone, the poller is too


async def test_a_failing_probe_does_not_end_the_poller(caplog: pytest.LogCaptureFixture) -> None:
    hub = LiveHub(poll=0.01)
    results: list[str | Exception] = [RuntimeError("db down"), "v1"]

    async def probe() -> str:
        got = results.pop(0) if len(results) > 1 else results[0]
        if isinstance(got, Exception):
            raise got
        return got

    async with hub.follow("t", probe, "v0") as q:
        await asyncio.wait_for(q.get(), 2)
    assert "live probe of t failed" in caplog.text


# -- what the wheel ships -----------------------------------------------------------------------


def test_templates_and_assets_ship_in_the_package() -> None:
    env = environment()
    pkg = resources.files("tether.service")
    names = [p.name for p in pkg.joinpath("templates").iterdir() if p.name.endswith(".html")]
    assert {"base.html", "overview.html", "runs.html", "run.html", "inbox.html",
            "effects.html", "login.html"} <= set(names)
    for name in names:
        env.get_template(name)  # parses
    for name in STATIC:
        assert pkg.joinpath("static", name).read_bytes()
    assert b"Zero-Clause BSD" in pkg.joinpath("static", "htmx.LICENSE.txt").read_bytes()


# -- the timeline -------------------------------------------------------------------------------


def _state(i: int) -> dict[str, object]:
    return {"n": i, "seen": list(range(i))}


def _rows(n: int, snapshot_every: int = 100) -> list[CheckpointRecord]:
    """Checkpoint rows of a run whose step i leaves {"n": i, "seen": [0, .., i - 1]}: deltas
    (a set and an append), a snapshot every `snapshot_every` steps."""
    def data(i: int) -> tuple[str, bytes]:
        if i % snapshot_every == 0:
            return "s", orjson.dumps(_state(i))
        return "d", orjson.dumps({"s": {"n": i}, "a": {"seen": [i - 1]}})
    return [CheckpointRecord("t", i, "tick", "tick" if i < n else None, *data(i), "w", 1,
                             float(i), float(i) + (0.5 if i % 2 else 0.25))
            for i in range(1, n + 1)]


def test_the_timeline_shows_one_page_of_steps_each_with_its_diff() -> None:
    page = timeline(_rows(250), b"{}")
    assert [r["cp"].step for r in page["rows"]] == list(range(151, 251))
    assert [r["cp"].state for r in page["rows"]] == [_state(i) for i in range(151, 251)]
    assert page["state"] == _state(250)
    assert (page["total"], page["earlier"], page["later"]) == (250, 150, None)
    first = page["rows"][0]
    assert first["longest"] == 0.5
    assert first["diff"] == [Change("n", "changed", 150, 151),
                             Change("seen", "appended", list(range(150)), [150])]
    middle = timeline(_rows(250), b"{}", upto=150)
    assert [r["cp"].step for r in middle["rows"]] == list(range(51, 151))
    assert [r["cp"].state for r in middle["rows"]] == [_state(i) for i in range(51, 151)]
    assert middle["rows"][49]["diff"] == [Change("n", "changed", 99, 100),  # a snapshot's
                                          Change("seen", "appended", list(range(99)), [99])]
    assert (middle["earlier"], middle["later"], middle["state"]) == (50, 250, _state(250))
    start = timeline(_rows(250), b"{}", upto=20)
    assert [r["cp"].step for r in start["rows"]] == list(range(1, 21))
    assert start["rows"][0]["diff"] is None  # no checkpoint before the first
    assert start["rows"][0]["cp"].state == _state(1)
    assert (start["earlier"], start["later"]) == (None, 120)
    assert timeline(_rows(250), b"{}", upto=0)["rows"] == []
    assert timeline([], b"{}") == {"rows": [], "total": 0, "earlier": None, "later": None,
                                   "state": None}


@pytest.mark.parametrize("snapshot_every", [1, 7, 100, 1000])
def test_states_at_replays_from_the_input_or_the_latest_snapshot(snapshot_every: int) -> None:
    rows = _rows(300, snapshot_every)
    want = [0, 1, 2, 98, 99, 150, 299]
    got = states_at(b'{"seen": [], "from": "input"}', rows, reversed(want))
    assert sorted(got) == want
    for i in want:  # the input's key survives until a snapshot replaces the whole state
        extra = {"from": "input"} if i + 1 < snapshot_every else {}
        assert got[i] == {**_state(i + 1), **extra}, i
    got[2]["n"] = "changed"  # each its own dict
    assert states_at(b"{}", rows, [2])[2]["n"] == 3
