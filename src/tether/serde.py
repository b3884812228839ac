"""Serialization of state, updates, journal results and payloads (orjson).

Plain values are JSON types: dict with str keys, list, tuple (read back as list), str, int
(64-bit), finite float, bool, None. They are stored as plain JSON, byte for byte what earlier
releases wrote, so old rows read back unchanged.

Typed values (journal results always; state where the agent opts in with `typed_state=True`)
may also be pydantic v2 models, dataclasses, datetimes (date, time, timedelta), UUIDs,
Decimals, enums and bytes, and read back as the same types. Each is stored as a tagged object,
a documented and stable form (docs/reference.md, "Journal encoding"):

    {"__tether__": "pydantic", "cls": "module:Qualname", "v": <model_dump_json(by_alias=True)>}
    {"__tether__": "dataclass", "cls": "module:Qualname", "v": {field: value, ...}}
    {"__tether__": "enum", "cls": "module:Qualname", "name": "MEMBER"}   (or "v": value)
    {"__tether__": "datetime", "v": "2026-12-01T09:00:00+00:00"}  (+ "tz": zone key, "fold": 1)
    {"__tether__": "date" | "time", "v": isoformat}, {"__tether__": "timedelta", "v": [d, s, us]}
    {"__tether__": "uuid", "v": "hex"}, {"__tether__": "decimal", "v": "1.50"}
    {"__tether__": "bytes", "v": "base64"}
    {"__tether__": "dict", "v": {...}}   a user's dict that itself has the key "__tether__"
    {"__tether__": "json", "v": ...}     JSON holding tagged values somewhere inside
    {"__tether__": "call", "usage": {...}, "v": ...}   a journaled result and its token usage

A stored document holds tagged objects only if it is one itself (it starts with the bytes
`{"__tether__"`), so a reader tells plain JSON from tagged by its first bytes; inside a tagged
document every dict keyed "__tether__" is a tag (a user's is escaped as "dict"), and a plain
dict with that key at its top is escaped too.

Anything else is refused with the path of the offending value and its type. Plain values take
the same path as before typed values existed (one orjson dump, one load, one comparison); the
tagged walk runs only when that path cannot represent the value.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from . import _typed
from ._typed import MARK, MARK_BYTES, PREFIX, PREFIX_TEXT, Bad, revive, tag
from .errors import SerializationError

__all__ = ["MARK", "USAGE_PREFIX", "digest", "dumps", "encode", "loads", "usage_in", "with_usage"]

# Types orjson would silently turn into something else (datetime -> str, dataclass -> dict,
# str/int subclasses -> their base) are passed to `_refuse` instead, which raises.
USAGE_PREFIX = b'{"__tether__":"call","usage":'
"""How a journal record that carries its call's token usage begins (see `with_usage`)."""

_OPTS = (orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
         | orjson.OPT_PASSTHROUGH_SUBCLASS)


_SCALARS = frozenset({str, int, bool, type(None)})
"""Exact types whose JSON reads back as the same value (not float: NaN and infinities)."""


def _refuse(obj: Any) -> Any:
    raise TypeError(f"Type is not JSON serializable: {type(obj).__name__}")


def dumps(value: Any, what: str = "value", *, typed: bool = False) -> bytes:
    """JSON bytes of `value`, refusing anything that would not read back the same (tuples,
    read back as lists, are the one accepted difference)."""
    return encode(value, what, typed=typed)[0]


def encode(value: Any, what: str = "value", *, typed: bool = False) -> tuple[bytes, Any]:
    """(JSON bytes, the value as it reads back). A replay sees exactly the decoded value, so
    callers hand that to user code rather than the original. `typed`: accept the typed values
    listed in the module docstring as well."""
    if type(value) in _SCALARS:  # reads back as itself (orjson refuses a lone surrogate and
        try:                     # an int beyond 64 bits: the checks below then say why)
            return orjson.dumps(value), value
        except orjson.JSONEncodeError:
            pass
    try:
        data = orjson.dumps(value, default=_refuse, option=_OPTS)
    except (TypeError, orjson.JSONEncodeError) as exc:
        if typed:
            if _typed.is_model(value):  # an SDK's result: the common typed case, made direct
                return _encode_model(value, what)
            return _encode_tagged(value, what, typed)
        path, bad = _find_bad(value, what)
        raise _error(path, bad, str(exc), typed) from None
    if type(value) is dict and MARK in value:
        # Escaped: a document starting with that key would read as a tagged value.
        return _encode_tagged(value, what, typed)
    decoded = orjson.loads(data)
    if decoded != value:
        bad_path = _find_changed(value, decoded, what)
        if bad_path is not None:
            if typed:  # a UUID or an enum, which orjson writes as their plain values
                return _encode_tagged(value, what, typed)
            raise _error(bad_path[0], bad_path[1], "it would read back as a different value",
                         typed)
    elif typed and type(value) is not str and not _typed.plain(value):
        return _encode_tagged(value, what, typed)  # an int or str enum: equal to its value
    return data, decoded


