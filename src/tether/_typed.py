"""The tagged form of typed values (see serde's docstring for the format): `tag` turns a value
into plain JSON with tagged objects, `revive` turns decoded JSON back into the values.

Classes are named "module:Qualname" and read back only if known (tether._declared: written by
this process, registered, or declared by an annotation), never imported because a row names
them; a class defined inside a function cannot be named that way and is refused when it is
written, not when a replay needs it.
pydantic is imported only when a model is met (it is not needed to run tether).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import enum
import importlib
import math
import sys
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import orjson

from .errors import SerializationError

MARK = "__tether__"
MARK_BYTES = b'"__tether__"'
PREFIX = b'{"__tether__"'  # how every stored document holding tagged values begins
PREFIX_TEXT = PREFIX.decode()
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1  # what orjson writes


class Bad(Exception):
    """A value `tag` refuses; `path` collects the way to it, innermost first."""

    def __init__(self, obj: Any, why: str) -> None:
        super().__init__(why)
        self.obj = obj
        self.why = why
        self.path: list[str] = []


# -- classes by name -------------------------------------------------------------------------

_paths: dict[type, str] = {}
_classes: dict[str, type] = {}


def class_path(cls: type) -> str:
    """"module:Qualname" of `cls`, checked once per class to name `cls` in its module (never
    imported: the class exists, so its module is loaded); `cls` is then known to `resolve`."""
    path = _paths.get(cls)
    if path is None:
        path = f"{cls.__module__}:{cls.__qualname__}"
        if "<locals>" in cls.__qualname__:
            raise Bad(cls, "its class is defined inside a function; journaled types must be"
                           " importable as module.Name")
        obj: Any = sys.modules.get(cls.__module__)
        for part in cls.__qualname__.split("."):
            obj = getattr(obj, part, None)
        if obj is not cls:
            raise Bad(cls, f"{path} does not name it in its module")
        _paths[cls] = path
        _classes[path] = cls
    return path


class UnknownType(SerializationError):
    """A stored value names a class this process does not know (and will not import)."""


def _nothing_pending() -> bool:
    return False


on_miss: Callable[[], bool] = _nothing_pending
"""Declares the annotations pending (tether._declared); whether it found any."""

_LLM_RESULTS = {"openai.types.chat:ChatCompletion", "anthropic.types:Message"}
"""What tether.llm.assemble builds from a stream: imported by tether's own name, if asked."""


def resolve(path: str) -> type:
    """The known class `path` names; UnknownType for any other (nothing is imported, but
    the SDK result classes tether.llm assembles)."""
    cls = _classes.get(path)
    if cls is None and on_miss():
        cls = _classes.get(path)
    if cls is None and path in _LLM_RESULTS:
        module, _, name = path.partition(":")
        try:
            cls = _classes[path] = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            raise UnknownType(f"class {path!r} needs its SDK installed") from None
    if cls is None:
        shown = path if len(path) <= 200 else path[:200] + "..."
        raise UnknownType(
            f"a stored value names class {shown!r}, which this process does not know: tether "
            "reads back only the types its nodes' and journaled calls' annotations declare or "
            "tether.register_type() registered (it never imports a module a row names); "
            "register the class, or annotate the node or the call that returns it")
    return cls


def is_model(obj: Any) -> bool:
    """Whether `obj` is a pydantic v2 model (without importing pydantic)."""
    return _pydantic_model(obj)


def is_model_class(cls: type) -> bool:
    """Whether `cls` is a pydantic v2 model class (without importing pydantic)."""
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and issubclass(cls, pydantic.BaseModel)


def _pydantic_model(obj: Any) -> bool:
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(obj, pydantic.BaseModel)


# -- writing ---------------------------------------------------------------------------------

def tag(v: Any, typed: bool) -> Any:
    """`v` as plain JSON values (tuples become lists), typed values as tagged objects (only
    with `typed`), a dict with the key MARK escaped. Raises Bad for anything else."""
    t = type(v)
    if t is str or t is bool or v is None:
        return v
    if t is int:
        if _INT_MIN <= v <= _INT_MAX:
            return v
        raise Bad(v, "integers must fit in 64 bits")
    if t is float:
        if math.isfinite(v):
            return v
        raise Bad(v, "it would read back as null")
    if t is dict:
        out = {}
        for k, x in v.items():
            if type(k) is not str:
                bad = Bad(k, "keys must be str")
                bad.path.append(f" key {k!r}")
                raise bad
            try:
                out[k] = tag(x, typed)
            except Bad as bad:
                bad.path.append(f"[{k!r}]")
                raise
        return {MARK: "dict", "v": out} if MARK in out else out
    if t is list or t is tuple:
        items = []
        for i, x in enumerate(v):
            try:
                items.append(tag(x, typed))
            except Bad as bad:
                bad.path.append(f"[{i}]")
                raise
        return items
    if typed:
        encoder = _ENCODERS.get(t)
        if encoder is not None:
            return encoder(v)
        # Models first: is_dataclass() on one goes through pydantic's slow class __getattr__.
        if _pydantic_model(v):
            return _model(v)
        if isinstance(v, enum.Enum):
            return _enum(v)
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return _dataclass(v, typed)
    raise Bad(v, "unsupported type")


