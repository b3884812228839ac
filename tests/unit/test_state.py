"""State merging and the delta/snapshot checkpoint encoding (tether.state), no database."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tether import SerializationError, append, serde
from tether.state import apply, apply_delta, delta_of, encode_delta, replay


def merge(state: dict[str, Any], update: Any) -> dict[str, Any]:
    """A step's merge as the worker does it: the delta, encoded as stored, applied in place."""
    delta = delta_of(state, update)
    if delta:
        _, delta = encode_delta(delta, "node")
        apply_delta(state, delta)
    return delta

# -- merge ------------------------------------------------------------------------------------


def test_merge_sets_keys_and_returns_only_what_changed() -> None:
    state: dict[str, Any] = {"a": 1, "b": "keep"}
    delta = merge(state, {"a": 2, "c": [1]})
    assert state == {"a": 2, "b": "keep", "c": [1]}
    assert delta == {"s": {"a": 2, "c": [1]}}


def test_merge_of_no_update_is_a_no_op() -> None:
    state = {"a": 1}
    assert merge(state, None) == {}
    assert merge(state, {}) == {}
    assert state == {"a": 1}


def test_merge_replaces_values_whole_not_deeply() -> None:
    state: dict[str, Any] = {"cfg": {"x": 1, "y": 2}}
    merge(state, {"cfg": {"x": 3}})
    assert state == {"cfg": {"x": 3}}


def test_append_stores_only_the_new_items() -> None:
    state: dict[str, Any] = {"msgs": [f"old-{i}" for i in range(1000)]}
    delta = merge(state, {"msgs": append(["new"])})
    assert delta == {"a": {"msgs": ["new"]}}
    assert state["msgs"][-1] == "new" and len(state["msgs"]) == 1001
    encoded = encode_delta(delta, "n")
    assert b"old-" not in encoded
    assert len(encoded) < 40


def test_append_to_a_missing_key_creates_the_list() -> None:
    state: dict[str, Any] = {}
    delta = merge(state, {"msgs": append(("a", "b"))})
    assert state == {"msgs": ["a", "b"]}
    assert delta == {"a": {"msgs": ["a", "b"]}}


def test_append_does_not_share_the_delta_list_with_the_state() -> None:
    state: dict[str, Any] = {}
    delta = merge(state, {"msgs": append(["a"])})
    merge(state, {"msgs": append(["b"])})
    assert delta == {"a": {"msgs": ["a"]}}


def test_set_and_append_in_one_update() -> None:
    state: dict[str, Any] = {"msgs": [1]}
    delta = merge(state, {"n": 1, "msgs": append([2, 3])})
    assert state == {"n": 1, "msgs": [1, 2, 3]}
    assert delta == {"s": {"n": 1}, "a": {"msgs": [2, 3]}}


@pytest.mark.parametrize("current", ["text", 3, {"k": "v"}, (1, 2)])
def test_append_to_a_non_list_is_an_error_naming_the_key_and_type(current: Any) -> None:
    state = {"field": current}
    with pytest.raises(SerializationError) as info:
        merge(state, {"field": append([1])})
    message = str(info.value)
    assert "'field'" in message
    assert type(current).__name__ in message


@pytest.mark.parametrize("key", [1, 2.5, None, ("a",)])
def test_non_str_update_keys_are_an_error(key: Any) -> None:
    with pytest.raises(SerializationError) as info:
        merge({}, {key: 1})
    assert repr(key) in str(info.value)
    assert type(key).__name__ in str(info.value)


def test_an_update_that_is_not_a_mapping_is_an_error() -> None:
    with pytest.raises(SerializationError, match="dict"):
        merge({}, [("a", 1)])  # type: ignore[arg-type]


def test_append_rejects_strings_and_mappings() -> None:
    with pytest.raises(TypeError):
        append("abc")
    with pytest.raises(TypeError):
        append({"a": 1})
    assert append(x for x in [1, 2]).items == (1, 2)


# -- encoding ---------------------------------------------------------------------------------


def test_encode_delta_names_the_key_and_type_of_a_bad_value() -> None:
    state: dict[str, Any] = {}
    delta = delta_of(state, {"ok": 1, "bad": {"inner": {1, 2}}})
    with pytest.raises(SerializationError) as info:
        encode_delta(delta, "plan")
    message = str(info.value)
    assert "'bad'" in message and "'inner'" in message
    assert "set" in message
    assert "plan" in message


