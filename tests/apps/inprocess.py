"""Helpers shared by the in-process integration tests: a runtime, a worker for a block, and a
wait for a condition."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from tether import Agent, Runtime

from . import eventually

__all__ = ["WAIT", "eventually", "make_runtime", "working"]

WAIT = 30.0  # generous: a wait that times out fails the test, it does not hang it


def make_runtime(db_url: str, *agents: Agent, poll_interval: float = 0.05,
                 **kwargs: Any) -> Runtime:
    return Runtime(db_url, agents=list(agents), version="v1", poll_interval=poll_interval,
                   **kwargs)


@contextlib.asynccontextmanager
async def working(runtime: Runtime, concurrency: int = 8,
                  close: bool = True) -> AsyncIterator[asyncio.Task[None]]:
    """An in-process worker (with its dispatcher) for the block; stopped and awaited after,
    and the runtime closed unless `close` is False."""
    stop = asyncio.Event()
    task = asyncio.create_task(runtime.work(concurrency=concurrency, stop=stop))
    try:
        yield task
    finally:
        stop.set()
        try:
            await asyncio.wait_for(task, WAIT)
        finally:
            if close:
                await runtime.close()


