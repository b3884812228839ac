"""Event streams through a real `tether serve` on every store: capped per client address and
in all (429 TooManyStreams with Retry-After, the API's and the dashboard's streams alike),
slots released when a client goes away, and one shared poller that reads a run's row once a
poll however many streams follow it, while every stream still gets every event."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "apps"))

from http_harness import Procs, Server, app_env, client_headers, wait_until


@pytest.fixture
def procs(tmp_path: Path, db_url: str) -> Iterator[Procs]:
    p = Procs(tmp_path, db_url)
    try:
        yield p
    finally:
        p.close()


def client_from(server: Server, address: str) -> httpx.Client:
    """A client whose connections come from `address` (any of 127.0.0.0/8 is this machine):
    another client, as the server counts them."""
    return httpx.Client(base_url=server.base_url, headers=client_headers(), timeout=30,
                        transport=httpx.HTTPTransport(local_address=address))


def start(c: httpx.Client, agent: str, input: dict[str, Any] | None = None) -> str:
    r = c.post("/runs", json={"agent": agent, "input": input or {}})
    assert r.status_code == 201, r.text
    tid: str = r.json()["thread_id"]
    return tid


class Stream:
    """An open response and its lines (dropping the iterator would close the connection)."""

    def __init__(self, r: httpx.Response) -> None:
        self.r = r
        self.status_code = r.status_code
        self.lines = r.iter_lines()

    def close(self) -> None:
        self.r.close()


def open_stream(stack: contextlib.ExitStack, c: httpx.Client, path: str,
                **params: str) -> Stream:
    """GET `path` as a stream, kept open by `stack`; read up to its first event if served."""
    s = Stream(stack.enter_context(c.stream("GET", path, params=params)))
    if s.status_code == 200:
        for line in s.lines:
            if line.startswith("data: "):
                break
    return s


def assert_too_many(s: Stream, flag: str) -> None:
    assert s.status_code == 429, s.status_code
    r = s.r
    r.read()
    assert r.headers["content-type"].startswith("application/json")
    assert int(r.headers["retry-after"]) > 0
    err = r.json()["error"]
    assert err["type"] == "TooManyStreams" and flag in err["message"], err


def reopened(stack: contextlib.ExitStack, c: httpx.Client, path: str) -> Stream:
    """A stream opened once the server has seen a closed one go (429 until then)."""
    def attempt() -> Stream | None:
        s = open_stream(stack, c, path)
        if s.status_code == 429:
            s.close()
            return None
        return s

    s: Stream = wait_until(attempt, 10, "a closed stream's slot to be released", 0.1)
    return s


def events_until_terminal(s: Stream) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for line in s.lines:
        if line.startswith("data: "):
            events.append(json.loads(line.removeprefix("data: ")))
            if events[-1]["type"] in ("completed", "failed", "cancelled"):
                break
    return events


def test_streams_per_client_are_capped_and_a_closed_one_frees_its_slot(procs: Procs) -> None:
    server = procs.serve("--max-streams-per-client", "3")
    with server.client() as c, contextlib.ExitStack() as stack:
        tid = start(c, "echo")  # no worker: it stays queued, its streams stay open
        events = f"/runs/{tid}/events"
        held = [open_stream(stack, c, events) for _ in range(3)]
        assert [r.status_code for r in held] == [200] * 3
        assert_too_many(open_stream(stack, c, events), "--max-streams-per-client")
        # The dashboard's live view is a stream too, under the same cap.
        assert c.get("/ui").status_code == 200  # a session cookie
        assert_too_many(open_stream(stack, c, "/ui/live", topic=f"run:{tid}"),
                        "--max-streams-per-client")
        held[0].close()
        again = reopened(stack, c, events)
        assert again.status_code == 200
        assert_too_many(open_stream(stack, c, events), "--max-streams-per-client")
        # Closing the rest frees every slot: as many streams as the cap open again.
        for r in [*held[1:], again]:
            r.close()
        fresh = [reopened(stack, c, events) for _ in range(3)]
        assert [r.status_code for r in fresh] == [200] * 3
        doc = c.get("/openapi.json").json()
        answer = doc["paths"]["/runs/{thread_id}/events"]["get"]["responses"]["429"]
        assert "Retry-After" in answer["headers"] and "--max-streams" in answer["description"]
    assert "Traceback" not in server.output()


def test_streams_are_capped_in_all_across_clients(procs: Procs) -> None:
    env = app_env(procs.db_url, TETHER_MAX_STREAMS="3", TETHER_MAX_STREAMS_PER_CLIENT="2")
    server = procs.serve(env=env)  # the caps from the environment
    with client_from(server, "127.0.0.1") as a, client_from(server, "127.0.0.2") as b, \
            contextlib.ExitStack() as stack:
        tid = start(a, "echo")
        events = f"/runs/{tid}/events"
        mine = [open_stream(stack, a, events) for _ in range(2)]
        assert [r.status_code for r in mine] == [200, 200]
        assert_too_many(open_stream(stack, a, events), "--max-streams-per-client")
        theirs = open_stream(stack, b, events)
        assert theirs.status_code == 200  # another client: served
        assert_too_many(open_stream(stack, b, events), "--max-streams ")  # the server's cap
        mine[0].close()
        assert reopened(stack, b, events).status_code == 200
        theirs.close()


def test_one_poller_reads_a_run_once_a_poll_for_all_its_streams(procs: Procs,
                                                                  tmp_path: Path) -> None:
    reads = tmp_path / "reads.log"
    reads.touch()
    server = procs.serve(app="stream_app:runtime",
                         env=app_env(procs.db_url, STREAM_APP_READS=str(reads)))

    def count(tid: str) -> int:
        return reads.read_text().split().count(tid)

    with client_from(server, "127.0.0.1") as c, contextlib.ExitStack() as stack:
        busy = start(c, "ticker", {"steps": 4, "delay": 0.3})  # queued until a worker runs
        other = start(c, "ticker", {"steps": 2, "delay": 0.3})
        streams = [open_stream(stack, c, f"/runs/{busy}/events") for _ in range(20)]
        streams += [open_stream(stack, c, f"/runs/{other}/events") for _ in range(5)]
        assert {r.status_code for r in streams} == {200}
        time.sleep(0.5)
        before = count(busy), count(other)
        time.sleep(2.0)
        # Polling every 0.25 s: about 8 reads of each run in 2 s, whatever its streams (one
        # poller per stream read `busy` about 160 times).
        assert count(busy) - before[0] <= 12, count(busy) - before[0]
        assert count(other) - before[1] <= 12, count(other) - before[1]
        # A worker in another process runs them: every stream hears every step, in order,
        # through the shared poller, and the end.
        procs.worker(app="stream_app:runtime")
        for r in streams:
            got = events_until_terminal(r)
            steps = [e["step"] for e in got if e["type"] == "step"]
            assert got and got[-1]["type"] == "completed", got
            assert steps == sorted(set(steps)), got
        # The streams have ended: nothing polls their runs any more.
        time.sleep(0.5)
        settled = count(busy) + count(other)
        time.sleep(1.0)
        assert count(busy) + count(other) == settled
