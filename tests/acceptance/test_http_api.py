"""The HTTP API through a real `tether serve` subprocess (uvicorn) on every store, with httpx:
runs, pagination, idempotency, SSE (embedded and remote worker), interrupts, fork, cancel,
error bodies and statuses, bearer-token auth, the loopback-only default; and the CLI's
`runs resume|cancel|fork` and `interrupts`."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tether.cli import is_loopback, main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "apps"))

from http_harness import Procs, app_env, free_port, wait_until

TERMINAL = ("completed", "failed", "cancelled")


@pytest.fixture
def procs(tmp_path: Path, db_url: str) -> Iterator[Procs]:
    p = Procs(tmp_path, db_url, log=tmp_path / "calls.log")
    try:
        yield p
    finally:
        p.close()


def wait_status(c: httpx.Client, thread_id: str, *statuses: str, timeout: float = 30) -> Any:
    def check() -> Any:
        run = c.get(f"/runs/{thread_id}").json()
        return run if run["status"] in statuses else None

    return wait_until(check, timeout, f"run {thread_id} to be {'/'.join(statuses)}")


def read_events(c: httpx.Client, thread_id: str, timeout: float = 30) -> list[dict[str, Any]]:
    """Every event of the run's SSE stream, until the stream ends (after a terminal event)."""
    events: list[dict[str, Any]] = []
    with c.stream("GET", f"/runs/{thread_id}/events", timeout=timeout) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = parse_sse(r.iter_lines())
    return events


def parse_sse(lines: Any) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    name = None
    for line in lines:
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            ev = json.loads(line.removeprefix("data: "))
            assert ev["type"] == name
            events.append(ev)
    return events


