"""State merging and checkpoint encoding (pure functions).

A checkpoint is either a snapshot (kind "s": the whole state) or a delta (kind "d") against
the previous step: {"s": {key: new value}, "a": {key: [appended items]}}. With `append`, a
step's checkpoint holds only the new items, so its cost does not grow with the state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from . import serde
from .agent import Append
from .errors import SerializationError

State = dict[str, Any]


def merge(state: State, update: Mapping[str, Any] | None) -> dict[str, Any]:
    """Merge `update` into `state` in place, key by key; returns the delta to store."""
    sets: dict[str, Any] = {}
    appends: dict[str, list[Any]] = {}
    if not update:
        return {}
    if not isinstance(update, Mapping):
        raise SerializationError(f"an update must be a dict, got {type(update).__name__!r}")
    for key, value in update.items():
        if not isinstance(key, str):
            raise SerializationError(f"update key {key!r} is a {type(key).__name__}; keys must be str")
        if isinstance(value, Append):
            items = list(value.items)
            cur = state.get(key)
            if cur is None:
                state[key] = items[:]
            elif isinstance(cur, list):
                cur.extend(items)
            else:
                raise SerializationError(
                    f"append() to state key {key!r}, which holds a {type(cur).__name__}, not a list"
                )
            appends[key] = items
        else:
            state[key] = value
            sets[key] = value
    delta: dict[str, Any] = {}
    if sets:
        delta["s"] = sets
    if appends:
        delta["a"] = appends
    return delta


def encode_delta(delta: Mapping[str, Any], node: str) -> bytes:
    try:
        return serde.dumps(delta, "update")
    except SerializationError:
        plain = {**delta.get("s", {}), **delta.get("a", {})}
        return serde.dumps(plain, f"update from node {node!r}: key")


def apply(state: State, kind: str, data: bytes) -> State:
    """Apply one stored checkpoint to `state`; returns the new state."""
    value = serde.loads(data)
    if kind == "s":
        return dict(value)
    for key, v in value.get("s", {}).items():
        state[key] = v
    for key, items in value.get("a", {}).items():
        cur = state.get(key)
        if isinstance(cur, list):
            cur.extend(items)
        else:
            state[key] = list(items)
    return state


def replay(base: bytes, rows: Iterable[tuple[str, bytes]]) -> State:
    """State = base (the run's input) or the first snapshot, then every later delta."""
    state: State = dict(serde.loads(base))
    for kind, data in rows:
        state = apply(state, kind, data)
    return state
