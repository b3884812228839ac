"""tether.langgraph._view: the names and state a durable LangGraph run shows."""

from __future__ import annotations

import dataclasses

from langchain_core.messages import AIMessage
from langgraph.types import Interrupt, PregelTask, StateSnapshot

from tether.langgraph._view import jsonable, label, pending, update
from tether.state import Append


def snap(*tasks: PregelTask, next: tuple[str, ...] = ()) -> StateSnapshot:
    interrupts = tuple(i for t in tasks for i in t.interrupts)
    return StateSnapshot({}, next, {"configurable": {}}, None, None, None, tasks, interrupts)


def task(name: str, *interrupts: Interrupt) -> PregelTask:
    return PregelTask(f"id-{name}", name, ("__pregel_pull", name), interrupts=interrupts)


def test_a_step_is_named_after_all_its_tasks_not_only_the_unfinished() -> None:
    # After a crash, `next` lists only the tasks whose writes were not stored.
    assert label(snap(task("a"), task("b"), next=("b",))) == "a+b"
    assert label(snap(task("tools"), task("tools"))) == "tools"  # Send: one name once
    assert label(snap()) is None


@dataclasses.dataclass
class Point:
    x: int
    tags: frozenset[str]


def test_values_as_json() -> None:
    msg = AIMessage(content="hi", id="m1")
    got = jsonable({"m": [msg], "p": Point(1, frozenset({"b", "a"})), "t": (1, 2), 3: object})
    assert got["m"][0]["content"] == "hi" and got["m"][0]["type"] == "ai"
    assert got["p"] == {"x": 1, "tags": ["a", "b"]}
    assert got["t"] == [1, 2]
    assert got["3"] == repr(object)


def test_update_appends_what_a_list_gained_and_sets_what_changed() -> None:
    state = {"notes": ["a"], "n": 1, "same": "x", "input_only": True}
    up = update(state, {"notes": ["a", "b"], "n": 2, "same": "x", "new": [1]})
    assert up == {"notes": Append(("b",)), "n": 2, "new": [1]}
    # A list rewritten (add_messages replacing by id) is set whole.
    assert update({"notes": ["a", "b"]}, {"notes": ["a2", "b"]}) == {"notes": ["a2", "b"]}
    assert update({"notes": ["a", "b"]}, {"notes": ["a"]}) == {"notes": ["a"]}


def test_pending_interrupts_name_their_node() -> None:
    s = snap(task("ask", Interrupt({"q": 1}, id="i1")), task("other"))
    assert pending(s) == [{"id": "i1", "value": {"q": 1}, "node": "ask"}]