def _datetime(v: dt.datetime) -> dict[str, Any]:
    out: dict[str, Any] = {MARK: "datetime"}
    if isinstance(v.tzinfo, ZoneInfo) and v.tzinfo.key:
        # Wall time and zone, not an offset: the value reads back in its zone, with its rules.
        out["v"] = v.replace(tzinfo=None).isoformat()
        out["tz"] = v.tzinfo.key
    else:
        out["v"] = v.isoformat()
    if v.fold:
        out["fold"] = 1
    return out


def _time(v: dt.time) -> dict[str, Any]:
    if v.tzinfo is not None and v.utcoffset() is None:
        raise Bad(v, "a time's tzinfo must give a fixed offset")
    out: dict[str, Any] = {MARK: "time", "v": v.isoformat()}
    if v.fold:
        out["fold"] = 1
    return out


def _decimal(v: Decimal) -> dict[str, Any]:
    if v.is_snan():
        raise Bad(v, "a signalling NaN cannot even be compared with itself")
    return {MARK: "decimal", "v": str(v)}


_ENCODERS: dict[type, Callable[[Any], dict[str, Any]]] = {
    dt.datetime: _datetime,
    dt.date: lambda v: {MARK: "date", "v": v.isoformat()},
    dt.time: _time,
    dt.timedelta: lambda v: {MARK: "timedelta", "v": [v.days, v.seconds, v.microseconds]},
    uuid.UUID: lambda v: {MARK: "uuid", "v": v.hex},
    Decimal: _decimal,
    bytes: lambda v: {MARK: "bytes", "v": base64.b64encode(v).decode()},
}


def _enum(v: enum.Enum) -> dict[str, Any]:
    cls = type(v)
    if v._name_ in cls.__members__:
        return {MARK: "enum", "cls": class_path(cls), "name": v._name_}
    # A combination of flags has no member name of its own.
    return {MARK: "enum", "cls": class_path(cls), "v": tag(v._value_, True)}


def _dataclass(v: Any, typed: bool) -> dict[str, Any]:
    path = class_path(type(v))
    fields = {}
    for f in dataclasses.fields(v):
        try:
            fields[f.name] = tag(getattr(v, f.name), typed)
        except Bad as bad:
            bad.path.append(f".{f.name}")
            raise
    return {MARK: "dataclass", "cls": path, "v": fields}


def _model(v: Any) -> dict[str, Any]:
    path = class_path(type(v))
    # pydantic's own JSON round trip (model_dump_json / model_validate_json): JSON mode is
    # where pydantic promises that what it writes validates back (bytes as base64, strict
    # models, aliases), which the Python mode does not. Embedded as-is, not re-parsed.
    try:
        text = v.model_dump_json(by_alias=True, round_trip=True)
    except Exception as exc:  # pydantic_core.PydanticSerializationError and friends
        raise Bad(v, f"model_dump_json failed: {exc}") from None
    return {MARK: "pydantic", "cls": path, "v": orjson.Fragment(text)}


# -- reading ---------------------------------------------------------------------------------

def revive(v: Any) -> Any:
    """Decoded JSON with its tagged objects turned back into values (in place where it can)."""
    t = type(v)
    if t is dict:
        kind = v.get(MARK)
        if kind is not None:
            return _decode(v, kind)
        for k, x in v.items():
            if type(x) is dict or type(x) is list:
                v[k] = revive(x)
    elif t is list:
        for i, x in enumerate(v):
            if type(x) is dict or type(x) is list:
                v[i] = revive(x)
    return v


def _decode(v: dict[str, Any], kind: Any) -> Any:
    decoder = _DECODERS.get(kind) if isinstance(kind, str) else None
    if decoder is None:
        raise SerializationError(f"unknown tagged value {kind!r} (written by a newer tether?)")
    try:
        return decoder(v)
    except SerializationError:
        raise
    except Exception as exc:
        what = f"{kind} {v['cls']}" if "cls" in v else kind
        raise SerializationError(f"a tagged {what} does not read back: "
                                 f"{type(exc).__name__}: {exc}") from None


