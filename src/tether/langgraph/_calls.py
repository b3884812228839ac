"""tether.langgraph.call and call_sync: a journaled call from inside a node of a graph that
tether.langgraph.agent runs.

    async def research(state, config):
        note = await tether.langgraph.call(search_tool, state["question"])

In a durable run the call is a journaled call of the tether step running the node's
super-step: its result is recorded before it is returned, a re-execution of the step (after a
crash) gets it back without calling again, and a result that reports token usage adds to
`Run.usage`. Calls are keyed by the LangGraph task making them (its checkpoint namespace,
which LangGraph derives from the checkpoint the super-step starts from) and their order in
that task, so parallel nodes of one super-step each get their own results back whatever order
they run in; a node resumed after its `interrupt()` (which LangGraph runs again from its top)
replays the calls it made before it. A sync node uses `call_sync` (LangGraph runs sync nodes
in threads of its own). Outside a durable run (`graph.invoke` with any checkpointer) it just calls `fn`.
"""

from __future__ import annotations

import asyncio
import inspect
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from langchain_core import messages
from langgraph.config import get_config

from .._declared import register_type
from ..context import Context

__all__ = ["call", "call_sync", "running"]

T = TypeVar("T")

# A model's reply journaled by `call` is read back by whichever worker re-executes the step
# (after a kill, another process): LangChain's messages are known to every process that
# imports tether.langgraph, as they are to LangGraph's own serializer.
for _cls in (messages.AIMessage, messages.AIMessageChunk, messages.HumanMessage,
             messages.SystemMessage, messages.ToolMessage, messages.ChatMessage,
             messages.FunctionMessage, messages.RemoveMessage):
    register_type(_cls)


@dataclass
class _Step:
    ctx: Context
    loop: asyncio.AbstractEventLoop
    counts: Counter[str] = field(default_factory=Counter)


_current: ContextVar[_Step | None] = ContextVar("tether_langgraph_step", default=None)


@contextmanager
def running(ctx: Context) -> Iterator[None]:
    """While a super-step runs in `ctx`'s step: its nodes' `call`s are journaled there."""
    token = _current.set(_Step(ctx, asyncio.get_running_loop()))
    try:
        yield
    finally:
        _current.reset(token)


@overload
async def call(fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T: ...


@overload
async def call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T: ...


async def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` (sync or async), journaled in the tether step running this node
    when the graph runs under tether.langgraph.agent; called directly otherwise."""
    step = _current.get()
    if step is None:
        value = fn(*args, **kwargs)
        return await value if inspect.isawaitable(value) else value
    return await step.ctx.keyed_call(_key(step), fn, *args, **kwargs)


def call_sync(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`call` for a sync node (LangGraph runs those in a thread of its own): the journaling
    runs on the worker's event loop, and this thread waits for it."""
    step = _current.get()
    if step is None:
        value = fn(*args, **kwargs)
        return asyncio.run(value) if inspect.iscoroutine(value) else value
    try:
        here = asyncio.get_running_loop()
    except RuntimeError:
        here = None
    if here is step.loop:
        raise RuntimeError("tether.langgraph.call_sync() would block the event loop it needs: "
                           "in an async node, use `await tether.langgraph.call(...)`")
    key = _key(step)
    return asyncio.run_coroutine_threadsafe(
        step.ctx.keyed_call(key, fn, *args, **kwargs), step.loop).result()


def _key(step: _Step) -> str:
    """The next call's key: the LangGraph task making it (its checkpoint namespace, the same
    when a re-execution runs the task again) and how many calls that task made before it."""
    try:
        ns = str((get_config().get("configurable") or {}).get("checkpoint_ns", ""))
    except RuntimeError:  # not inside a node: no task to key the call by
        ns = ""
    n = step.counts[ns]
    step.counts[ns] += 1
    return f"{ns}#{n}"
