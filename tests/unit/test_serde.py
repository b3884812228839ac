"""Serialization of state, updates and results: JSON types only, errors name path and type."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import math
import uuid
import warnings
from typing import Any

import pytest

import tether
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


# -- typed values (journal results; state where an agent opts in) -----------------------------

import base64  # noqa: E402
from zoneinfo import ZoneInfo  # noqa: E402

import orjson  # noqa: E402
import pydantic  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Mood(enum.StrEnum):
    CALM = "calm"
    ANGRY = "angry"


class Perm(enum.Flag):
    R = 1
    W = 2
    X = 4


class Pair(enum.Enum):
    ONE = (1, "one")  # a tuple value: enums are stored by name, not by value


@dataclasses.dataclass(frozen=True, slots=True)
class Stamp:
    at: datetime.datetime
    id: uuid.UUID


@dataclasses.dataclass
class Order:
    items: list[Any]
    total: decimal.Decimal
    stamp: Stamp | None = None
    seen: int = dataclasses.field(default=0, init=False)


class Usage(pydantic.BaseModel):
    prompt_tokens: int
    completion_tokens: int


class Reply(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")

    id: str
    created: datetime.datetime
    text: str
    raw: bytes = b""
    schema_: dict[str, Any] = pydantic.Field(default_factory=dict, alias="schema")
    usage: Usage | None = None


class StrictReply(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(strict=True)

    at: datetime.datetime
    key: uuid.UUID


def same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (tuples read back as lists)."""
    if isinstance(a, (list, tuple)):
        return type(b) is list and len(a) == len(b) and all(map(same, a, b))
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(v, b[k]) for k, v in a.items())
    if dataclasses.is_dataclass(a):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, decimal.Decimal):
        return str(a) == str(b)
    if isinstance(a, (datetime.datetime, datetime.time)):
        return a == b and a.tzinfo == b.tzinfo and a.fold == b.fold and a.isoformat() == b.isoformat()
    return bool(a == b)


def pydantic_round_trip(value: Any) -> Any:
    """What a model reads back as: pydantic's own JSON round trip (which, for one, keeps a
    datetime's UTC offset to the second only)."""
    if isinstance(value, pydantic.BaseModel):
        return type(value).model_validate_json(value.model_dump_json(by_alias=True, round_trip=True))
    if isinstance(value, (list, tuple)):
        return [pydantic_round_trip(v) for v in value]
    if isinstance(value, dict):
        return {k: pydantic_round_trip(v) for k, v in value.items()}
    return value


def round_trip(value: Any) -> Any:
    data, decoded = serde.encode(value, "result", typed=True)
    back = serde.loads(data)
    assert same(pydantic_round_trip(value), back), f"{value!r} read back as {back!r}"
    assert same(back, decoded), "the first execution must see what a replay sees"
    return back


# Whole seconds: Python 3.11's fromisoformat misreads some sub-second offsets (such a value
# is refused, see test_a_sub_second_utc_offset_is_exact_or_refused).
fixed_zones = st.builds(datetime.timezone, st.integers(-86399, 86399).map(
    lambda s: datetime.timedelta(seconds=s)))
zones = st.none() | fixed_zones | st.timezones()
datetimes = st.datetimes(timezones=zones)
decimals = st.decimals(allow_nan=True, allow_infinity=True).filter(lambda d: not d.is_snan())
enums = st.sampled_from([*Color, *Level, *Mood, *Pair, Perm.R, Perm.R | Perm.W, Perm(0)])
leaves = (datetimes | st.dates() | st.times(timezones=st.none() | fixed_zones) | st.timedeltas()
          | st.uuids() | decimals | enums | st.binary())
plain = (st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**63 - 1)
         | st.floats(allow_nan=False, allow_infinity=False) | st.text())
stamps = st.builds(Stamp, at=datetimes, id=st.uuids())
replies = st.builds(Reply, id=st.text(), created=st.datetimes(timezones=st.none() | fixed_zones),
                    text=st.text(), raw=st.binary(),
                    schema=st.dictionaries(st.text(), st.integers(-5, 5), max_size=3),
                    usage=st.none() | st.builds(Usage, prompt_tokens=st.integers(0, 10**6),
                                                completion_tokens=st.integers(0, 10**6)))