def _read_datetime(v: dict[str, Any]) -> dt.datetime:
    value = dt.datetime.fromisoformat(v["v"])
    if "tz" in v:
        value = value.replace(tzinfo=ZoneInfo(v["tz"]))
    return value.replace(fold=1) if v.get("fold") else value


def _read_time(v: dict[str, Any]) -> dt.time:
    value = dt.time.fromisoformat(v["v"])
    return value.replace(fold=1) if v.get("fold") else value


def _read_enum(v: dict[str, Any]) -> enum.Enum:
    cls = resolve(v["cls"])
    if not issubclass(cls, enum.Enum):
        raise SerializationError(f"{v['cls']!r} is not an enum")
    return cls[v["name"]] if "name" in v else cls(revive(v["v"]))


def _read_dataclass(v: dict[str, Any]) -> Any:
    cls = resolve(v["cls"])
    if not dataclasses.is_dataclass(cls):
        raise SerializationError(f"{v['cls']!r} is not a dataclass")
    values = revive(v["v"])
    init: dict[str, Any] = {}
    later: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in values:
            (init if f.init else later)[f.name] = values[f.name]
    obj = cls(**init)
    for name, value in later.items():
        object.__setattr__(obj, name, value)  # frozen dataclasses too
    return obj


def _read_model(v: dict[str, Any]) -> Any:
    import pydantic

    cls = resolve(v["cls"])
    if not issubclass(cls, pydantic.BaseModel):
        raise SerializationError(f"{v['cls']!r} is not a pydantic model")
    return cls.model_validate_json(orjson.dumps(v["v"]))


def _read_dict(v: dict[str, Any]) -> dict[str, Any]:
    inner: dict[str, Any] = v["v"]
    for k, x in inner.items():
        if type(x) is dict or type(x) is list:
            inner[k] = revive(x)
    return inner


_DECODERS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "datetime": _read_datetime,
    "date": lambda v: dt.date.fromisoformat(v["v"]),
    "time": _read_time,
    "timedelta": lambda v: dt.timedelta(days=v["v"][0], seconds=v["v"][1],
                                        microseconds=v["v"][2]),
    "uuid": lambda v: uuid.UUID(hex=v["v"]),
    "decimal": lambda v: Decimal(v["v"]),
    "bytes": lambda v: base64.b64decode(v["v"], validate=True),
    "enum": _read_enum,
    "dataclass": _read_dataclass,
    "pydantic": _read_model,
    "dict": _read_dict,
    "json": lambda v: revive(v["v"]),
    "call": lambda v: revive(v["v"]),  # the usage beside it is for the store, not the node
}


def plain_json(v: Any) -> Any:
    """orjson's `default` for display: what orjson does not write itself, in plain JSON."""
    if _pydantic_model(v):
        return v.model_dump(mode="json")
    if isinstance(v, Decimal):
        return str(v)
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(v).decode()
    if isinstance(v, (set, frozenset)):
        return list(v)
    raise TypeError(f"Type is not JSON serializable: {type(v).__name__}")


# -- checking what reads back ----------------------------------------------------------------

_PLAIN = frozenset({str, int, float, bool, type(None)})


def plain(v: Any) -> bool:
    """Whether `v` holds only JSON types, exactly (an IntEnum equals its int, and orjson
    writes it as one: only its type tells them apart)."""
    t = type(v)
    if t is dict:
        v = v.values()
    elif t is not list and t is not tuple:
        return t in _PLAIN
    # A loop, not all(<generator>), which costs more: this runs for every journaled result.
    for x in v:  # noqa: SIM110
        if type(x) not in _PLAIN and not plain(x):
            return False
    return True


# -- checking what reads back ----------------------------------------------------------------

def find_changed(value: Any, decoded: Any, path: str) -> tuple[str, Any] | None:
    """The first place where `decoded` differs from `value`, other than tuple -> list, a
    NaN Decimal (never equal to itself) and inside a pydantic model (what pydantic's round
    trip gives is the model's own definition of reading back)."""
    t = type(value)
    if t is dict and type(decoded) is dict:
        for k, x in value.items():
            found = find_changed(x, decoded.get(k), f"{path}[{k!r}]")
            if found is not None:
                return found
        return None
    if (t is list or t is tuple) and type(decoded) is list:
        if len(value) != len(decoded):
            return path, value
        for i, (x, d) in enumerate(zip(value, decoded, strict=True)):
            found = find_changed(x, d, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    if type(decoded) is not t:
        return path, value
    if t is Decimal:
        return None if str(value) == str(decoded) else (path, value)
    if dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            found = find_changed(getattr(value, f.name), getattr(decoded, f.name, None),
                                 f"{path}.{f.name}")
            if found is not None:
                return found
        return None
    if _pydantic_model(value):
        return None
    return None if value == decoded else (path, value)
