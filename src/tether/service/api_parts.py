"""Parts of the HTTP API that are not routes: the status of each tether error, the HTTP
layer's own error, the OpenAPI error entries, the runs list's cursor, the JSON check of a body's
values."""

from __future__ import annotations

import base64
import binascii
import math
from http import HTTPStatus
from typing import Any

import orjson

from ..errors import (
    ConfigError,
    DefinitionError,
    InvalidState,
    LeaseLost,
    RunConflict,
    RunNotFound,
    RunPruned,
    SerializationError,
    StoreError,
    TetherError,
)
from .models import MAX_ID, ErrorBody
from .streams import RETRY_AFTER

# Most specific first: ResumeConflict is a RunConflict.
_STATUS: tuple[tuple[type[TetherError], int], ...] = (
    (RunPruned, 410),
    (RunNotFound, 404),
    (RunConflict, 409),
    (InvalidState, 409),
    (LeaseLost, 409),
    (DefinitionError, 422),
    (SerializationError, 422),
    (ConfigError, 400),
    (StoreError, 503),
    (TetherError, 400),
)


class ApiError(Exception):
    """An error of the HTTP layer itself (bad cursor, body too large)."""

    def __init__(self, status: int, type: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.type = type
        self.message = message


def _errors(*codes: int, explicit: bool = False) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error statuses an operation can return. `explicit` spells the
    JSON content out, for operations whose own response is not JSON (FastAPI would document
    their errors under the operation's media type)."""
    if explicit:
        content = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
        return {c: {"description": HTTPStatus(c).phrase, "content": content} for c in codes}
    return {c: {"model": ErrorBody, "description": HTTPStatus(c).phrase} for c in codes}


_TOO_MANY_STREAMS: dict[str, Any] = {
    "description": "Too Many Requests: the client, or the server, has as many streams open as "
                   "its caps allow (tether serve --max-streams-per-client, --max-streams)",
    "headers": {"Retry-After": {"description": f"seconds to wait ({RETRY_AFTER})",
                                "schema": {"type": "integer"}}},
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}}


def encode_cursor(created_at: float, thread_id: str) -> str:
    raw = orjson.dumps([created_at, thread_id])
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, str]:
    bad = ApiError(400, "InvalidCursor", "cursor is not one this server returned as next_cursor")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        value = orjson.loads(raw)
    except (binascii.Error, ValueError):
        raise bad from None
    if (not isinstance(value, list) or len(value) != 2
            or isinstance(value[0], bool) or not isinstance(value[0], (int, float))
            or not math.isfinite(value[0])
            or not isinstance(value[1], str) or not 0 < len(value[1]) <= MAX_ID
            or "\x00" in value[1]):
        raise bad
    return float(value[0]), value[1]


def _check_json(value: Any, what: str) -> None:
    """Refuse values that the store's serializer would refuse (ints beyond 64 bits, nesting
    deeper than 254, lone surrogates) up front, as a 422 naming them."""
    try:
        orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise SerializationError(f"{what} cannot be stored as JSON: {exc}") from None