def assert_error(r: httpx.Response, status: int, type: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err: dict[str, Any] = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"]
    if type is not None:
        assert err["type"] == type, err
    return err


def start(c: httpx.Client, agent: str, input: dict[str, Any] | None = None, **kw: Any) -> Any:
    r = c.post("/runs", json={"agent": agent, "input": input or {}, **kw})
    assert r.status_code == 201, r.text
    return r.json()


# -- runs and events ----------------------------------------------------------------------


def test_run_lifecycle_with_embedded_worker(procs: Procs) -> None:
    server = procs.serve(worker=True)
    with server.client() as c:
        health = c.get("/healthz").json()
        assert health["status"] == "ok" and health["worker"] is True

        run = start(c, "echo", {"message": "hi", "delay": 0.5})
        # The embedded worker had a free slot: the run was created leased to it.
        assert run["status"] == "running" and run["agent"] == "echo"
        assert run["state"] == {"message": "hi", "delay": 0.5}
        tid = run["thread_id"]

        events = read_events(c, tid)
        types = [e["type"] for e in events]
        assert types[0] == "status" and types[-1] == "completed", types
        assert {"type": "stream", "thread_id": tid, "step": 1, "data": {"token": "hello"}} in events
        assert [e["step"] for e in events if e["type"] == "step"] == [1, 2]

        done = c.get(f"/runs/{tid}").json()
        assert done["status"] == "completed" and done["step"] == 2
        assert done["state"] == {"message": "hi", "delay": 0.5, "seen": [1], "done": True,
                                 "echo": "hi"}

        cps = c.get(f"/runs/{tid}/checkpoints").json()["checkpoints"]
        assert [(cp["step"], cp["node"], cp["next_node"]) for cp in cps] == [
            (1, "first", "second"), (2, "second", None)]
        assert cps[0]["state"]["seen"] == [1] and cps[1]["state"]["done"] is True
        bare = c.get(f"/runs/{tid}/checkpoints", params={"state": "false"}).json()
        assert all(cp["state"] is None for cp in bare["checkpoints"])

        # A finished run's stream is its status and its terminal event.
        assert [e["type"] for e in read_events(c, tid)] == ["status", "completed"]
        assert tid in [r["thread_id"] for r in c.get("/runs").json()["runs"]]
    assert server.terminate() == 0, server.output()


def test_sse_follows_a_worker_in_another_process(procs: Procs) -> None:
    server = procs.serve()
    procs.worker()
    with server.client() as c:
        tid = start(c, "ticker", {"steps": 3, "delay": 0.5})["thread_id"]
        events = read_events(c, tid)
        types = [e["type"] for e in events]
        assert types[0] == "status" and types[-1] == "completed", types
        steps = [e["step"] for e in events if e["type"] == "step"]
        assert steps == sorted(set(steps)) and steps[-1] == 3, events
        assert c.get(f"/runs/{tid}").json()["state"]["n"] == 3

        failed = start(c, "failing")["thread_id"]
        events = read_events(c, failed)
        assert events[-1]["type"] == "failed" and "boom" in events[-1]["error"], events
        run = c.get(f"/runs/{failed}").json()
        assert run["status"] == "failed"
        assert run["error"]["type"] == "RuntimeError" and run["error"]["message"] == "boom"


async def test_interrupt_through_sse_inbox_and_resume(procs: Procs) -> None:
    server = procs.serve()
    procs.worker()
    async with server.async_client() as c:
        r = await c.post("/runs", json={"agent": "approval", "input": {"item": "x"}})
        tid = r.json()["thread_id"]
        events: list[dict[str, Any]] = []
        interrupted = asyncio.Event()

        async def follow() -> None:
            async with c.stream("GET", f"/runs/{tid}/events") as resp:
                name = None
                async for line in resp.aiter_lines():
                    if line.startswith("event: "):
                        name = line.removeprefix("event: ")
                    elif line.startswith("data: "):
                        ev = json.loads(line.removeprefix("data: "))
                        assert ev["type"] == name
                        events.append(ev)
                        if ev["type"] == "interrupted":
                            interrupted.set()

        task = asyncio.create_task(follow())
        await asyncio.wait_for(interrupted.wait(), 30)
        inbox = (await c.get("/interrupts", params={"thread_id": tid})).json()["interrupts"]
        assert len(inbox) == 1
        pending = inbox[0]
        assert pending["payload"] == {"question": "approve x?"} and pending["status"] == "pending"
        assert pending["id"] in [i["id"] for i in (await c.get("/interrupts")).json()["interrupts"]]

        r = await c.post(f"/runs/{tid}/resume",
                         json={"value": {"ok": True}, "interrupt_id": pending["id"]})
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "resolved" and r.json()["value"] == {"ok": True}
        await asyncio.wait_for(task, 30)

        types = [e["type"] for e in events]
        assert types[0] == "status" and types[-1] == "completed", types
        assert types.index("interrupted") < types.index("resumed") < types.index("completed")
        assert (await c.get(f"/runs/{tid}")).json()["state"]["answer"] == {"ok": True}
        assert (await c.get("/interrupts", params={"thread_id": tid})).json()["interrupts"] == []
        answered = (await c.get("/interrupts", params={"thread_id": tid, "status": "all"})).json()
        assert [(i["status"], i["value"]) for i in answered["interrupts"]] == [
            ("resolved", {"ok": True})]
        again = await c.post(f"/runs/{tid}/resume", json={"value": 2})
        assert_error(again, 409)
    assert procs.log is not None
    assert procs.log.read_text().splitlines() == [f'{tid} {{"ok":true}}']


def test_fork_from_a_checkpoint(procs: Procs) -> None:
    server = procs.serve(worker=True)
    with server.client() as c:
        tid = start(c, "ticker", {"steps": 3, "delay": 0})["thread_id"]
        wait_status(c, tid, "completed")
        cps = c.get(f"/runs/{tid}/checkpoints").json()["checkpoints"]
        assert [cp["state"]["n"] for cp in cps] == [1, 2, 3]

        r = c.post(f"/runs/{tid}/fork", json={"step": 1, "thread_id": "forked-1"})
        assert r.status_code == 201, r.text
        fork = r.json()
        assert fork["thread_id"] == "forked-1" and fork["forked_from"] == tid
        assert fork["forked_step"] == 1 and fork["state"]["n"] == 1
        done = wait_status(c, "forked-1", "completed")
        assert done["state"]["n"] == 3

        assert_error(c.post(f"/runs/{tid}/fork", json={"step": 3}), 409, "InvalidState")
        assert_error(c.post(f"/runs/{tid}/fork", json={"step": 99}), 409, "InvalidState")
        assert_error(c.post(f"/runs/{tid}/fork", json={"step": -1}), 422, "ValidationError")
        assert_error(c.post(f"/runs/{tid}/fork", json={"step": True}), 422, "ValidationError")
        assert_error(c.post("/runs/nope/fork", json={"step": 0}), 404, "RunNotFound")


def test_cancel_waiting_sleeping_and_running_runs(procs: Procs) -> None:
    server = procs.serve(worker=True)
    with server.client() as c:
        waiting = start(c, "approval")["thread_id"]
        sleeping = start(c, "sleeper", {"seconds": 60})["thread_id"]
        running = start(c, "ticker", {"steps": 1000, "delay": 0.2})["thread_id"]
        wait_status(c, waiting, "waiting")
        wait_status(c, sleeping, "sleeping")
        wait_until(lambda: c.get(f"/runs/{running}").json()["step"] >= 1, 30, "a step")

        with c.stream("GET", f"/runs/{sleeping}/events") as r:
            lines = r.iter_lines()
            head = parse_sse(next(lines) for _ in range(6))
        assert [e["type"] for e in head] == ["status", "sleeping"], head

        for tid in (waiting, sleeping, running):
            r = c.post(f"/runs/{tid}/cancel")
            assert r.status_code == 200 and r.json()["status"] == "cancelled", r.text
            assert [e["type"] for e in read_events(c, tid)] == ["status", "cancelled"]
        step = c.get(f"/runs/{running}").json()["step"]
        again = c.post(f"/runs/{running}/cancel")
        assert again.status_code == 200 and again.json()["status"] == "cancelled"
        time.sleep(0.6)
        assert c.get(f"/runs/{running}").json()["step"] == step


def test_a_cancelled_run_cannot_be_resumed(procs: Procs) -> None:
    server = procs.serve(worker=True)
    with server.client() as c:
        tid = start(c, "approval")["thread_id"]
        wait_status(c, tid, "waiting")
        assert c.post(f"/runs/{tid}/cancel").json()["status"] == "cancelled"
        assert c.get("/interrupts", params={"thread_id": tid}).json()["interrupts"] == []
        assert_error(c.post(f"/runs/{tid}/resume", json={"value": 1}), 409, "InvalidState")


def test_messages_wake_an_idle_actor(procs: Procs) -> None:
    server = procs.serve()
    with server.client() as c:
        tid = start(c, "collector")["thread_id"]
        r = c.post(f"/runs/{tid}/messages", json={"message": {"n": 1}, "sender": "alice"})
        assert r.status_code == 201, r.text
        sent = r.json()
        assert sent["thread_id"] == tid and sent["sender"] == "alice"
        assert sent["message"] == {"n": 1} and isinstance(sent["id"], int)
        box = c.get(f"/runs/{tid}/messages").json()["messages"]
        assert [(m["id"], m["sender"], m["message"]) for m in box] == [(sent["id"], "alice",
                                                                        {"n": 1})]

        assert_error(c.post("/runs/nope/messages", json={"message": 1}), 404, "RunNotFound")
        assert_error(c.get("/runs/nope/messages"), 404, "RunNotFound")
        assert_error(c.post(f"/runs/{tid}/messages", json={}), 422, "ValidationError")
        assert_error(c.post(f"/runs/{tid}/messages", json={"message": 1, "x": 2}), 422,
                     "ValidationError")
        assert_error(c.post(f"/runs/{tid}/messages", json={"message": 1, "sender": ""}), 422,
                     "ValidationError")
        assert_error(c.post(f"/runs/{tid}/messages", json={"message": 2**70}), 422)

        procs.worker()
        idle = wait_status(c, tid, "waiting")
        assert idle["actor_state"] == "idle" and idle["inbox_depth"] == 0
        assert c.get(f"/runs/{tid}/messages").json()["messages"] == []
        assert c.post(f"/runs/{tid}/messages", json={"message": "stop"}).status_code == 201
        done = wait_status(c, tid, "completed")
        assert done["state"]["got"] == [{"from": "alice", "body": {"n": 1}},
                                        {"from": None, "body": "stop"}]
        # A finished run can never read mail: refused, with the reason, and nothing stored.
        body = assert_error(c.post(f"/runs/{tid}/messages", json={"message": "late"}), 409,
                            "InvalidState")
        assert "is completed: it can never read mail" in body["message"]
        assert c.get(f"/runs/{tid}/messages").json()["messages"] == []


def test_retry_a_failed_run(procs: Procs) -> None:
    server = procs.serve(worker=True)
    with server.client() as c:
        created = start(c, "failing")
        tid = created["thread_id"]
        assert created["inbox_depth"] == 0  # as GET /runs/{id} and the CLI say
        failed = wait_status(c, tid, "failed")
        assert failed["attempt"] == 1 and "boom" in failed["error"]["message"]
        r = c.post(f"/runs/{tid}/retry")
        assert r.status_code == 200, r.text
        assert r.json()["thread_id"] == tid and r.json()["error"] is None
        again = wait_status(c, tid, "failed")  # the bug is still there: a new attempt failed
        assert again["attempt"] == 2
        assert_error(c.post("/runs/nope/retry"), 404, "RunNotFound")
        ok = start(c, "echo", {"x": 1})
        wait_status(c, ok["thread_id"], "completed")
        body = assert_error(c.post(f"/runs/{ok['thread_id']}/retry"), 409, "InvalidState")
        assert "only a failed run can be retried" in body["message"]


# -- creating and listing -----------------------------------------------------------------


def test_idempotency_key_and_thread_id(procs: Procs) -> None:
    server = procs.serve()
    with server.client() as c:
        key = {"Idempotency-Key": "order-42"}
        first = c.post("/runs", json={"agent": "echo", "input": {"a": 1}}, headers=key)
        assert first.status_code == 201, first.text
        again = c.post("/runs", json={"agent": "echo", "input": {"a": 1}}, headers=key)
        assert again.status_code == 200, again.text
        assert again.json()["thread_id"] == first.json()["thread_id"]
        assert again.json()["idempotency_key"] == "order-42"
        assert_error(c.post("/runs", json={"agent": "echo", "input": {"a": 2}}, headers=key),
                     409, "RunConflict")

        assert start(c, "echo", {"a": 1}, thread_id="t-1")["thread_id"] == "t-1"
        same = c.post("/runs", json={"agent": "echo", "input": {"a": 1}, "thread_id": "t-1"})
        assert same.status_code == 200 and same.json()["thread_id"] == "t-1"
        assert_error(c.post("/runs", json={"agent": "echo", "input": {"a": 9},
                                           "thread_id": "t-1"}), 409, "RunConflict")
        assert_error(c.post("/runs", json={"agent": "echo"}, headers={"Idempotency-Key": "k" * 201}),
                     422, "ValidationError")
        assert len(c.get("/runs").json()["runs"]) == 2


def test_a_burst_through_runs_batch(procs: Procs) -> None:
    server = procs.serve(worker=True)
    with server.client() as c:
        batch = {"runs": [{"agent": "echo", "input": {"message": f"m{i}"}, "thread_id": f"b{i}"}
                          for i in range(200)]
                 + [{"agent": "echo", "input": {"message": "k"}, "idempotency_key": "key-1"}]}
        r = c.post("/runs:batch", json=batch)
        assert r.status_code == 201, r.text
        body = r.json()
        assert [run["thread_id"] for run in body["runs"][:200]] == [f"b{i}" for i in range(200)]
        assert body["created"] == [True] * 201
        assert body["runs"][200]["idempotency_key"] == "key-1"
        for i in (0, 99, 199):
            assert wait_status(c, f"b{i}", "completed")["state"]["message"] == f"m{i}"
        again = c.post("/runs:batch", json=batch)
        assert again.status_code == 200 and again.json()["created"] == [False] * 201
        assert again.json()["runs"][200]["thread_id"] == body["runs"][200]["thread_id"]
        # Checked before anything is written: a bad run refuses the whole batch.
        bad = {"runs": [{"agent": "echo", "thread_id": "new-1"}, {"agent": "ghost"}]}
        err = assert_error(c.post("/runs:batch", json=bad), 422, "DefinitionError")
        assert "request 1" in err["message"] and "'ghost'" in err["message"]
        assert_error(c.get("/runs/new-1"), 404, "RunNotFound")
        assert_error(c.post("/runs:batch", json={"runs": []}), 422, "ValidationError")
        assert_error(c.post("/runs:batch", json={"runs": [{"agent": "echo", "thread_id": "a/b"}]}),
                     422, "ValidationError")
        assert_error(c.post("/runs:batch", json={"runs": [{"agent": "echo"}] * 10_001}), 422)
        conflict = {"runs": [{"agent": "echo", "input": {"message": "other"}, "thread_id": "b0"}]}
        assert_error(c.post("/runs:batch", json=conflict), 409, "RunConflict")
        starts = c.get("/audit", params={"action": "start", "limit": 1000}).json()["events"]
        assert len(starts) == 201


def test_list_runs_pagination_and_filters(procs: Procs) -> None:
    server = procs.serve()
    with server.client() as c:
        made = [start(c, "echo", {"i": i}) for i in range(5)]
        made += [start(c, "approval", {"i": i}) for i in range(2)]
        expected = [r["thread_id"] for r in
                    sorted(made, key=lambda r: (r["created_at"], r["thread_id"]), reverse=True)]

        seen: list[str] = []
        pages = 0
        cursor = None
        while True:
            params: dict[str, Any] = {"limit": 3}
            if cursor:
                params["cursor"] = cursor
            page = c.get("/runs", params=params).json()
            pages += 1
            assert all("state" not in r for r in page["runs"])
            seen += [r["thread_id"] for r in page["runs"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert pages == 3 and seen == expected

        approvals = c.get("/runs", params={"agent": "approval"}).json()
        assert {r["thread_id"] for r in approvals["runs"]} == {r["thread_id"] for r in made[5:]}
        assert approvals["next_cursor"] is None
        assert len(c.get("/runs", params={"status": "queued"}).json()["runs"]) == 7
        assert c.get("/runs", params={"status": "completed"}).json()["runs"] == []
        one = c.get("/runs", params={"agent": "echo", "limit": 4}).json()
        rest = c.get("/runs", params={"agent": "echo", "cursor": one["next_cursor"]}).json()
        assert len(one["runs"]) == 4 and len(rest["runs"]) == 1 and rest["next_cursor"] is None

        for bad in ("nope", "", "AAAA", "WzEsMl0", "W251bGwsIngiXQ"):
            if bad:
                assert_error(c.get("/runs", params={"cursor": bad}), 400, "InvalidCursor")
        assert_error(c.get("/runs", params={"status": "bogus"}), 422, "ValidationError")
        assert_error(c.get("/runs", params={"limit": 0}), 422, "ValidationError")
        assert_error(c.get("/runs", params={"limit": 1001}), 422, "ValidationError")


# -- errors -------------------------------------------------------------------------------


def test_bad_requests_get_json_4xx(procs: Procs) -> None:
    server = procs.serve()
    with server.client() as c:
        for method, path in [("GET", "/runs/missing"), ("POST", "/runs/missing/cancel"),
                             ("GET", "/runs/missing/checkpoints"),
                             ("GET", "/runs/missing/events")]:
            assert_error(c.request(method, path), 404, "RunNotFound")
        assert_error(c.post("/runs/missing/resume", json={"value": 1}), 404, "RunNotFound")

        assert_error(c.post("/runs", json={"agent": "nope"}), 422, "DefinitionError")
        err = assert_error(c.post("/runs", json={}), 422, "ValidationError")
        assert err["details"][0]["loc"] == ["body", "agent"]
        assert_error(c.post("/runs", content=b"{not json",
                            headers={"content-type": "application/json"}), 422)
        assert_error(c.post("/runs", json={"agent": "echo", "extra": 1}), 422, "ValidationError")
        assert_error(c.post("/runs", json={"agent": "echo", "input": [1]}), 422)
        assert_error(c.post("/runs", json={"agent": "echo", "thread_id": "x" * 201}), 422)
        assert_error(c.post("/runs", json={"agent": "echo", "thread_id": "a\x00b"}), 422)
        slash = assert_error(c.post("/runs", json={"agent": "echo", "thread_id": "a/b"}), 422,
                             "ValidationError")
        assert "'/'" in json.dumps(slash)
        assert_error(c.get("/runs/" + "x" * 201), 422, "ValidationError")
        assert_error(c.post("/runs", json={"agent": "echo", "input": {"n": 2**70}}), 422,
                     "SerializationError")
        deep: Any = 1
        for _ in range(300):
            deep = [deep]
        assert_error(c.post("/runs", json={"agent": "echo", "input": {"deep": deep}}), 422)
        deeper = b'{"agent": "echo", "input": {"d": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}"
        r = c.post("/runs", content=deeper, headers={"content-type": "application/json"})
        assert 400 <= r.status_code < 500 and "error" in r.json()
        big = {"agent": "echo", "input": {"blob": "x" * (1 << 20)}}
        assert_error(c.post("/runs", json=big), 413, "ContentTooLarge")
        assert_error(c.post("/runs/x/resume", json={"value": "y" * (1 << 20)}), 413)
        assert_error(c.post("/runs/x/resume", json={}), 422, "ValidationError")

        tid = start(c, "approval")["thread_id"]
        assert_error(c.post(f"/runs/{tid}/resume", json={"value": 1}), 409, "InvalidState")
        assert_error(c.post(f"/runs/{tid}/resume", json={"value": 1, "interrupt_id": "x:1:0"}),
                     409, "InvalidState")

        assert_error(c.get("/nope"), 404, "NotFound")
        r = c.delete("/runs")
        assert_error(r, 405, "MethodNotAllowed")
        assert r.headers["allow"] == "GET, POST"
        assert_error(c.get("/runs", params={"thread_id": "x", "limit": "many"}), 422)
        assert_error(c.get("/interrupts", params={"status": "lost"}), 422)


# -- security -----------------------------------------------------------------------------


def test_bearer_token(procs: Procs) -> None:
    server = procs.serve("--token", "s3cret-token")
    with server.client() as anon:
        r = anon.get("/runs")
        assert_error(r, 401, "Unauthorized")
        assert r.headers["www-authenticate"] == "Bearer"
        assert_error(anon.get("/runs", headers={"Authorization": "Bearer wrong"}), 401)
        assert_error(anon.get("/runs", headers={"Authorization": "Basic s3cret-token"}), 401)
        assert_error(anon.get("/openapi.json"), 401)
        assert_error(anon.get("/nope"), 401)
        assert_error(anon.post("/runs", json={"agent": "echo"}), 401)
        assert anon.get("/healthz").status_code == 200
    with server.client(token="s3cret-token") as c:
        assert c.get("/runs").status_code == 200
        assert start(c, "echo")["status"] == "queued"
        schema = c.get("/openapi.json").json()
        assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
        assert schema["components"]["schemas"]["StartRun"]["properties"]["agent"]["enum"] == [
            "approval", "collector", "echo", "failing", "sleeper", "ticker"]

    env = app_env(procs.db_url, TETHER_TOKEN="from-env")
    from_env = procs.serve(env=env)
    with from_env.client() as anon:
        assert_error(anon.get("/runs"), 401)
    with from_env.client(token="from-env") as c:
        assert c.get("/runs").status_code == 200


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10", "example.com"])
def test_binding_beyond_loopback_needs_a_token(tmp_path: Path, host: str) -> None:
    env = app_env(f"sqlite:///{tmp_path / 'unused.db'}")
    done = subprocess.run(
        [sys.executable, "-m", "tether", "serve", "--app", "http_app:runtime", "--host", host,
         "--port", str(free_port())],
        env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2, done
    assert "refusing to bind" in done.stderr and "--token" in done.stderr


def test_is_loopback() -> None:
    assert all(map(is_loopback, ["127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "10.0.0.1", "example.com", ""]))


# -- CLI ----------------------------------------------------------------------------------


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    if code != 0:
        return code, err
    return code, json.loads(out) if "--json" in argv else out


def test_cli_resume_cancel_fork_interrupts(procs: Procs, capsys: pytest.CaptureFixture[str]) -> None:
    db = ["--db", procs.db_url, "--app", "http_app:runtime"]
    code, run = cli(capsys, "runs", "start", "approval", "--input", '{"item": "cli"}', "--json", *db)
    assert code == 0
    tid = run["thread_id"]
    procs.worker()

    def waiting() -> bool:
        return bool(cli(capsys, "runs", "show", tid, "--json", *db)[1]["status"] == "waiting")

    wait_until(waiting, 30, "the run to wait for input")
    code, pending = cli(capsys, "interrupts", "--json", *db)
    assert code == 0 and [i["thread_id"] for i in pending] == [tid]
    code, answered = cli(capsys, "runs", "resume", tid, "--value", '"approved"', "--json", *db)
    assert code == 0 and answered["status"] == "resolved" and answered["value"] == "approved"
    code, err = cli(capsys, "runs", "resume", tid, "--value", '"again"', *db)
    assert code == 2 and "error" in err
    code, err = cli(capsys, "runs", "resume", tid, "--value", "not json", *db)
    assert code == 2 and "--value" in err
    wait_until(lambda: cli(capsys, "runs", "show", tid, "--json", *db)[1]["status"] == "completed",
               30, "the run to finish")

    code, fork = cli(capsys, "runs", "fork", tid, "--step", "0", "--json", *db)
    assert code == 0 and fork["forked_from"] == tid and fork["forked_step"] == 0
    code, cancelled = cli(capsys, "runs", "cancel", fork["thread_id"], "--json", *db)
    assert code == 0
    assert cancelled["status"] == "cancelled"
    code, text = cli(capsys, "runs", "cancel", "missing", *db)
    assert code == 2 and "missing" in text
    code, everything = cli(capsys, "interrupts", "--all", "--json", *db)
    assert code == 0 and any(i["value"] == "approved" for i in everything)
