"""State merging and checkpoint encoding (pure functions).

A checkpoint is either a snapshot (kind "s": the whole state) or a delta (kind "d") against
the previous step: {"s": {key: new value}, "a": {key: [appended items]}}. With `append`, a
step's checkpoint holds only the new items, so its cost does not grow with the state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from . import serde
from .errors import SerializationError, with_article

State = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Append:
    """An update value that appends `items` to a list field instead of replacing it; the
    checkpoint stores only the appended items."""

    items: tuple[Any, ...]


def append(items: Iterable[Any]) -> Append:
    """Mark an update value as items to append to the list at that key."""
    if type(items) is list:  # the common case, without the Mapping check
        return Append(tuple(items))
    if isinstance(items, (str, bytes, Mapping)):
        raise TypeError("tether.append() takes an iterable of items, e.g. append([msg])")
    return Append(tuple(items))

_NOTHING: Mapping[str, Any] = MappingProxyType({})  # a delta's missing part (no dict a step)


def delta_of(state: State, update: Mapping[str, Any] | None) -> dict[str, Any]:
    """The delta an update makes to `state` (which is not changed): {"s": sets, "a": appends}.
    Raises SerializationError for a non-dict update, a non-str key, or an append to a key
    that holds something other than a list."""
    if not update:
        return {}
    if type(update) is not dict and not isinstance(update, Mapping):
        raise SerializationError(f"an update must be a dict, got {type(update).__name__!r}")
    sets: dict[str, Any] = {}
    appends: dict[str, list[Any]] = {}
    for key, value in update.items():
        if not isinstance(key, str):
            raise SerializationError(
                f"update key {key!r} is {with_article(type(key).__name__)}; keys must be str")
        if isinstance(value, Append):
            cur = state.get(key)
            if cur is not None and not isinstance(cur, list):
                raise SerializationError(
                    f"append() to state key {key!r}, which holds {with_article(type(cur).__name__)}, "
                    "not a list")
            appends[key] = list(value.items)
        else:
            sets[key] = value
    delta: dict[str, Any] = {}
    if sets:
        delta["s"] = sets
    if appends:
        delta["a"] = appends
    return delta


def encode_delta(delta: Mapping[str, Any], node: str, typed: bool = False
                 ) -> tuple[bytes, dict[str, Any]]:
    """(stored bytes, the delta as a replay will read it). `typed`: the agent's state may
    hold typed values (Agent(typed_state=True))."""
    try:
        data, decoded = serde.encode(delta, "update", typed=typed)
        return data, decoded
    except SerializationError:
        pass
    # Name the key as the user wrote it, not the delta's internal layout.
    plain = {**delta.get("s", {}), **delta.get("a", {})}
    serde.dumps(plain, f"update from node {node!r}, key", typed=typed)
    raise SerializationError(f"update from node {node!r} is not serializable")


def apply_delta(state: State, delta: Mapping[str, Any]) -> State:
    for key, v in delta.get("s", _NOTHING).items():
        state[key] = v
    for key, items in delta.get("a", _NOTHING).items():
        cur = state.get(key)
        # A new list, not extend(): a node may still hold the old one (it got a shallow copy).
        state[key] = cur + items if isinstance(cur, list) else list(items)
    return state


def apply(state: State, kind: str, data: bytes) -> State:
    """Apply one stored checkpoint to `state`; returns the new state."""
    value = serde.loads(data)
    if kind == "s":
        return dict(value)
    return apply_delta(state, value)


def replay(base: bytes, rows: Iterable[tuple[str, bytes]]) -> State:
    """State = base (the run's input) or the first snapshot, then every later delta."""
    state: State = dict(serde.loads(base))
    for kind, data in rows:
        state = apply(state, kind, data)
    return state
