"""Serialization of state, updates and results: JSON types only, errors name path and type."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import math
import uuid
from typing import Any

import pytest

from tether import SerializationError, TetherError, serde


def _lists(value: Any) -> Any:
    """tuples read back as lists (documented): normalize before comparing."""
    if isinstance(value, (list, tuple)):
        return [_lists(v) for v in value]
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    return value


@pytest.mark.parametrize(
    "value",
    [
        {},
        {"s": "text", "i": -3, "f": 1.5, "b": True, "n": None},
        {"nested": {"list": [1, [2, {"x": "y"}]], "empty": []}},
        {"unicode": "h\u00e9llo \u2603 \U0001f600", "big": 2**63 - 1, "small": -(2**63)},
        {"tuple": (1, 2, (3,))},
        [1, "a", None],
    ],
)
def test_json_values_round_trip(value: Any) -> None:
    assert serde.loads(serde.dumps(value)) == _lists(value)


def test_loads_accepts_bytes_memoryview_and_str() -> None:
    data = serde.dumps({"a": [1]})
    assert serde.loads(data) == serde.loads(memoryview(data)) == serde.loads(data.decode())
    assert serde.loads(bytearray(data)) == {"a": [1]}


def test_serialization_error_is_a_tether_error() -> None:
    assert issubclass(SerializationError, TetherError)


def test_error_names_the_nested_key_path_and_type() -> None:
    with pytest.raises(SerializationError) as info:
        serde.dumps({"a": {"b": {1, 2}}, "ok": 1}, "state")
    message = str(info.value)
    assert "state['a']['b']" in message
    assert "'set'" in message


def test_error_names_a_list_index() -> None:
    with pytest.raises(SerializationError) as info:
        serde.dumps({"msgs": ["fine", {"payload": b"raw"}]}, "update")
    message = str(info.value)
    assert "update['msgs'][1]['payload']" in message
    assert "'bytes'" in message


def test_error_names_a_non_str_dict_key() -> None:
    with pytest.raises(SerializationError) as info:
        serde.dumps({"a": {7: "x"}}, "state")
    message = str(info.value)
    assert "state['a']" in message and "7" in message
    assert "int" in message


def test_error_names_an_integer_out_of_range() -> None:
    with pytest.raises(SerializationError) as info:
        serde.dumps({"n": 2**70}, "state")
    assert "state['n']" in str(info.value)
    assert "int" in str(info.value)


def test_error_on_top_level_value() -> None:
    with pytest.raises(SerializationError) as info:
        serde.dumps(object(), "result of call #0 to mod.fn")
    assert "result of call #0 to mod.fn" in str(info.value)
    assert "object" in str(info.value)


def test_error_is_not_chained_to_the_driver_error() -> None:
    with pytest.raises(SerializationError) as info:
        serde.dumps({"a": {1, 2}})
    assert info.value.__cause__ is None


@dataclasses.dataclass
class Point:
    x: int


class Color(enum.Enum):
    RED = "red"


NOT_JSON = {
    "datetime": datetime.datetime(2024, 1, 2, 3, 4, 5),
    "date": datetime.date(2024, 1, 2),
    "dataclass": Point(1),
    "enum": Color.RED,
    "uuid": uuid.UUID(int=1),
    "decimal": decimal.Decimal("1.5"),
    "nan": math.nan,
    "inf": math.inf,
}


@pytest.mark.parametrize("name", sorted(NOT_JSON))
def test_values_that_would_not_read_back_the_same_are_refused(name: str) -> None:
    """State must replay to exactly what the live run had. A value that orjson would turn into
    something else (datetime -> str, dataclass -> dict, NaN -> null) makes a resumed run see a
    different state than an uninterrupted one; it must be refused like a set is, naming the
    key."""
    value = NOT_JSON[name]
    try:
        data = serde.dumps({"k": {"v": value}}, "state")
    except SerializationError as exc:
        assert "state['k']['v']" in str(exc)
        return
    back = serde.loads(data)["k"]["v"]
    assert type(back) is type(value) and (back == value), (
        f"{name}: {value!r} was accepted but reads back as {back!r}"
    )


def test_digest_is_stable_and_content_sensitive() -> None:
    a = serde.digest(b"abc")
    assert a == serde.digest(b"abc")
    assert a != serde.digest(b"abd")
    assert len(a) == 32
