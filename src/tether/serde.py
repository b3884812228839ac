"""Serialization of state, updates, journal results and payloads (orjson).

Values must be JSON types: dict with str keys, list, tuple (read back as list), str, int,
float, bool, None. A failure names the path of the offending value and its type.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from .errors import SerializationError

_OPTS = 0


def dumps(value: Any, what: str = "value") -> bytes:
    try:
        return orjson.dumps(value, option=_OPTS)
    except (TypeError, orjson.JSONEncodeError) as exc:
        path, bad = _find_bad(value, what)
        raise SerializationError(
            f"{path} has a value of type {type(bad).__name__!r} that is not JSON-serializable"
            f" ({exc}); state, updates and results must be JSON types"
        ) from None


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
                orjson.dumps(v, option=_OPTS)
            except (TypeError, orjson.JSONEncodeError):
                return _find_bad(v, sub)
        return path, value
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            try:
                orjson.dumps(v, option=_OPTS)
            except (TypeError, orjson.JSONEncodeError):
                return _find_bad(v, f"{path}[{i}]")
        return path, value
    return path, value
