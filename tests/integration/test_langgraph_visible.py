"""A durable LangGraph run tells what its graph did: tether checkpoints named after the nodes
of each super-step, the run's state the graph's channel values at every step, interrupts
with their values, calls made inside nodes journaled in their step (with LLM usage), and
LangGraph's own history, update_state and time travel on the same thread (the SIGKILL case
is tests/acceptance/test_langgraph_visible_crash.py)."""

from __future__ import annotations

import operator
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

import tether
from apps.inprocess import WAIT, make_runtime, working
from tether.langgraph import TetherSaver, agent, call, call_sync


class State(TypedDict, total=False):
    notes: Annotated[list[str], operator.add]
    reply: AIMessage
    answer: str


TOOL: Counter[str] = Counter()


async def lookup(query: str) -> str:
    TOOL[query] += 1
    return f"found {query}"


def fake_model(prompt: str) -> AIMessage:
    TOOL[prompt] += 1
    return AIMessage(content=f"re: {prompt}",
                     usage_metadata={"input_tokens": 7, "output_tokens": 3, "total_tokens": 10})


async def left(state: State) -> dict[str, Any]:
    return {"notes": [await call(lookup, "left")]}


FAILS: Counter[str] = Counter()


async def right(state: State) -> dict[str, Any]:
    note = await call(lookup, "right")
    if FAILS["right"] == 0:  # fails once after its call is journaled: the step runs again
        FAILS["right"] += 1
        raise RuntimeError("right fails once")
    return {"notes": [note]}


def model(state: State) -> dict[str, Any]:  # a sync node: LangGraph runs it in a thread
    return {"reply": call_sync(fake_model, " + ".join(state["notes"]))}


def ask(state: State) -> dict[str, Any]:
    return {"answer": str(interrupt({"draft": state["reply"].content}))}


def parallel_graph(checkpointer: Any = None) -> Any:
    b = StateGraph(State)
    b.add_node("left", left)
    b.add_node("right", right)
    b.add_node("model", model)
    b.add_node("ask", ask)
    b.add_edge(START, "left")
    b.add_edge(START, "right")
    b.add_edge(["left", "right"], "model")
    b.add_edge("model", "ask")
    b.add_edge("ask", END)
    return b.compile(checkpointer=checkpointer)


