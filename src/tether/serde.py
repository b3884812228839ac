"""Serialization of state, updates, journal results and payloads (orjson).

Values must be JSON types: dict with str keys, list, tuple (read back as list), str, int,
float, bool, None. A failure names the path of the offending value and its type.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from .errors import SerializationError

# Types orjson would silently turn into something else (datetime -> str, dataclass -> dict,
# str/int subclasses -> their base) are passed to `_refuse` instead, which raises.
_OPTS = (orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
         | orjson.OPT_PASSTHROUGH_SUBCLASS)


def _refuse(obj: Any) -> Any:
    raise TypeError(f"Type is not JSON serializable: {type(obj).__name__}")


def dumps(value: Any, what: str = "value") -> bytes:
    """JSON bytes of `value`, refusing anything that would not read back the same (tuples,
    read back as lists, are the one accepted difference)."""
    return encode(value, what)[0]


def encode(value: Any, what: str = "value") -> tuple[bytes, Any]:
    """(JSON bytes, the value as it reads back). A replay sees exactly the decoded value, so
    callers hand that to user code rather than the original."""
    try:
        data = orjson.dumps(value, default=_refuse, option=_OPTS)
    except (TypeError, orjson.JSONEncodeError) as exc:
        path, bad = _find_bad(value, what)
        raise _error(path, bad, str(exc)) from None
    decoded = orjson.loads(data)
    if decoded != value:
        bad_path = _find_changed(value, decoded, what)
        if bad_path is not None:
            raise _error(bad_path[0], bad_path[1], "it would read back as a different value")
    return data, decoded


def _error(path: str, bad: Any, why: str) -> SerializationError:
    return SerializationError(
        f"{path} has a value of type {type(bad).__name__!r} that is not JSON-serializable"
        f" ({why}); state, updates and results must be JSON types (dict with str keys, list,"
        f" str, int, finite float, bool, None)"
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
    if isinstance(data, memoryview):
        data = bytes(data)
    return orjson.loads(data)


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
