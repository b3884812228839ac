"""Structured logs: one JSON line per finished run and per failed step."""

from __future__ import annotations

import io
import json
import logging

from apps import observe_app as app
from apps.inprocess import WAIT, working
from tether.observe import enable_json_logs


async def test_one_json_line_per_finished_run_and_per_failure(db_url: str) -> None:
    out = io.StringIO()
    rt = app.make_runtime().with_db(db_url)
    root = logging.getLogger()
    handlers = list(root.handlers)
    formatters = [h.formatter for h in handlers]
    try:
        enable_json_logs(rt, out)
        async with working(rt):
            ok = await rt.start(app.agent, {"steps": 2, "fail": 1})
            bad = await rt.start(app.agent, {"steps": 2, "fail": 3})
            assert (await rt.wait(ok.thread_id, timeout=WAIT)).status == "completed"
            assert (await rt.wait(bad.thread_id, timeout=WAIT)).status == "failed"
    finally:
        for h, f in zip(handlers, formatters, strict=True):
            h.setFormatter(f)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    finished = {r["thread_id"]: r for r in lines if r["event"] == "run_finished"}
    assert set(finished) == {ok.thread_id, bad.thread_id}
    good = finished[ok.thread_id]
    assert (good["agent"], good["version"], good["status"], good["steps"]) == ("obs", "v1",
                                                                              "completed", 2)
    assert good["total_ms"] >= good["exec_ms"] > 0 and good["wait_ms"] is not None
    assert finished[bad.thread_id]["status"] == "failed"
    assert finished[bad.thread_id]["attempts"] == 3
    failures = [(r["thread_id"], r["attempt"], r["category"], r["final"]) for r in lines
                if r["event"] == "step_failed"]
    assert sorted(failures) == sorted([
        (ok.thread_id, 1, "exception", False), (bad.thread_id, 1, "exception", False),
        (bad.thread_id, 2, "exception", False), (bad.thread_id, 3, "exception", True)])


async def test_exec_ms_sums_every_drive_of_the_run(db_url: str) -> None:
    """A run parked for a person and resumed is driven twice: its finished line's exec_ms
    holds the steps of both drives (it held only the last drive's)."""
    import asyncio

    from tether import Agent, Command, Context, finish, goto

    agent = Agent("slowask")

    @agent.node(start=True)
    async def think(state: dict[str, int], ctx: Context) -> Command:
        await asyncio.sleep(0.2)
        return goto("ask", {})

    @agent.node
    async def ask(state: dict[str, int], ctx: Context) -> Command:
        answer = ctx.interrupt({"ok?": 1})
        await asyncio.sleep(0.05)
        return finish({"answer": answer})

    out = io.StringIO()
    rt = app.make_runtime().with_db(db_url)
    rt.registry.add_agent(agent)
    root = logging.getLogger()
    handlers = list(root.handlers)
    formatters = [h.formatter for h in handlers]
    try:
        enable_json_logs(rt, out)
        async with working(rt):
            run = await rt.start(agent, {})
            await rt.wait(run.thread_id, timeout=WAIT, until="waiting")
            await rt.resume(run.thread_id, "yes")
            assert (await rt.wait(run.thread_id, timeout=WAIT)).status == "completed"
    finally:
        for h, f in zip(handlers, formatters, strict=True):
            h.setFormatter(f)
    line = next(json.loads(raw) for raw in out.getvalue().splitlines()
                if json.loads(raw)["event"] == "run_finished")
    assert line["exec_ms"] >= 250, line  # 200 ms before the park, 50 ms after


async def test_exec_ms_is_the_sum_of_every_step_of_one_drive(db_url: str) -> None:
    """Five steps driven at once (no park, no retry): exec_ms is the sum of the five steps'
    execution as the store recorded them (each checkpoint's started_at to finished_at), not
    the last step's alone."""
    out = io.StringIO()
    rt = app.make_runtime().with_db(db_url)
    root = logging.getLogger()
    handlers = list(root.handlers)
    formatters = [h.formatter for h in handlers]
    try:
        enable_json_logs(rt, out)
        async with working(rt):
            run = await rt.start(app.agent, {"steps": 5, "pause": 0.04})
            assert (await rt.wait(run.thread_id, timeout=WAIT)).status == "completed"
        checkpoints = await rt.checkpoints(run.thread_id)
    finally:
        for h, f in zip(handlers, formatters, strict=True):
            h.setFormatter(f)
    line = next(r for r in map(json.loads, out.getvalue().splitlines())
                if r["event"] == "run_finished")
    assert [c.step for c in checkpoints] == [1, 2, 3, 4, 5]
    steps_ms = sum(c.duration for c in checkpoints) * 1000
    assert abs(line["exec_ms"] - steps_ms) < 0.01, (line, steps_ms)
    assert line["exec_ms"] >= 5 * 40
    assert line["exec_ms"] > 2 * max(c.duration for c in checkpoints) * 1000
