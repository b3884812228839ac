"""Acceptance: what an HTTP client (the TypeScript one, say) needs of a real `tether serve` on
every store: SSE ids and a reconnect with Last-Event-ID that resumes after the last event
seen, one shape for step events whoever announces them (the in-process worker or the poller
of a worker in another process), the long-poll GET /runs/{id}?wait=S&until=..., POST
/deployments/{version}/retire, GET /runs?version=, the next_cursor paging of /audit and the
error statuses the OpenAPI document lists."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "apps"))

from http_harness import Procs, wait_until


@pytest.fixture
def procs(tmp_path: Path, db_url: str) -> Any:
    p = Procs(tmp_path, db_url, log=tmp_path / "calls.log")
    try:
        yield p
    finally:
        p.close()


def frames(c: httpx.Client, thread_id: str, headers: dict[str, str] | None = None,
           stop: str | None = None) -> list[tuple[str | None, dict[str, Any]]]:
    """(id, data) of each SSE frame until the stream ends, or until one of type `stop`."""
    out: list[tuple[str | None, dict[str, Any]]] = []
    with c.stream("GET", f"/runs/{thread_id}/events", headers=headers or {}) as r:
        assert r.status_code == 200, r.read()
        event_id: str | None = None
        name: str | None = None
        data: dict[str, Any] | None = None
        for line in r.iter_lines():
            if line.startswith("id: "):
                event_id = line.removeprefix("id: ")
            elif line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data = json.loads(line.removeprefix("data: "))
            elif line == "" and data is not None:  # the frame ends: dispatch it
                assert data["type"] == name and "_id" not in data
                out.append((event_id, data))
                event_id, found, data = None, data, None
                if found["type"] == stop:
                    break
    return out


def start(c: httpx.Client, agent: str, input: dict[str, Any], **kw: Any) -> str:
    r = c.post("/runs", json={"agent": agent, "input": input, **kw})
    assert r.status_code == 201, r.text
    tid: str = r.json()["thread_id"]
    return tid


def test_sse_ids_and_reconnect_after_last_event_id(procs: Procs) -> None:
    server = procs.serve(worker=True)
    with server.client() as c:
        tid = start(c, "approval", {"item": "x"})
        seen = frames(c, tid, stop="interrupted")
        assert [d["type"] for _, d in seen] == ["status", "interrupted"]
        ids = [i for i, _ in seen]
        assert all(ids) and len(set(ids)) == len(ids)
        last = ids[-1]
        assert last is not None
        # Reconnect while nothing changed: no new status event, nothing repeated.
        with c.stream("GET", f"/runs/{tid}/events", headers={"Last-Event-ID": last},
                      timeout=httpx.Timeout(30, read=1.5)) as r:
            assert r.status_code == 200
            got: list[str] = []
            with pytest.raises(httpx.ReadTimeout):
                for line in r.iter_lines():
                    got.append(line)
            assert not [g for g in got if g.startswith("data: ")], got
        # Answer while disconnected: the reconnect gets what it missed, from there.
        pending = c.get("/interrupts", params={"thread_id": tid}).json()["interrupts"][0]
        assert c.post(f"/runs/{tid}/resume", json={"value": "ok"}).status_code == 200
        wait_until(lambda: c.get(f"/runs/{tid}").json()["status"] == "completed", 30, "done")
        rest = frames(c, tid, headers={"Last-Event-ID": last})
        assert [d["type"] for _, d in rest] == ["resumed", "step", "completed"], rest
        assert rest[0][1]["interrupt_id"] == pending["id"]
        assert rest[1][1]["node"] == "ask" and rest[1][1]["step"] == seen[1][1]["step"] == 1
        # An id this server never wrote is a 400 before the stream starts.
        for bad in ("nope", "W10", "x" * 9000):
            r = c.get(f"/runs/{tid}/events", headers={"Last-Event-ID": bad})
            assert r.status_code in (400, 422), r.text
            assert r.json()["error"]["type"] in ("InvalidEventId", "ValidationError")


def test_poller_step_events_name_their_node_one_per_step(procs: Procs) -> None:
    server = procs.serve()  # no worker inside: every event comes from the poller
    procs.worker()
    with server.client() as c:
        # Steps of 0.1 s and polls every 0.25 s: several steps commit between two polls.
        tid = start(c, "ticker", {"steps": 12, "delay": 0.1})
        events = [d for _, d in frames(c, tid)]
        steps = [d for d in events if d["type"] == "step"]
        first = events[0]["step"]  # where the run was when the stream began
        assert [s["step"] for s in steps] == list(range(first + 1, 13)), steps
        assert len(steps) >= 6, events
        assert {s["node"] for s in steps} == {"tick"}
        assert steps[-1]["status"] == "completed" and steps[-1]["next_node"] is None
        assert all(set(s) >= {"type", "thread_id", "step", "node", "next_node", "status"}
                   for s in steps)
        # The interrupted event of the poller names the node and the step that parked.
        tid = start(c, "approval", {"item": "y"})
        asked = frames(c, tid, stop="interrupted")[-1][1]
        assert asked["node"] == "ask" and asked["step"] == 1


def test_long_poll_get_run(procs: Procs) -> None:
    server = procs.serve(worker=True)
    with server.client() as c:
        tid = start(c, "approval", {"item": "z"})
        t0 = time.monotonic()
        r = c.get(f"/runs/{tid}", params={"wait": 20, "until": "waiting"})
        assert r.status_code == 200 and r.json()["status"] == "waiting", r.text
        assert time.monotonic() - t0 < 15
        # Not finished and not in `until`: answers after `wait` seconds, as it is.
        t0 = time.monotonic()
        r = c.get(f"/runs/{tid}", params={"wait": 0.5})
        assert r.json()["status"] == "waiting" and 0.4 < time.monotonic() - t0 < 10
        c.post(f"/runs/{tid}/resume", json={"value": 1})
        r = c.get(f"/runs/{tid}", params={"wait": 20})
        assert r.json()["status"] == "completed" and r.json()["state"]["answer"] == 1
        for params in ({"wait": 0}, {"wait": -1}, {"wait": 61}, {"wait": "soon"},
                       {"wait": 1, "until": "later"}, {"until": "waiting"}):
            bad = c.get(f"/runs/{tid}", params=params)
            assert bad.status_code == 422, (params, bad.text)
            assert bad.json()["error"]["type"] == "ValidationError"
        missing = c.get("/runs/missing", params={"wait": 5})
        assert missing.status_code == 404


def test_retire_over_http_runs_by_version_and_audit_paging(procs: Procs) -> None:
    server = procs.serve(worker=True)
    with server.client() as c:
        own = c.get("/deployments").json()["deployments"][0]["version"]
        tid = start(c, "ticker", {"steps": 1, "delay": 0})
        wait_until(lambda: c.get(f"/runs/{tid}").json()["status"] == "completed", 30, "done")
        assert [r["thread_id"] for r in c.get("/runs", params={"version": own}).json()["runs"]
                ] == [tid]
        assert c.get("/runs", params={"version": "other"}).json() == {"runs": [],
                                                                      "next_cursor": None}
        assert c.get("/runs", params={"version": ""}).status_code == 422
        asking = start(c, "approval", {"item": "r"})
        wait_until(lambda: c.get(f"/runs/{asking}").json()["status"] == "waiting", 30, "ask")
        r = c.post(f"/deployments/{own}/retire")  # a run of it is still open
        assert r.status_code == 409 and r.json()["error"]["type"] == "InvalidState", r.text
        assert c.post(f"/runs/{asking}/resume", json={"value": 1}).status_code == 200
        assert c.get(f"/runs/{asking}", params={"wait": 20}).json()["status"] == "completed"
        r = c.post(f"/deployments/{own}/retire")
        assert r.status_code == 200, r.text
        assert r.json()["version"] == own and r.json()["state"] == "retired"
        assert c.post("/deployments/never/retire").status_code == 422
        assert c.post(f"/deployments/{own}/retire").status_code == 200  # already: the same
        actions = [e["action"] for e in c.get("/audit").json()["events"]]
        assert actions[0] == "retire" and "resume" in actions
        first = c.get("/audit", params={"limit": 2}).json()
        assert set(first) == {"events", "next_cursor"} and first["next_cursor"]
        rest = c.get("/audit", params={"cursor": first["next_cursor"]}).json()
        assert [e["action"] for e in first["events"] + rest["events"]] == actions
        assert rest["next_cursor"] is None


def test_openapi_lists_the_error_statuses(procs: Procs) -> None:
    server = procs.serve()
    with server.client() as c:
        paths = c.get("/openapi.json").json()["paths"]
    for path, ops in paths.items():
        for method, op in ops.items():
            codes = set(op["responses"])
            if path != "/healthz":
                assert {"401", "403"} <= codes, (method, path, codes)
            if "{thread_id}" in path:
                assert {"404", "410"} <= codes, (method, path, codes)
    assert {"409", "422"} <= set(paths["/deployments/{version}/retire"]["post"]["responses"])
    assert {"409"} <= set(paths["/runs/{thread_id}/resume"]["post"]["responses"])
    names = [p["name"] for p in paths["/runs/{thread_id}"]["get"]["parameters"]]
    assert {"wait", "until"} <= set(names)
    assert "version" in [p["name"] for p in paths["/runs"]["get"]["parameters"]]
    assert "Last-Event-ID" in [p["name"] for p in
                               paths["/runs/{thread_id}/events"]["get"]["parameters"]]