def test_encode_delta_names_a_bad_appended_item() -> None:
    state: dict[str, Any] = {}
    delta = delta_of(state, {"msgs": append([1, object()])})
    with pytest.raises(SerializationError) as info:
        encode_delta(delta, "n")
    assert "'msgs'" in str(info.value)
    assert "object" in str(info.value)


def test_apply_snapshot_replaces_the_state() -> None:
    assert apply({"old": 1}, "s", serde.dumps({"new": 2})) == {"new": 2}


def test_apply_delta_sets_and_appends() -> None:
    state: dict[str, Any] = {"msgs": [1], "x": 0}
    out = apply(state, "d", serde.dumps({"s": {"x": 5}, "a": {"msgs": [2], "fresh": [9]}}))
    assert out == {"msgs": [1, 2], "x": 5, "fresh": [9]}


def test_replay_from_input_and_rows() -> None:
    base = serde.dumps({"topic": "t"})
    rows = [
        ("d", serde.dumps({"s": {"n": 1}})),
        ("d", serde.dumps({"a": {"log": ["a"]}})),
        ("s", serde.dumps({"topic": "t", "n": 1, "log": ["a"]})),
        ("d", serde.dumps({"s": {"n": 2}, "a": {"log": ["b"]}})),
    ]
    assert replay(base, rows) == {"topic": "t", "n": 2, "log": ["a", "b"]}
    # From the last snapshot on, the earlier rows are not needed (what load_checkpoints gives).
    assert replay(base, rows[2:]) == {"topic": "t", "n": 2, "log": ["a", "b"]}


# -- property: deltas + snapshots replay to the merged state ----------------------------------

KEYS = st.sampled_from(["a", "b", "c", "msgs", "log"])
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.text(max_size=8)
    | st.floats(allow_nan=False, allow_infinity=False)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
OP = st.tuples(st.just("set"), JSON) | st.tuples(st.just("append"), st.lists(JSON, max_size=3))
# One update per step: {key: ("set", value) | ("append", items)}.
UPDATES = st.lists(st.dictionaries(KEYS, OP, max_size=3), max_size=25)


def _model(state: dict[str, Any], ops: dict[str, tuple[str, Any]]) -> bool:
    """Reference semantics on deep copies; False if merge must refuse the update."""
    for key, (kind, _) in ops.items():
        cur = state.get(key)
        if kind == "append" and cur is not None and not isinstance(cur, list):
            return False
    for key, (kind, value) in ops.items():
        if kind == "set":
            state[key] = copy.deepcopy(value)
        else:
            state[key] = list(state.get(key) or []) + copy.deepcopy(value)
    return True


@settings(max_examples=150, deadline=None)
@given(
    initial=st.dictionaries(KEYS, JSON, max_size=3),
    updates=UPDATES,
    snapshot_every=st.integers(1, 6),
)
def test_deltas_with_periodic_snapshots_replay_to_the_merged_state(
    initial: dict[str, Any], updates: list[dict[str, tuple[str, Any]]], snapshot_every: int
) -> None:
    base = serde.dumps(initial)
    live = serde.loads(base)  # what a worker holds in memory
    expected = copy.deepcopy(initial)  # the reference model
    rows: list[tuple[str, bytes]] = []
    since_snapshot = 0
    for ops in updates:
        update = {
            key: append(copy.deepcopy(value)) if kind == "append" else copy.deepcopy(value)
            for key, (kind, value) in ops.items()
        }
        probe = copy.deepcopy(expected)
        if not _model(probe, ops):
            with pytest.raises(SerializationError):
                merge(copy.deepcopy(live), update)
            continue
        expected = probe
        data, _ = encode_delta(delta_of(live, update), "n")
        merge(live, update)
        if since_snapshot + 1 >= snapshot_every:
            rows.append(("s", serde.dumps(live)))
            since_snapshot = 0
        else:
            rows.append(("d", data))
            since_snapshot += 1
        assert live == expected
        # Replaying every row from the input gives the state after this step...
        assert replay(base, rows) == expected
        # ...and so does starting from the last snapshot, as a resume does.
        snaps = [i for i, (kind, _) in enumerate(rows) if kind == "s"]
        assert replay(base, rows[snaps[-1]:] if snaps else rows) == expected
        if snapshot_every > 1:
            assert rows[-1][0] == ("s" if len(rows) % snapshot_every == 0 else "d")
