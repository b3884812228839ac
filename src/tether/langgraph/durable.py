"""tether.langgraph.agent: a compiled LangGraph graph as a tether Agent.

    support = tether.langgraph.agent("support", graph)       # graph = builder.compile()
    runtime = tether.Runtime(db_url, agents=[support])
    await runtime.start(support, {"messages": [...]})          # the graph's input

The agent has one node, `superstep`. Each tether step runs one LangGraph super-step (the graph
is invoked with `interrupt_after="*"` and `durability="sync"`, on a TetherSaver of the run's own
database, thread_id = the run's thread_id), so the run's steps are leased, fenced and retried
by tether's workers like any agent's, and a worker killed mid-graph is continued by another
from LangGraph's last checkpoint: only the super-step in flight runs again (and of it, only the
tasks whose writes were not stored). A LangGraph `interrupt()` parks the tether run as
`waiting` with an interrupt whose payload is `{"interrupts": [{"id": ..., "value": ...}]}`;
`runtime.resume(thread_id, value)` (or `POST /runs/{id}/resume`) answers it: `value` resumes
the one pending LangGraph interrupt, or, with several, is a dict of interrupt id to value.
When the graph ends, the run completes with `output(values)` merged into its state
(default: `{"values": values}`; tether state is JSON).

Replays are safe: each execution first journals (ctx.call) the id of the LangGraph checkpoint it
starts from. A re-execution that finds LangGraph past that checkpoint (the crashed execution's
super-step was stored) does not run another; so a resume value reaches the interrupt it
answers, once.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.pregel import Pregel
from langgraph.types import Command as LGCommand
from langgraph.types import StateSnapshot

from ..agent import Agent, Command, finish, goto
from ..context import Context
from ..errors import DefinitionError, InvalidState
from ..retry import RetryPolicy
from ._strict import strict_serde
from .saver import TetherSaver

__all__ = ["agent"]

NODE = "superstep"
Graph = Pregel[Any, Any, Any, Any]
Output = Callable[[dict[str, Any]], Mapping[str, Any]]


def _values(values: dict[str, Any]) -> Mapping[str, Any]:
    return {"values": values}


def agent(name: str, graph: Graph, *, output: Output | None = None,
          retry: RetryPolicy | None = None, serde: SerializerProtocol | None = None,
          allowed_types: Collection[type] = ()) -> Agent:
    """A tether Agent running `graph` (a compiled LangGraph graph), one super-step per step.

    `serde` and `allowed_types` are TetherSaver's: the graph's checkpoints are read back with
    LangGraph's own types and `allowed_types` only (the classes its state holds), unless
    `serde` is another serializer."""
    if not isinstance(graph, Pregel):
        raise DefinitionError(f"tether.langgraph.agent() takes a compiled LangGraph graph "
                              f"(builder.compile()), got {type(graph).__name__}")
    shape = output or _values
    loads = strict_serde(serde, allowed_types)  # a bad allowed_types fails here, not in a run
    wrapped = Agent(name, retry=retry)
    copies: weakref.WeakKeyDictionary[TetherSaver, Graph] = weakref.WeakKeyDictionary()

    def bound(saver: TetherSaver) -> Graph:
        # The worker's saver for the database, with this agent's serializer: agents share
        # its connections whatever types each allows.
        g = copies.get(saver)
        if g is None:
            g = copies[saver] = graph.copy(update={"checkpointer": saver.with_serde(loads)})
        return g

    @wrapped.node(start=True, name=NODE)
    async def superstep(state: dict[str, Any], ctx: Context) -> Command:
        g = bound(await _saver(ctx.db_url))
        config: RunnableConfig = {"configurable": {"thread_id": ctx.thread_id}}
        snap = await g.aget_state(config)
        here = _checkpoint_id(snap)
        started = await ctx.call(_checkpoint_started, here)
        if started != here:  # a crashed execution of this step stored its super-step
            return goto(NODE, _progress(snap))
        if snap.interrupts:
            value = ctx.interrupt({"interrupts": [{"id": i.id, "value": i.value}
                                                  for i in snap.interrupts]})
            todo: Any = LGCommand(resume=_resume(snap, value))
        elif here is None:
            todo = dict(state)  # the run's input is the graph's
        elif not snap.next:
            return finish(shape(dict(snap.values)))
        else:
            todo = None
        await g.ainvoke(todo, config, interrupt_after="*", durability="sync")
        snap = await g.aget_state(config)
        if not snap.next and not snap.interrupts:
            return finish(shape(dict(snap.values)))
        return goto(NODE, _progress(snap))

    return wrapped


def _checkpoint_started(checkpoint_id: str | None) -> str | None:
    """Journaled: the LangGraph checkpoint an execution of a step starts from."""
    return checkpoint_id


def _checkpoint_id(snap: StateSnapshot) -> str | None:
    if snap.created_at is None:
        return None
    cid = (snap.config.get("configurable") or {}).get("checkpoint_id")
    return None if cid is None else str(cid)


def _progress(snap: StateSnapshot) -> dict[str, Any]:
    step = (snap.metadata or {}).get("step")
    return {"langgraph": {"step": step, "next": list(snap.next)}}


def _resume(snap: StateSnapshot, value: Any) -> Any:
    ids = [i.id for i in snap.interrupts]
    if len(ids) == 1:
        return value
    if isinstance(value, dict) and value and set(value) <= set(ids):
        return value
    raise InvalidState(f"{len(ids)} LangGraph interrupts are pending: resume with a dict of "
                       f"interrupt id to value (ids: {ids})")


# -- one saver per database and event loop, closed when the loop shuts down ----------------

# (id of the loop, url) -> (the loop, its saver, what closes it at the loop's shutdown)
_savers: dict[tuple[int, str], tuple[asyncio.AbstractEventLoop, TetherSaver,
                                     AsyncIterator[None]]] = {}


async def _saver(url: str) -> TetherSaver:
    loop = asyncio.get_running_loop()
    key = (id(loop), url)
    held = _savers.get(key)
    if held is not None and held[0] is loop:
        return held[1]
    saver = TetherSaver(url)
    await saver.aopen()
    holder = _hold(key, saver)
    await holder.__anext__()
    _savers[key] = (loop, saver, holder)
    return saver


async def _hold(key: tuple[int, str], saver: TetherSaver) -> AsyncIterator[None]:
    """Suspended until the loop's shutdown (asyncio.run's shutdown_asyncgens) closes it, which
    closes the saver: its connections live as long as the worker's loop."""
    try:
        yield
    finally:
        if (held := _savers.get(key)) is not None and held[1] is saver:
            del _savers[key]
        await saver.aclose()
