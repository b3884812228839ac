"""Helpers shared by the in-process integration tests: a runtime, a worker for a block, and a
wait for a condition."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from tether import Agent, Runtime

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


async def eventually(check: Callable[[], bool | Awaitable[bool]], what: str = "a condition",
                     timeout: float = WAIT) -> None:
    """Poll `check` (plain or async) until it is true; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)
