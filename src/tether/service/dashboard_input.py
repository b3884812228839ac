"""What the dashboard accepts from a browser: ids, the runs filter of the URL and its page
cursor. Bad input is a Refused, shown on the page with its status; nothing is changed."""

from __future__ import annotations

import base64
import binascii
import math
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import orjson

from ..runtime import Run, RunStatus

MAX_ID = 200
PAGE_SIZES = (20, 50, 100, 200)


class Refused(Exception):
    """An action or a page request that cannot be served: shown on the page with `status`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def check_id(value: str | None, what: str) -> str:
    if value is None or not value.strip():
        raise Refused(400, f"{what} is required.")
    value = value.strip()
    if len(value) > MAX_ID or "\x00" in value:
        raise Refused(400, f"{what} must be at most {MAX_ID} characters, without NUL.")
    return value


def encode_cursor(run: Run) -> str:
    raw = orjson.dumps([run.created_at, run.thread_id])
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, str]:
    bad = Refused(400, "The page cursor in this address is not one the dashboard made; "
                       "start again from the first page.")
    try:
        value = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError):
        raise bad from None
    if (not isinstance(value, list) or len(value) != 2 or isinstance(value[0], bool)
            or not isinstance(value[0], (int, float)) or not math.isfinite(value[0])
            or not isinstance(value[1], str) or not 0 < len(value[1]) <= MAX_ID
            or "\x00" in value[1]):
        raise bad
    return float(value[0]), value[1]


@dataclass(frozen=True, slots=True)
class RunFilter:
    """The runs list's filter, as it appears in the URL."""

    status: str | None = None
    agent: str | None = None
    limit: int = 50
    cursor: str | None = None

    @classmethod
    def parse(cls, q: dict[str, str]) -> RunFilter:
        status = q.get("status") or None
        if status is not None and status not in RunStatus.__members__.values():
            raise Refused(400, f"Unknown status {status!r}: choose one of "
                               f"{', '.join(s.value for s in RunStatus)}.")
        agent = q.get("agent", "").strip() or None
        if agent is not None:
            agent = check_id(agent, "Agent")
        raw = q.get("limit") or "50"
        if not raw.isdigit() or int(raw) not in PAGE_SIZES:
            raise Refused(400, f"Page size must be one of {', '.join(map(str, PAGE_SIZES))}.")
        cursor = q.get("cursor") or None
        if cursor is not None:
            if len(cursor) > 1024:
                raise Refused(400, "The page cursor in this address is too long.")
            decode_cursor(cursor)
        return cls(status, agent, int(raw), cursor)

    def query(self, **change: Any) -> str:
        fields = {"status": self.status, "agent": self.agent, "limit": self.limit,
                  "cursor": self.cursor, **change}
        if fields["limit"] == 50:
            fields["limit"] = None
        return urlencode({k: v for k, v in fields.items() if v is not None})