def _encode_model(value: Any, what: str) -> tuple[bytes, Any]:
    """A pydantic model as its tagged object (the bytes _encode_tagged would write), validated
    back from the JSON pydantic wrote: one model_dump_json, one model_validate_json."""
    try:
        path = _typed.class_path(type(value))
        text = value.model_dump_json(by_alias=True, round_trip=True)
    except Bad as bad:
        raise _error(what, bad.obj, bad.why, True) from None
    except Exception as exc:  # pydantic_core.PydanticSerializationError and friends
        raise _error(what, value, f"model_dump_json failed: {exc}", True) from None
    try:
        decoded = type(value).model_validate_json(text)
    except Exception as exc:  # pydantic.ValidationError
        raise SerializationError(f"{what} would not read back: a tagged pydantic {path} does not "
                                 f"read back: {type(exc).__name__}: {exc}") from None
    data = b'{"__tether__":"pydantic","cls":' + orjson.dumps(path) + b',"v":' + text.encode() + b"}"
    return data, decoded


def _encode_tagged(value: Any, what: str, typed: bool) -> tuple[bytes, Any]:
    try:
        data = orjson.dumps(tag(value, typed))
    except Bad as bad:
        raise _error(what + "".join(reversed(bad.path)), bad.obj, bad.why, typed) from None
    if not data.startswith(PREFIX) and MARK_BYTES in data:
        data = b'{"__tether__":"json","v":' + data + b"}"
    try:
        decoded = revive(orjson.loads(data))
    except SerializationError as exc:
        raise SerializationError(f"{what} would not read back: {exc}") from None
    # A model reads back as its own round trip defines (find_changed accepts it whatever it
    # compares): a model result skips the comparison, a deep __eq__ as costly as the dump.
    if not _typed.is_model(value) and decoded != value:
        found = _typed.find_changed(value, decoded, what)
        if found is not None:
            raise _error(found[0], found[1], "it would read back as a different value", typed)
    return data, decoded


def with_usage(data: bytes, usage: dict[str, int]) -> bytes:
    """A journal record of `data` (encoded by `encode`) with the token usage its call
    reported: {"__tether__": "call", "usage": {...}, "v": <data>}, read back as `data` is."""
    if not data.startswith(PREFIX) and MARK_BYTES in data:
        # Plain JSON holding a dict keyed "__tether__" deeper down: inside a tagged document
        # that dict would read as a tag, so escape it (tag() escapes every such dict).
        data = orjson.dumps(tag(orjson.loads(data), False))
    return USAGE_PREFIX + orjson.dumps(usage) + b',"v":' + data + b"}"


def usage_in(record: bytes) -> dict[str, int] | None:
    """The usage `with_usage` put in a journal record, if any."""
    if not record.startswith(USAGE_PREFIX):
        return None
    usage: dict[str, int] = orjson.loads(record)["usage"]
    return usage


def _error(path: str, bad: Any, why: str, typed: bool) -> SerializationError:
    kinds = ("JSON types (dict with str keys, list, str, int, finite float, bool, None)")
    if typed:
        kinds += (", pydantic models, dataclasses, datetime/date/time/timedelta, UUID, Decimal,"
                  " enums or bytes")
    return SerializationError(
        f"{path} has a value of type {type(bad).__name__!r} that is not serializable ({why});"
        f" values here must be {kinds}"
    )


def _find_changed(value: Any, decoded: Any, path: str) -> tuple[str, Any] | None:
    """The first place where `decoded` differs from `value` other than tuple -> list."""
    if isinstance(value, dict) and isinstance(decoded, dict):
        for k, v in value.items():
            found = _find_changed(v, decoded.get(k), f"{path}[{k!r}]")
            if found is not None:
                return found
        return None
    if isinstance(value, (list, tuple)) and isinstance(decoded, list):
        for i, (v, d) in enumerate(zip(value, decoded, strict=False)):
            found = _find_changed(v, d, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    if type(value) in (str, int, bool, type(None)) or (
            type(value) is float and value == value and abs(value) != float("inf")):
        return None if value == decoded else (path, value)
    return path, value


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """The value `data` holds; tagged objects read back as their types. Plain JSON (anything
    an earlier release wrote) costs a test of its first bytes more than orjson.loads."""
    value = orjson.loads(data)
    if type(data) is bytes:
        return revive(value) if data.startswith(PREFIX) else value
    if isinstance(data, str):
        return revive(value) if data.startswith(PREFIX_TEXT) else value
    return revive(value) if bytes(data[:len(PREFIX)]) == PREFIX else value


def display(value: Any, option: int = 0) -> bytes:
    """JSON of `value` for people and other programs (the CLI's output): typed values in
    their plain JSON form (a model's model_dump(mode="json"), a datetime's isoformat, a
    Decimal as a string, bytes as base64, ...). Not read back: `dumps` is the stored form."""
    return orjson.dumps(value, default=_typed.plain_json, option=option)


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _find_bad(value: Any, path: str) -> tuple[str, Any]:
    """Walk a value that failed to serialize and return (path, offending object)."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                return f"{path} key {k!r}", k
            sub = f"{path}[{k!r}]"
            try:
                orjson.dumps(v, default=_refuse, option=_OPTS)
            except (TypeError, orjson.JSONEncodeError):
                return _find_bad(v, sub)
        return path, value
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            try:
                orjson.dumps(v, default=_refuse, option=_OPTS)
            except (TypeError, orjson.JSONEncodeError):
                return _find_bad(v, f"{path}[{i}]")
        return path, value
    return path, value
