"""The LangGraph example's graph (examples/langgraph_durable.py) under tether's workers, every
process real: `tether serve` and `tether worker` subprocesses on one database, workers
SIGKILLed mid-graph twice. The graph's tool logs each call it starts, so repeated calls are
counted across processes; LangGraph's checkpoint history is read back with TetherSaver."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from langchain_core.runnables import RunnableConfig

import tether
from tether.langgraph import TetherSaver

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "apps"))

from http_harness import Procs, wait_until

APP = "langgraph_app:runtime"
TOPICS = 4  # the example's research loop
RUNS = 3


@pytest.fixture
def tool_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "tool.log"
    monkeypatch.setenv("LANGGRAPH_TOOL_LOG", str(path))  # inherited by the subprocesses
    # A kill must come while a call is in flight (the last check of the kill test): 0.4 s,
    # the example's, was sometimes over before a loaded machine's test process killed.
    monkeypatch.setenv("LANGGRAPH_TOOL_SECONDS", "1.5")
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


async def langgraph_steps(db_url: str, thread_id: str) -> list[int]:
    async with TetherSaver.from_conn_string(db_url) as saver:
        config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
        return [t.metadata["step"] async for t in saver.alist(config)]


async def test_killed_workers_continue_from_the_last_superstep(
        procs: Procs, db_url: str, tool_log: Path) -> None:
    server = procs.serve(app=APP)
    worker = procs.worker(app=APP)
    kills = 0
    with server.client() as c:
        tids = [c.post("/runs", json={"agent": "langgraph_support",
                                      "input": {"question": f"q{i}"}}).json()["thread_id"]
                for i in range(RUNS)]
        for at in (RUNS, 2 * RUNS + 1):  # tool calls started, over all runs: mid-graph
            wait_until(lambda at=at: len(tool_calls(tool_log)) >= at, 60, f"{at} tool calls")
            worker.kill()
            kills += 1
            worker = procs.worker(app=APP)
        for tid in tids:
            wait_status(c, tid, "waiting")
        pending = c.get("/interrupts").json()["interrupts"]
        assert sorted(i["thread_id"] for i in pending) == sorted(tids)
        for ask in pending:
            [lg] = ask["payload"]["interrupts"]
            assert lg["value"]["ask"] == "publish? (yes/no)"
            assert lg["value"]["draft"].count("found: ") == TOPICS

        # One answer through runtime.resume, the others through POST /runs/{id}/resume.
        async with tether.Runtime(db_url) as rt:
            await rt.resume(tids[0], "yes")
        for tid, answer in ((tids[1], "yes"), (tids[2], "no")):
            r = c.post(f"/runs/{tid}/resume", json={"value": answer})
            assert r.status_code == 200, r.text
        done = {tid: wait_status(c, tid, "completed") for tid in tids}
        assert c.get("/interrupts").json()["interrupts"] == []

    for i, tid in enumerate(tids):
        published = done[tid]["state"]["published"]
        if i < 2:
            assert published == " / ".join(f"found: q{i} #{n}" for n in range(TOPICS))
        else:
            assert published == "(withheld)"
        # Every super-step once in LangGraph's history: the input (-1), the start (0),
        # research x TOPICS, approve (interrupted, then resumed), publish.
        steps = await langgraph_steps(db_url, tid)
        assert steps == list(range(TOPICS + 2, -2, -1)), steps
    calls = Counter(tool_calls(tool_log))
    for i, tid in enumerate(tids):
        mine = {k: n for k, n in calls.items() if k.startswith(tid + "|")}
        assert sorted(mine) == sorted(f"{tid}|q{i} #{n}" for n in range(TOPICS))
        # A call repeats only when its super-step was in flight at a kill: one per kill at most.
        assert sum(n - 1 for n in mine.values()) <= kills, mine
    # The kills came mid-graph: some super-step was in flight at one of them.
    assert sum(n - 1 for n in calls.values()) >= 1, calls
