"""The SSE events of a run as the server's poller makes them (the worker is another
Runtime, so no live event reaches the stream): ids that resume after a second interrupt,
one step event per step with its node, and the ids a Last-Event-ID may carry."""

from __future__ import annotations

import asyncio
from typing import Any

import tether
from apps.inprocess import WAIT, eventually, make_runtime, working
from tether.service.events import encode, run_events, valid_event_id

twice = tether.Agent("twice")


@twice.node(start=True)
async def first(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    answer = ctx.interrupt({"q": 1})
    return tether.goto("second", {"a": answer})


@twice.node
async def second(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    answer = ctx.interrupt({"q": 2})
    return tether.finish({"b": answer})


async def until_type(stream: Any, kind: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    async for ev in stream:
        if ev is None:
            continue
        out.append(ev)
        if ev["type"] == kind:
            break
    await stream.aclose()
    return out


async def test_resume_after_an_id_across_a_second_interrupt(db_url: str) -> None:
    server = make_runtime(db_url, twice)
    worker = make_runtime(db_url, twice)
    try:
        run = await server.start("twice", {})
        async with working(worker):
            rec = await server.peek(run.thread_id)
            seen = await asyncio.wait_for(
                until_type(run_events(server, rec, poll=0.05), "interrupted"), WAIT)
            # status (queued), maybe status (running, if a poll falls between), interrupted
            assert seen[0]["type"] == "status" and seen[-1]["type"] == "interrupted"
            assert {e["type"] for e in seen[1:-1]} <= {"status"}, seen
            assert seen[-1]["node"] == "first" and seen[-1]["step"] == 1
            last = seen[-1]["_id"]
            assert valid_event_id(last)
            assert b"\nid: " + last.encode() + b"\n\n" in encode(seen[-1])
            assert b'"_id"' not in encode(seen[-1])
            await server.resume(run.thread_id, "one")

            async def asked_again() -> bool:
                pending = await server.interrupts(thread_id=run.thread_id)
                return bool(pending) and pending[0].step == 2

            await eventually(asked_again)
            # Still waiting, as at the id: what changed is the step and the interrupt.
            rest = await asyncio.wait_for(until_type(
                run_events(server, rec, poll=0.05, after=last), "interrupted"), WAIT)
            # (a poll may fall while the run runs again: a status event "running" between)
            rest = [e for e in rest if e["type"] != "status"]
            assert [e["type"] for e in rest] == ["resumed", "step", "interrupted"], rest
            assert rest[0]["interrupt_id"] == seen[-1]["interrupt_id"]
            assert (rest[1]["step"], rest[1]["node"], rest[1]["next_node"]) == (1, "first",
                                                                                 "second")
            assert rest[2]["node"] == "second" and rest[2]["step"] == 2
            assert rest[2]["payload"] == {"q": 2}
            await server.resume(run.thread_id, "two")
            end = await asyncio.wait_for(until_type(
                run_events(server, rec, poll=0.05, after=rest[-1]["_id"]), "completed"), WAIT)
            assert [e["type"] for e in end if e["type"] != "status"] == ["resumed", "step",
                                                                          "completed"], end
    finally:
        await server.close()


def test_valid_event_ids() -> None:
    for bad in ("", "x", "W10", "WzEsMiwieCJd", "WyJhIiwxLCJ4IixbXV0", "WzEsMiwieCIsWzFdXQ",
                "W3RydWUsMSwieCIsW11d", "x" * 9000):
        assert not valid_event_id(bad), bad
    assert valid_event_id("WzEsMiwieCIsW11d")  # [1,2,"x",[]]