def distinct(states: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive equal states once (an interrupted super-step stores no LangGraph checkpoint
    of its own: its tether step shows the same values)."""
    return [s for i, s in enumerate(states) if i == 0 or s != states[i - 1]]


def as_json(values: dict[str, Any]) -> dict[str, Any]:
    out = dict(values)
    if "reply" in out:
        out["reply"] = out["reply"].model_dump(mode="json")
    return out


async def test_steps_name_nodes_state_is_values_calls_journaled(db_url: str) -> None:
    TOOL.clear()
    FAILS.clear()
    graph = parallel_graph()
    durable = agent("lg_visible", graph, retry=tether.RetryPolicy(initial=0.01, jitter=0))
    rt = make_runtime(db_url, durable)
    async with working(rt):
        run = await rt.start(durable, {"notes": []})
        await rt.wait(run.thread_id, timeout=WAIT, until="waiting")
        [pending] = await rt.interrupts(thread_id=run.thread_id)
        [lg] = pending.payload["interrupts"]
        assert lg["value"] == {"draft": "re: found left + found right"}
        assert lg["node"] == "ask"
        await rt.resume(run.thread_id, "ship it")
        done = await rt.wait(run.thread_id, timeout=WAIT)
        cps = await rt.checkpoints(run.thread_id)
        parallel = next(c for c in cps if c.node == "left+right")
        journal = await rt.calls(run.thread_id, parallel.step)
        modeled = next(c for c in cps if c.node == "model")
        model_calls = await rt.calls(run.thread_id, modeled.step)
        got = await rt.get(run.thread_id)
    assert done.status == "completed", done.error
    assert [(c.node, c.next_node) for c in cps] == [
        ("__start__", "left+right"), ("left+right", "model"), ("model", "ask"),
        ("ask", "ask"), ("ask", None)]
    # The state is the graph's values (as JSON) at every step, the last one included.
    async with TetherSaver.from_conn_string(db_url) as saver:
        g = parallel_graph(saver)
        config: RunnableConfig = {"configurable": {"thread_id": run.thread_id}}
        history = [s async for s in g.aget_state_history(config)]
        final = await g.aget_state(config)
    lg_states = [as_json(s.values) for s in reversed(history) if s.metadata["step"] >= 0]
    assert distinct([c.state for c in cps]) == lg_states
    assert done.state == as_json(final.values)
    assert done.state["answer"] == "ship it"
    # The parallel nodes' calls are the calls of their step; `right` failed once after its
    # call was journaled and got its own result back, not `left`'s; nothing ran twice.
    assert sorted(r.result for r in journal if "lookup" in r.name) == ["found left",
                                                                        "found right"]
    assert TOOL["left"] == 1 and TOOL["right"] == 1
    assert sorted(parallel.state["notes"]) == ["found left", "found right"]
    [llm] = [r for r in model_calls if "fake_model" in r.name]
    assert llm.result.content == "re: found left + found right"
    assert got.usage["input_tokens"] == 7 and got.usage["output_tokens"] == 3


async def test_history_update_state_and_time_travel_on_a_durable_thread(db_url: str) -> None:
    TOOL.clear()
    FAILS.clear()
    FAILS["right"] = 1  # no failure this time
    durable = agent("lg_travel", parallel_graph())
    rt = make_runtime(db_url, durable)
    async with working(rt), TetherSaver.from_conn_string(db_url) as saver:
        g = parallel_graph(saver)
        run = await rt.start(durable, {"notes": []})
        config: RunnableConfig = {"configurable": {"thread_id": run.thread_id}}
        await rt.wait(run.thread_id, timeout=WAIT, until="waiting")
        # A person answers by editing the state instead: LangGraph's update_state, as `ask`.
        await g.aupdate_state(config, {"answer": "edited"}, as_node="ask")
        assert (await g.aget_state(config)).next == ()
        await rt.resume(run.thread_id, "ignored")
        done = await rt.wait(run.thread_id, timeout=WAIT)
        assert done.status == "completed", done.error
        assert done.state["answer"] == "edited"
        assert done.state == as_json((await g.aget_state(config)).values)
        cps = await rt.checkpoints(run.thread_id)
        assert cps[-1].node == "ask" and cps[-1].next_node is None

        history = [s async for s in g.aget_state_history(config)]
        steps = [s.metadata["step"] for s in history]
        assert steps == sorted(steps, reverse=True) and len(steps) == len(set(steps))
        # Time travel: from the checkpoint before `model`, again, on a new branch.
        before_model = next(s for s in history if s.next == ("model",))
        calls_before = TOOL[" + ".join(before_model.values["notes"])]
        await g.ainvoke(None, before_model.config, interrupt_before=["ask"])
        now = await g.aget_state(config)
        assert now.next == ("ask",)
        assert now.parent_config is not None
        assert TOOL[" + ".join(before_model.values["notes"])] == calls_before + 1
        # The branch is added to the thread's history; the old checkpoints stay.
        after = [s.config["configurable"]["checkpoint_id"]
                 async for s in g.aget_state_history(config)]
        assert len(after) > len(history)
        assert {s.config["configurable"]["checkpoint_id"] for s in history} <= set(after)


async def test_a_run_on_a_thread_langgraph_has_continues_it(db_url: str) -> None:
    TOOL.clear()
    FAILS.clear()
    FAILS["right"] = 1
    durable = agent("lg_adopt", parallel_graph())
    rt = make_runtime(db_url, durable)
    await rt.migrate()
    # The thread was begun by plain LangGraph on TetherSaver, up to `ask`.
    async with TetherSaver.from_conn_string(db_url) as saver:
        g = parallel_graph(saver)
        config: RunnableConfig = {"configurable": {"thread_id": "adopted"}}
        await g.ainvoke({"notes": ["seed"]}, config, interrupt_before=["ask"])
        assert (await g.aget_state(config)).next == ("ask",)
    calls = sum(TOOL.values())
    async with working(rt):
        await rt.start(durable, {"notes": ["ignored"]}, thread_id="adopted")
        await rt.wait("adopted", timeout=WAIT, until="waiting")
        await rt.resume("adopted", "ok")
        done = await rt.wait("adopted", timeout=WAIT)
        cps = await rt.checkpoints("adopted")
    assert done.status == "completed", done.error
    assert sum(TOOL.values()) == calls  # nothing before `ask` ran again
    # The first step ran nothing: it took LangGraph's values and named what runs next.
    assert [(c.node, c.next_node) for c in cps] == [
        ("__start__", "ask"), ("ask", "ask"), ("ask", None)]
    assert cps[0].state["notes"] == ["seed", "found left", "found right"]
    assert done.state["answer"] == "ok"


async def draft_then_ask(state: State) -> dict[str, Any]:
    reply = await call(fake_model, "draft")
    first = interrupt({"draft": reply.content})
    second = interrupt("sure?")
    return {"reply": reply, "answer": f"{first}+{second}"}


async def test_a_call_before_an_interrupt_is_not_made_again_on_resume(db_url: str) -> None:
    TOOL.clear()
    b = StateGraph(State)
    b.add_node("draft", draft_then_ask)
    b.add_edge(START, "draft")
    b.add_edge("draft", END)
    durable = agent("lg_draft", b.compile())
    rt = make_runtime(db_url, durable)
    async with working(rt):
        run = await rt.start(durable, {"notes": []})
        for answer in ("yes", "sure"):
            await rt.wait(run.thread_id, timeout=WAIT, until="waiting")
            await rt.resume(run.thread_id, answer)
        done = await rt.wait(run.thread_id, timeout=WAIT)
        got = await rt.get(run.thread_id)
    assert done.status == "completed", done.error
    assert done.state["answer"] == "yes+sure"
    # The model was called once: the person answered the draft they saw, not a new one.
    assert TOOL["draft"] == 1
    assert done.state["reply"]["content"] == "re: draft"
    assert got.usage["input_tokens"] == 7  # billed once


def test_a_journaled_model_reply_replays_in_another_process(tmp_path: Path) -> None:
    """After a kill, another worker re-executes the step: the AIMessage a node's `call`
    journaled reads back there, in a process that never wrote one (an unknown class would
    fail the step)."""
    from tether import serde

    data, _ = serde.encode(fake_model("hello"), "result", typed=True)
    (tmp_path / "reply").write_bytes(data)
    code = ("import sys, tether.langgraph; from tether import serde; "
            "m = serde.loads(open(sys.argv[1], 'rb').read()); "
            "print(type(m).__name__, m.content, m.usage_metadata['input_tokens'])")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "reply")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["AIMessage", "re:", "hello", "7"]
