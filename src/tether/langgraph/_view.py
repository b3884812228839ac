"""What a durable LangGraph run shows of its graph: the tether node a super-step is named by,
and the graph's channel values as tether state (JSON), step by step."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from langgraph.types import StateSnapshot

from ..state import append

__all__ = ["jsonable", "label", "pending", "update"]


def label(snap: StateSnapshot) -> str | None:
    """The tether node name of the super-step `snap` is about to run: its LangGraph nodes,
    each once, in LangGraph's order, joined by "+" (`agent`, `tools`, `a+b`); None when the
    graph has nothing left to run. Its tasks, not `snap.next`: a super-step cut short
    (a crash, a failed task) is the same super-step, though `next` then lists only the tasks
    whose writes were not stored."""
    names = list(dict.fromkeys(t.name for t in snap.tasks))
    return "+".join(names) if names else None


def jsonable(value: Any) -> Any:
    """`value` as JSON: pydantic models (LangChain messages among them) by their JSON dump,
    dataclasses by their fields, tuples and sets as lists, anything else by its repr."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((jsonable(v) for v in value), key=repr)
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            return jsonable(dump(mode="json"))
        except Exception:  # a model that cannot dump itself as JSON: shown by its repr
            return repr(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    return repr(value)


def update(state: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """The tether update that makes `state` show the channel `values`: the channels that
    changed, a list that grew (a reducer such as operator.add, add_messages) as the items
    it gained (tether.append: the checkpoint stores those items only)."""
    out: dict[str, Any] = {}
    for key, raw in values.items():
        new = jsonable(raw)
        old = state.get(key, _MISSING)
        if old == new:
            continue
        if (isinstance(old, list) and isinstance(new, list) and len(new) > len(old)
                and new[:len(old)] == old):
            out[key] = append(new[len(old):])
        else:
            out[key] = new
    return out


def pending(snap: StateSnapshot) -> list[dict[str, Any]]:
    """The graph's pending interrupts as a tether interrupt's payload lists them: each with
    its id, value and the node that raised it."""
    where = {i.id: t.name for t in snap.tasks for i in t.interrupts}
    return [{"id": i.id, "value": jsonable(i.value), "node": where.get(i.id)}
            for i in snap.interrupts]


_MISSING = object()
