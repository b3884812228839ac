"""Leaving `async with runtime:` with an exception while `runtime.work()` runs in the same
process: the worker stops and gives its lease back, then the store closes (not the store
first, with the worker still writing to it)."""

from __future__ import annotations

import asyncio
import logging

import pytest

import tether


def make(db_url: str, gate: asyncio.Event) -> tuple[tether.Runtime, tether.Agent]:
    agent = tether.Agent("slow")

    @agent.node(start=True)
    async def work(state: dict, ctx: tether.Context) -> tether.Command:
        gate.set()
        await asyncio.sleep(60)
        return tether.finish({})

    return tether.Runtime(db_url, agents=[agent], lease_ttl=30), agent


async def test_an_exception_inside_async_with_stops_the_worker_first(
        db_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TETHER_SHUTDOWN_GRACE", "0.2")
    gate = asyncio.Event()
    rt, agent = make(db_url, gate)
    worker: asyncio.Task[None] | None = None
    with caplog.at_level(logging.WARNING), pytest.raises(RuntimeError, match="boom"):
        async with rt:
            worker = asyncio.create_task(rt.work(concurrency=4))
            run = await rt.start(agent, {})
            await asyncio.wait_for(gate.wait(), 30)
            raise RuntimeError("boom")
    assert worker is not None and worker.done() and worker.exception() is None
    assert not rt.local_workers
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.records
    async with tether.Runtime(db_url) as other:
        after = await other.get(run.thread_id)
    assert after.status == "queued" and after.lease_owner is None, after


async def test_close_without_workers_is_unchanged(db_url: str) -> None:
    rt = tether.Runtime(db_url)
    async with rt:
        await rt.list_runs()
    await rt.close()  # twice is fine
