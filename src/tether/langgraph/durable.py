"""tether.langgraph.agent: a compiled LangGraph graph as a tether Agent.

    support = tether.langgraph.agent("support", graph)       # graph = builder.compile()
    runtime = tether.Runtime(db_url, agents=[support])
    await runtime.start(support, {"messages": [...]})          # the graph's input

Each tether step runs one LangGraph super-step (the graph is invoked with
`interrupt_after="*"` and `durability="sync"`, on a TetherSaver of the run's own database,
thread_id = the run's thread_id), so the run's steps are leased, fenced and retried by
tether's workers like any agent's, and a worker killed mid-graph is continued by another from
LangGraph's last checkpoint: only the super-step in flight runs again (and of it, only the
tasks whose writes were not stored).

The run tells what the graph does: the first step (`__start__`) takes the input; every later
tether checkpoint is named after the LangGraph node(s) of its super-step (`agent`, `tools`,
`a+b` for parallel branches), its next node after the ones that run next; the run's state is
the graph's channel values (`graph.get_state(config).values`, as JSON), kept current at every
step, so a step's diff is what its nodes wrote. A LangGraph `interrupt()` parks the run as
`waiting` with an interrupt whose payload is `{"interrupts": [{"id", "value", "node"}]}`;
`runtime.resume(thread_id, value)` (or `POST /runs/{id}/resume`, the CLI, the dashboard)
continues the graph with `Command(resume=value)`: `value` resumes the one pending LangGraph
interrupt, or, with several, is a dict of interrupt id to value. `output(values)`, when
given, is merged into the state as the run completes.

Replays are safe: each execution first journals (ctx.call) the id of the LangGraph checkpoint
it starts from. A re-execution that finds LangGraph past that checkpoint (the crashed
execution's super-step was stored) does not run another; so a resume value reaches the
interrupt it answers, once. The one exception is the input's checkpoint alone (the first
execution died between it and the next): LangGraph's START has not run, so the re-execution
runs it. A tether step named after nodes other than the ones LangGraph has next (the thread
was changed from outside, `update_state`) runs nothing: it commits the values and names the
nodes that do run next.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.constants import START
from langgraph.pregel import Pregel
from langgraph.types import Command as LGCommand
from langgraph.types import StateSnapshot

from .. import serde
from ..agent import Agent, Command, Node, finish, goto
from ..context import Context, callable_name
from ..errors import DefinitionError, InvalidState
from ..retry import RetryPolicy
from ._calls import running
from ._strict import strict_serde
from ._view import label, pending, update
from .saver import TetherSaver

__all__ = ["agent"]

NODE = "superstep"
"""The one node name of runs started before steps were named after LangGraph's nodes."""
Graph = Pregel[Any, Any, Any, Any]
Output = Callable[[dict[str, Any]], Mapping[str, Any]]


class GraphAgent(Agent):
    """A tether Agent whose nodes are named after a LangGraph graph's: any name is a node,
    and every node runs the graph's next super-step."""

    def __init__(self, name: str, graph: Graph, *, retry: RetryPolicy | None) -> None:
        super().__init__(name, retry=retry)
        self.graph = graph

    def get_node(self, name: str) -> Node:
        node = self.nodes.get(name)
        if node is None:
            start = self.nodes[self.start_node()]
            node = Node(name, start.fn, None)
        return node


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
    loads = strict_serde(serde, allowed_types)  # a bad allowed_types fails here, not in a run
    wrapped = GraphAgent(name, graph, retry=retry)
    copies: weakref.WeakKeyDictionary[TetherSaver, Graph] = weakref.WeakKeyDictionary()

    def bound(saver: TetherSaver) -> Graph:
        # The worker's saver for the database, with this agent's serializer: agents share
        # its connections whatever types each allows.
        g = copies.get(saver)
        if g is None:
            g = copies[saver] = graph.copy(update={"checkpointer": saver.with_serde(loads)})
        return g

    def moved(state: dict[str, Any], snap: StateSnapshot) -> Command:
        """The step's command once LangGraph is at `snap`: the values it shows, and the
        super-step that runs next (or the run completes)."""
        values = dict(snap.values)
        change = update(state, values)
        nxt = label(snap)
        if nxt is None:
            return finish({**change, **output(values)} if output is not None else change)
        return goto(nxt, change)

    @wrapped.node(start=True, name=START)
    async def superstep(state: dict[str, Any], ctx: Context) -> Command:
        g = bound(await _saver(ctx.db_url))
        config: RunnableConfig = {"configurable": {"thread_id": ctx.thread_id}}
        snap = await g.aget_state(config)
        here = _checkpoint_id(snap)
        started = await ctx.call(_checkpoint_started, here)
        # LangGraph's START not run yet: no thread, or only the input's checkpoint (an
        # execution of the first step died between it and the next: its super-step is not
        # stored, so the next execution runs it rather than name a step after it).
        first = here is None or label(snap) == START
        if started != here and not first:
            return moved(state, snap)  # a crashed execution of this step stored its super-step
        if first:  # the run's input is the graph's: LangGraph's START, alone
            if ctx.node not in (START, NODE):  # a fork: LangGraph has no thread for it yet
                return goto(START)
            await g.ainvoke(dict(state) if here is None else None, config,
                            interrupt_before="*", durability="sync")
            return moved(state, await g.aget_state(config))
        assert here is not None  # (a thread without a checkpoint is `first`)
        if snap.interrupts:
            value = ctx.interrupt({"interrupts": pending(snap)})
            todo: Any = LGCommand(resume=_resume(snap, value))
            await _replay_earlier(ctx, here)
        elif label(snap) is None:
            return moved(state, snap)
        elif label(snap) != ctx.node and ctx.node != NODE:
            return moved(state, snap)  # the thread moved under us: say what runs next
        else:
            todo = None
        with running(ctx):
            await g.ainvoke(todo, config, interrupt_after="*", durability="sync")
        return moved(state, await g.aget_state(config))

    wrapped.node(name=NODE)(superstep)
    return wrapped


async def _replay_earlier(ctx: Context, here: str) -> None:
    """A resumed node runs its task again from its top: the calls it made in the earlier
    steps that ran this super-step (from checkpoint `here`: the one that reached the
    interrupt, and those that answered earlier ones) replay instead of running again."""
    for step in range(ctx.step - 1, 0, -1):
        records = await ctx.replay_keyed(step)
        if not records or records[0].name != _STARTED or serde.loads(records[0].result) != here:
            return


def _checkpoint_started(checkpoint_id: str | None) -> str | None:
    """Journaled: the LangGraph checkpoint an execution of a step starts from."""
    return checkpoint_id


_STARTED = callable_name(_checkpoint_started)


def _checkpoint_id(snap: StateSnapshot) -> str | None:
    if snap.created_at is None:
        return None
    cid = (snap.config.get("configurable") or {}).get("checkpoint_id")
    return None if cid is None else str(cid)


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