def nested(leaf: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    keys = st.text(max_size=5) | st.sampled_from(["__tether__", "v", "cls"])
    return st.recursive(leaf, lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
                        | st.dictionaries(keys, inner, max_size=4), max_leaves=12)


@settings(max_examples=150, deadline=None)
@given(leaves)
def test_every_typed_leaf_reads_back_as_the_same_type(value: Any) -> None:
    round_trip(value)


@settings(max_examples=200, deadline=None)
@given(st.builds(Order, items=st.lists(leaves | plain, max_size=4), total=decimals,
                 stamp=st.none() | stamps))
def test_dataclasses_read_back_with_their_typed_fields(order: Order) -> None:
    order.seen = 3  # a field outside __init__ is restored too
    assert round_trip(order).seen == 3


@settings(max_examples=200, deadline=None)
@given(replies)
def test_pydantic_models_read_back_as_the_same_model(reply: Reply) -> None:
    back = round_trip(reply)
    assert type(back) is Reply
    if reply.created.utcoffset() in (None, datetime.timedelta(0)):
        assert back == reply


@settings(max_examples=100, deadline=None)
@given(st.builds(StrictReply, at=st.datetimes(timezones=st.none() | fixed_zones), key=st.uuids()))
def test_strict_pydantic_models_read_back(reply: StrictReply) -> None:
    back = round_trip(reply)
    assert type(back) is StrictReply and back.key == reply.key


@settings(max_examples=150, deadline=None)
@given(nested(leaves | plain | stamps | replies))
def test_json_holding_typed_values_reads_back(value: Any) -> None:
    round_trip(value)


@settings(max_examples=150, deadline=None)
@given(nested(plain))
def test_plain_json_is_written_exactly_as_before_and_old_rows_load(value: Any) -> None:
    """Nothing changes for plain values: the bytes are what an earlier release wrote (the
    one exception: a dict with the key "__tether__" at its top, escaped), and its rows read
    back unchanged."""
    old = orjson.dumps(value)
    for typed in (False, True):
        data, decoded = serde.encode(value, typed=typed)
        if not (type(value) is dict and "__tether__" in value):
            assert data == old
            assert serde.loads(old) == decoded
        assert same(value, serde.loads(data))


@pytest.mark.parametrize("extra", [None, uuid.UUID(int=9)])
def test_a_dict_keyed_like_a_tag_is_not_read_as_one(extra: Any) -> None:
    fake = {"__tether__": "uuid", "v": "0" * 32}
    for value in (fake, {"x": fake, "y": [fake], "z": extra}, [fake, extra]):
        for typed in (False, True) if extra is None else (True,):
            data = serde.dumps(value, typed=typed)
            assert same(serde.loads(data), value)
            assert same(serde.loads(data.decode()), value)


def test_typed_values_stay_refused_where_not_asked_for() -> None:
    with pytest.raises(SerializationError, match=r"state\['k'\].*'UUID'"):
        serde.dumps({"k": uuid.UUID(int=3)}, "state")
    with pytest.raises(SerializationError, match=r"state\['k'\].*'Stamp'"):
        serde.dumps({"k": Stamp(datetime.datetime(2024, 1, 1), uuid.UUID(int=3))}, "state")


@pytest.mark.parametrize(("value", "path", "type_name"), [
    ({"a": [1, {"b": {1, 2}}]}, "r['a'][1]['b']", "set"),
    ({"a": {7: "x"}}, "r['a'] key 7", "int"),
    ({"n": 2**70}, "r['n']", "int"),
    ({"f": [math.nan]}, "r['f'][0]", "float"),
    ([Order([object()], decimal.Decimal(1))], "r[0].items[0]", "object"),
    ({"o": Order([], decimal.Decimal(1), Stamp(datetime.datetime(2024, 1, 1), "no-uuid"))},  # type: ignore[arg-type]
     None, None),
    ({"d": decimal.Decimal("sNaN")}, "r['d']", "Decimal"),
    ({"b": bytearray(b"x")}, "r['b']", "bytearray"),
    ({"t": datetime.time(1, tzinfo=ZoneInfo("Europe/Paris"))}, "r['t']", "time"),
])
def test_unsupported_typed_values_are_refused_with_path_and_type(
        value: Any, path: str | None, type_name: str | None) -> None:
    if path is None:  # a str in a UUID field is a str: it reads back as one, and is accepted
        round_trip(value)
        return
    with pytest.raises(SerializationError) as info:
        serde.dumps(value, "r", typed=True)
    assert f"{path} has a value of type {type_name!r}" in str(info.value)


def test_a_class_defined_in_a_function_is_refused_when_written() -> None:
    @dataclasses.dataclass
    class Local:
        x: int

    with pytest.raises(SerializationError, match="defined inside a function"):
        serde.dumps({"l": Local(1)}, "r", typed=True)


def test_a_pydantic_model_that_does_not_validate_back_is_refused() -> None:
    unvalidated = Usage.model_construct(prompt_tokens="many", completion_tokens=1)
    # pydantic warns as it dumps (an error here, where warnings are errors), then the model
    # fails to validate back.
    with pytest.raises(SerializationError, match="r has a value of type 'Usage'"):
        serde.dumps(unvalidated, "r", typed=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(SerializationError,
                           match=r"(?s)r would not read back: a tagged pydantic .*:Usage.*prompt_tokens"):
            serde.dumps(unvalidated, "r", typed=True)


def test_unknown_tags_and_missing_classes_fail_clearly_on_read() -> None:
    with pytest.raises(SerializationError, match="unknown tagged value 'blob'"):
        serde.loads(b'{"__tether__": "blob", "v": 1}')
    with pytest.raises(SerializationError, match=r"names class 'nowhere\.at_all:Gone', which this "
                                                 r"process does not know"):
        serde.loads(b'{"__tether__": "dataclass", "cls": "nowhere.at_all:Gone", "v": {}}')
    tether.register_type(Stamp)
    with pytest.raises(SerializationError, match="is not a pydantic model"):
        serde.loads(b'{"__tether__": "pydantic", "cls": "tests.unit.test_serde:Stamp", "v": {}}'
                    .replace(b"tests.unit.test_serde", __name__.encode()))


def test_the_tagged_form_is_stable() -> None:
    """The documented encoding: rows written today must read back in every later release."""
    at = datetime.datetime(2026, 12, 1, 9, 30, tzinfo=ZoneInfo("Europe/Paris"))
    value = {"at": at, "id": uuid.UUID(int=1), "d": decimal.Decimal("1.50"), "b": b"\x00\xff",
             "lvl": Level.HIGH, "day": datetime.date(2026, 12, 1), "gap": datetime.timedelta(1, 2, 3)}
    assert orjson.loads(serde.dumps(value, typed=True)) == {"__tether__": "json", "v": {
        "at": {"__tether__": "datetime", "v": "2026-12-01T09:30:00", "tz": "Europe/Paris"},
        "id": {"__tether__": "uuid", "v": "00000000000000000000000000000001"},
        "d": {"__tether__": "decimal", "v": "1.50"},
        "b": {"__tether__": "bytes", "v": base64.b64encode(b"\x00\xff").decode()},
        "lvl": {"__tether__": "enum", "cls": f"{__name__}:Level", "name": "HIGH"},
        "day": {"__tether__": "date", "v": "2026-12-01"},
        "gap": {"__tether__": "timedelta", "v": [1, 2, 3]},
    }}
    reply = Reply(id="r1", created=datetime.datetime(2026, 1, 1), text="hi", schema={"a": 1})
    assert orjson.loads(serde.dumps(reply, typed=True)) == {
        "__tether__": "pydantic", "cls": f"{__name__}:Reply",
        "v": {"id": "r1", "created": "2026-01-01T00:00:00", "text": "hi", "raw": "",
              "schema": {"a": 1}, "usage": None}}


def test_a_pydantic_result_costs_one_dump_and_one_validate(monkeypatch: pytest.MonkeyPatch) -> None:
    counts = {"dump": 0, "validate": 0}
    dump, validate = Reply.model_dump_json, Reply.model_validate_json.__func__  # type: ignore[attr-defined]

    def counting_dump(self: Reply, **kw: Any) -> str:
        counts["dump"] += 1
        return dump(self, **kw)

    def counting_validate(cls: type[Reply], data: Any, **kw: Any) -> Reply:
        counts["validate"] += 1
        return validate(cls, data, **kw)  # type: ignore[no-any-return]

    monkeypatch.setattr(Reply, "model_dump_json", counting_dump)
    monkeypatch.setattr(Reply, "model_validate_json", classmethod(counting_validate))
    reply = Reply(id="r", created=datetime.datetime(2026, 1, 1), text="t",
                  usage=Usage(prompt_tokens=1, completion_tokens=2))
    data, decoded = serde.encode(reply, "r", typed=True)
    assert counts == {"dump": 1, "validate": 1}
    assert decoded == reply
    serde.loads(data)
    assert counts == {"dump": 1, "validate": 2}


@pytest.mark.parametrize("micros", [1, 5, 3_600_000_005])
def test_a_sub_second_utc_offset_is_exact_or_refused(micros: int) -> None:
    at = datetime.datetime(2000, 1, 1, tzinfo=datetime.timezone(datetime.timedelta(microseconds=micros)))
    try:
        data = serde.dumps({"at": at}, "r", typed=True)
    except SerializationError as exc:
        assert "r['at'] has a value of type 'datetime'" in str(exc)
        return
    assert same(serde.loads(data)["at"], at)
