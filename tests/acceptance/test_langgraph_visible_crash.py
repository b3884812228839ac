"""A durable LangGraph run seen from outside, every process real: `tether serve` and `tether
worker` subprocesses on one database, the worker SIGKILLed while the graph's two parallel
tool calls are in flight. The run's checkpoints name the graph's nodes, its state is the
graph's values at every step, its interrupt shows its value and is answered over HTTP and
from the CLI, and the tools' journaled calls are not repeated once recorded
(tests/apps/langgraph_visible_app.py is the graph)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from langchain_core.runnables import RunnableConfig
from playwright.sync_api import expect, sync_playwright

from tether.langgraph import TetherSaver

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "apps"))

from browser import launch
from http_harness import Procs, app_env, wait_until
from langgraph_visible_app import build

APP = "langgraph_visible_app:runtime"
PARALLEL = {"search_web", "search_docs"}
JOINED = {"merge", "score"}


@pytest.fixture
def tool_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "tool.log"
    monkeypatch.setenv("LANGGRAPH_TOOL_LOG", str(path))  # inherited by the subprocesses
    monkeypatch.setenv("LANGGRAPH_TOOL_SECONDS", "1.5")  # long enough to kill mid-call
    return path


@pytest.fixture
def procs(tmp_path: Path, db_url: str, tool_log: Path) -> Iterator[Procs]:
    p = Procs(tmp_path, db_url)
    try:
        yield p
    finally:
        p.close()


def tool_calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def wait_status(c: httpx.Client, thread_id: str, status: str, timeout: float = 60) -> Any:
    def check() -> Any:
        run = c.get(f"/runs/{thread_id}").json()
        assert run["status"] != "failed", run
        return run if run["status"] == status else None

    return wait_until(check, timeout, f"run {thread_id} to be {status}")


def nodes(name: str | None) -> set[str] | None:
    return None if name is None else set(name.split("+"))


def distinct(states: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for i, s in enumerate(states) if i == 0 or s != states[i - 1]]


async def graph_states(db_url: str, thread_id: str) -> tuple[list[int], list[Any], Any]:
    """LangGraph's view of the thread: its history's steps (newest first), the values of each
    super-step's checkpoint (oldest first, the input's left out) and its current values."""
    async with TetherSaver.from_conn_string(db_url) as saver:
        graph = build(saver)
        config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
        history = [s async for s in graph.aget_state_history(config)]
        values = [dict(s.values) for s in reversed(history) if s.metadata["step"] >= 0]
        return ([s.metadata["step"] for s in history], values,
                dict((await graph.aget_state(config)).values))


def test_a_killed_parallel_graph_names_its_nodes_and_shows_its_values(
        procs: Procs, db_url: str, tool_log: Path) -> None:
    server = procs.serve(app=APP)
    worker = procs.worker(app=APP)
    with server.client() as c:
        tids = [c.post("/runs", json={"agent": "langgraph_visible",
                                      "input": {"question": f"q{i}"}}).json()["thread_id"]
                for i in range(2)]
        # Both runs' two parallel searches started: kill while they are in flight.
        wait_until(lambda: len(tool_calls(tool_log)) >= 4, 60, "4 tool calls")
        worker.kill()
        worker = procs.worker(app=APP)
        for tid in tids:
            wait_status(c, tid, "waiting")
        pending = {i["thread_id"]: i for i in c.get("/interrupts").json()["interrupts"]}
        assert sorted(pending) == sorted(tids)
        for i, tid in enumerate(tids):
            [lg] = pending[tid]["payload"]["interrupts"]
            assert lg["node"] == "approve"
            assert lg["value"] == {"summary": f"docs: q{i} | web: q{i}", "ask": "publish?"}
            # While it waits, the run's state is the graph's values up to approve.
            assert c.get(f"/runs/{tid}").json()["state"]["summary"] == lg["value"]["summary"]

        # One answer from the CLI, the other over HTTP.
        out = subprocess.run(
            [sys.executable, "-m", "tether", "runs", "resume", tids[0], "--value", '"yes"',
             "--json", "--db", db_url, "--app", APP],
            env=app_env(db_url), capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["value"] == "yes"
        r = c.post(f"/runs/{tids[1]}/resume", json={"value": "no"})
        assert r.status_code == 200, r.text
        done = {tid: wait_status(c, tid, "completed") for tid in tids}
        cps = {tid: c.get(f"/runs/{tid}/checkpoints", params={"state": "true"}).json()
               for tid in tids}
    assert done[tids[0]]["state"]["published"] == "docs: q0 | web: q0"
    assert done[tids[1]]["state"]["published"] == "(withheld)"

    for tid in tids:
        rows = cps[tid]["checkpoints"]
        # Each tether step names its super-step's nodes and the ones that run next.
        assert [(nodes(r["node"]), nodes(r["next_node"])) for r in rows] == [
            ({"__start__"}, PARALLEL), (PARALLEL, JOINED), (JOINED, {"approve"}),
            ({"approve"}, {"approve"}), ({"approve"}, {"publish"}), ({"publish"}, None)]
        # Its state after each step is the graph's values at that super-step.
        steps, values, final = asyncio.run(graph_states(db_url, tid))
        assert len(steps) == len(set(steps)), steps  # every super-step once
        assert distinct([r["state"] for r in rows]) == values
        assert done[tid]["state"] == final

    # A tool call was repeated only if it was in flight at the kill (its result not yet
    # journaled): at most the two parallel calls of each run.
    calls = Counter(tool_calls(tool_log))
    for tid in tids:
        assert {k for k in calls if k.startswith(tid)} == {f"{tid}|web", f"{tid}|docs"}
    assert sum(n - 1 for n in calls.values()) <= 4, calls
    assert sum(n - 1 for n in calls.values()) >= 1, calls  # the kill came mid-call


# -- the dashboard -----------------------------------------------------------------------------


@pytest.fixture
def browser(db_url: str) -> Iterator[Any]:
    with sync_playwright() as p:  # after the database: see tests/acceptance/test_dashboard.py
        b = launch(p)
        try:
            yield b
        finally:
            b.close()


def test_the_interrupt_is_answered_from_the_dashboard(procs: Procs, browser: Any) -> None:
    server = procs.serve(app=APP)
    procs.worker(app=APP)
    page = browser.new_page()
    page.set_default_timeout(30_000)
    with server.client() as c:
        tid = c.post("/runs", json={"agent": "langgraph_visible",
                                    "input": {"question": "ui"}}).json()["thread_id"]
        wait_status(c, tid, "waiting")
        [ask] = c.get("/interrupts", params={"thread_id": tid}).json()["interrupts"]
        page.goto(f"{server.base_url}/ui/interrupts")
        item = page.locator(f"li[data-interrupt='{ask['id']}']")
        expect(item).to_contain_text("docs: ui | web: ui", timeout=30_000)
        expect(item).to_contain_text("approve")
        item.get_by_label("Value (JSON)").fill('"yes"')
        item.get_by_role("button", name="Resume").click()
        expect(page.locator("h1 .status")).to_have_text("completed", timeout=30_000)
        expect(page.locator("pre.state")).to_contain_text('"published": "docs: ui | web: ui"')
        rows = page.locator("table.timeline > tbody > tr")
        expect(rows).to_have_count(6)
        expect(rows.nth(1)).to_contain_text("search_web")
        expect(rows.nth(1)).to_contain_text("search_docs")
        assert wait_status(c, tid, "completed")["state"]["verdict"] == "yes"
    page.close()
