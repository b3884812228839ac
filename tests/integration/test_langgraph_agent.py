"""tether.langgraph.agent: a compiled LangGraph graph run as a tether agent, in process (the
SIGKILL cases are in tests/acceptance/test_langgraph_durable.py)."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from apps.inprocess import WAIT, make_runtime, working
from tether.errors import DefinitionError, InvalidState
from tether.langgraph import TetherSaver, agent

STEPS = 5


class State(TypedDict, total=False):
    messages: Annotated[list[str], operator.add]
    answer: str


def step(state: State) -> dict[str, Any]:
    return {"messages": [f"m{len(state.get('messages', [])) + 1}"]}


def route(state: State) -> str:
    return "step" if len(state["messages"]) < STEPS else END


def loop_graph() -> Any:
    builder = StateGraph(State)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", route)
    return builder.compile()


def ask(state: State) -> dict[str, Any]:
    return {"answer": str(interrupt({"question": "ok?", "seen": len(state["messages"])}))}


def ask_twice(state: State) -> dict[str, Any]:
    first = interrupt("first?")
    second = interrupt("second?")
    return {"answer": f"{first}+{second}"}


def approval_graph(node: Any = ask) -> Any:
    builder = StateGraph(State)
    builder.add_node("step", step)
    builder.add_node("ask", node)
    builder.add_edge(START, "step")
    builder.add_edge("step", "ask")
    builder.add_edge("ask", END)
    return builder.compile()


async def history(db_url: str, thread_id: str) -> list[int]:
    async with TetherSaver.from_conn_string(db_url) as saver:
        config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
        return [t.metadata["step"] async for t in saver.alist(config)]


async def looped_run(db_url: str) -> str:
    """A run of the loop graph, started and finished; checks it took one tether step per
    super-step, each once. Its thread_id."""
    looped = agent("lg_loop", loop_graph())
    rt = make_runtime(db_url, looped)
    async with working(rt):
        run = await rt.start(looped, {"messages": []})
        done = await rt.wait(run.thread_id, timeout=WAIT)
        cps = await rt.checkpoints(run.thread_id)
    assert done.status == "completed"
    assert done.state == {"messages": [f"m{i}" for i in range(1, STEPS + 1)]}
    # LangGraph's log: the input, then one checkpoint per super-step, each once.
    assert await history(db_url, run.thread_id) == list(range(STEPS, -2, -1))
    # tether's: the input (LangGraph's START), then one step per super-step, named after it.
    assert [c.step for c in cps] == list(range(1, len(cps) + 1))
    assert [(c.node, c.next_node) for c in cps] == (
        [("__start__", "step")] + [("step", "step")] * (STEPS - 1) + [("step", None)])
    assert [c.state for c in cps] == [{"messages": [f"m{i}" for i in range(1, n + 1)]}
                                      for n in range(STEPS + 1)]
    return run.thread_id


async def test_one_superstep_per_tether_step(db_url: str) -> None:
    await looped_run(db_url)


async def test_langgraph_interrupt_is_a_tether_interrupt(db_url: str) -> None:
    asking = agent("lg_ask", approval_graph())
    rt = make_runtime(db_url, asking)
    async with working(rt):
        run = await rt.start(asking, {"messages": []})
        await rt.wait(run.thread_id, timeout=WAIT, until="waiting")
        [pending] = await rt.interrupts(thread_id=run.thread_id)
        [lg] = pending.payload["interrupts"]
        assert lg["value"] == {"question": "ok?", "seen": 1}
        await rt.resume(run.thread_id, "yes")
        done = await rt.wait(run.thread_id, timeout=WAIT)
    assert done.status == "completed"
    assert done.state == {"messages": ["m1"], "answer": "yes"}
    steps = await history(db_url, run.thread_id)
    assert len(steps) == len(set(steps))


async def test_two_interrupts_in_one_node_each_answered_once(db_url: str) -> None:
    asking = agent("lg_ask2", approval_graph(ask_twice))
    rt = make_runtime(db_url, asking)
    async with working(rt):
        run = await rt.start(asking, {"messages": []})
        for question, answer in (("first?", "a"), ("second?", "b")):
            await rt.wait(run.thread_id, timeout=WAIT, until="waiting")
            [pending] = await rt.interrupts(thread_id=run.thread_id)
            assert [i["value"] for i in pending.payload["interrupts"]] == [question]
            await rt.resume(run.thread_id, answer)
        done = await rt.wait(run.thread_id, timeout=WAIT)
    assert done.status == "completed" and done.state["answer"] == "a+b"


async def test_a_fork_starts_the_graph_again_from_the_forked_values(db_url: str) -> None:
    looped = agent("lg_fork", loop_graph())
    rt = make_runtime(db_url, looped)
    async with working(rt):
        run = await rt.start(looped, {"messages": []})
        await rt.wait(run.thread_id, timeout=WAIT)
        forked = await rt.fork(run.thread_id, 3)  # after m1, m2
        done = await rt.wait(forked.thread_id, timeout=WAIT)
        cps = await rt.checkpoints(forked.thread_id)
    assert done.status == "completed", done.error
    assert done.state == {"messages": [f"m{i}" for i in range(1, STEPS + 1)]}
    # A step named after the node it forked at, which runs nothing (LangGraph has no thread
    # for the new run yet), then LangGraph's START with the forked values as input.
    assert [(c.node, c.next_node) for c in cps][:3] == [
        ("step", "__start__"), ("__start__", "step"), ("step", "step")]
    assert cps[1].state == {"messages": ["m1", "m2"]}


async def test_output_shapes_the_final_state(db_url: str) -> None:
    looped = agent("lg_out", loop_graph(), output=lambda v: {"count": len(v["messages"])})
    rt = make_runtime(db_url, looped)
    async with working(rt):
        run = await rt.start(looped, {"messages": ["seed"]})
        done = await rt.wait(run.thread_id, timeout=WAIT)
    assert done.state["count"] == STEPS
    assert done.state["messages"] == ["seed"] + [f"m{i}" for i in range(2, STEPS + 1)]


def test_only_compiled_graphs() -> None:
    builder = StateGraph(State)
    with pytest.raises(DefinitionError, match="compiled LangGraph graph"):
        agent("lg_bad", builder)  # type: ignore[arg-type]


def test_several_pending_interrupts_need_a_map() -> None:
    from langgraph.types import Interrupt, StateSnapshot

    from tether.langgraph.durable import _resume

    snap = StateSnapshot({}, (), {"configurable": {}}, None, None, None, (),
                         (Interrupt("a", id="i1"), Interrupt("b", id="i2")))
    assert _resume(snap, {"i1": 1, "i2": 2}) == {"i1": 1, "i2": 2}
    with pytest.raises(InvalidState, match="dict of interrupt id"):
        _resume(snap, "yes")


async def test_a_first_step_cut_short_after_the_inputs_checkpoint_runs_the_rest(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An execution of the first step that stored LangGraph's input checkpoint (step -1) and
    died before the next (a kill, a lost lease) left LangGraph's START still to run: the next
    execution runs it, and the run's steps are the same as without the cut."""
    put = TetherSaver.aput
    cut: list[str] = []

    async def aput(self: TetherSaver, config: RunnableConfig, checkpoint: Any, metadata: Any,
                   new_versions: Any) -> RunnableConfig:
        if metadata.get("step") == 0 and not cut:
            cut.append(str(config["configurable"]["thread_id"]))
            raise RuntimeError("cut short between the input's checkpoint and the next")
        return await put(self, config, checkpoint, metadata, new_versions)

    monkeypatch.setattr(TetherSaver, "aput", aput)
    assert cut == [await looped_run(db_url)]
