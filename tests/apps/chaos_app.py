"""The agent that worker subprocesses run in the crash and chaos tests.

    python -m tether worker --app apps.chaos_app:make_runtime --db URL ...

A run of `chaos` makes `state["steps"]` super-steps of one node. Each step makes exactly one
journaled call, `record_call`, which appends the line `thread_id,step,attempt,pid,nonce` to
the file named by $CHAOS_CALL_LOG *before* it pauses and returns: one O_APPEND write(2), so
the line survives a SIGKILL that lands during the pause. The log therefore counts real
invocations, including those whose result was never journaled. After the call is journaled,
the node pauses for a random duration within `state["after"]` (if given), so that kills also
land between journal and checkpoint; and step `state["slow_step"]` (if any) sleeps
`state["slow"]` seconds.
"""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any, NamedTuple

import tether

from . import CALL_LOG_ENV

agent = tether.Agent("chaos")


async def record_call(thread_id: str, step: int, attempt: int, pause: list[float]
                      ) -> dict[str, Any]:
    """The nondeterministic call: logged at once, then a pause, then a unique result."""
    nonce = uuid.uuid4().hex
    line = f"{thread_id},{step},{attempt},{os.getpid()},{nonce}\n".encode()
    fd = os.open(os.environ[CALL_LOG_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    await asyncio.sleep(random.uniform(*pause))
    return {"attempt": attempt, "pid": os.getpid(), "nonce": nonce}


@agent.node(start=True)
async def work(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    out = await ctx.call(record_call, ctx.thread_id, ctx.step, ctx.attempt, state["pause"])
    if "after" in state:
        await asyncio.sleep(random.uniform(*state["after"]))
    if ctx.step == state.get("slow_step"):
        await asyncio.sleep(state["slow"])
    update = {"done": tether.append([ctx.step]), "nonces": tether.append([out["nonce"]])}
    if ctx.step >= state["steps"]:
        return tether.finish({**update, "finished": True})
    return tether.goto("work", update)


def run_input(i: int, *, steps: int, pause: tuple[float, float] = (0.005, 0.02),
              after: tuple[float, float] | None = None, slow_step: int | None = None,
              slow: float = 0.0) -> dict[str, Any]:
    data: dict[str, Any] = {"i": i, "steps": steps, "pause": list(pause)}
    if after is not None:
        data["after"] = list(after)
    if slow_step is not None:
        data.update(slow_step=slow_step, slow=slow)
    return data


def final_state(input: dict[str, Any], nonces: list[str]) -> dict[str, Any]:
    """The state a run of `input` ends in, given the results its calls were journaled with."""
    return {**input, "done": list(range(1, input["steps"] + 1)), "nonces": nonces,
            "finished": True}


def make_runtime() -> tether.Runtime:
    """The worker's Runtime; `tether worker --db/--lease-ttl` and TETHER_* env override."""
    return tether.Runtime(os.environ.get("TETHER_DB"), agents=[agent], version="v1")


class Call(NamedTuple):
    thread_id: str
    step: int
    attempt: int
    pid: int
    nonce: str


def read_calls(path: Path) -> dict[tuple[str, int], list[Call]]:
    """Invocations of record_call per (thread_id, step), in the order they started."""
    calls: dict[tuple[str, int], list[Call]] = defaultdict(list)
    if not path.exists():
        return calls
    for line in path.read_text().splitlines():
        thread_id, step, attempt, pid, nonce = line.split(",")
        calls[thread_id, int(step)].append(
            Call(thread_id, int(step), int(attempt), int(pid), nonce))
    return calls
