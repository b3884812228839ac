"""What the dashboard accepts from a browser: ids, the runs filter of the URL and its page
cursor. Bad input is a Refused, shown on the page with its status; nothing is changed."""

from __future__ import annotations

import base64
import binascii
import datetime
import math
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import orjson

from ..runtime import Run, RunStatus

MAX_ID = 200
PAGE_SIZES = (20, 50, 100, 200)
ORDERS = {"newest": "newest first", "oldest": "oldest first", "updated": "latest updated"}


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


def encode_cursor(run: Run, order: str = "newest") -> str:
    """The page cursor after `run`: its key in the list's order."""
    raw = orjson.dumps([run.updated_at if order == "updated" else run.created_at,
                        run.thread_id])
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


WEIGHT = "weight:"
"""The weights form names each field WEIGHT + version."""


def parse_weights(fields: dict[str, str]) -> dict[str, int]:
    """The weight table of the deployments form: one whole number >= 0 per version, summing
    to more than 0 (the Runtime checks the versions exist)."""
    weights: dict[str, int] = {}
    for name, raw in fields.items():
        if not name.startswith(WEIGHT):
            continue
        version = check_id(name[len(WEIGHT):], "Version")
        text = raw.strip()
        if not (text.isdigit() and text.isascii() and len(text) <= 9):
            raise Refused(400, f"The weight of {version!r} must be a whole number from 0 to "
                               f"999999999, got {raw!r}. Nothing was changed.")
        weights[version] = int(text)
    if not weights:
        raise Refused(400, "The form has no weight. Nothing was changed.")
    if sum(weights.values()) <= 0:
        raise Refused(400, "The weights sum to 0: at least one version must take new runs. "
                           "Nothing was changed.")
    return weights


def parse_time(raw: str, what: str) -> float:
    """Seconds since the epoch of an ISO 8601 date or date and time (UTC unless it names an
    offset), as <input type=datetime-local> sends it."""
    try:
        when = datetime.datetime.fromisoformat(raw)
    except ValueError:
        raise Refused(400, f"{what} must be a date or a date and time like 2025-05-01T09:30 "
                           f"(UTC), got {raw!r}.") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return when.timestamp()


@dataclass(frozen=True, slots=True)
class RunFilter:
    """The runs list's filter, as it appears in the URL: status, agent, version, created
    since/until (ISO 8601, UTC), a thread_id prefix, the order, the page size and cursor."""

    status: str | None = None
    agent: str | None = None
    limit: int = 50
    cursor: str | None = None
    version: str | None = None
    since: str | None = None
    until: str | None = None
    prefix: str | None = None
    order: str = "newest"

    @classmethod
    def parse(cls, q: dict[str, str]) -> RunFilter:
        status = q.get("status") or None
        if status is not None and status not in RunStatus.__members__.values():
            raise Refused(400, f"Unknown status {status!r}: choose one of "
                               f"{', '.join(s.value for s in RunStatus)}.")
        agent, version, prefix = (
            check_id(v, what) if (v := q.get(key, "").strip()) else None
            for key, what in (("agent", "Agent"), ("version", "Version"),
                              ("prefix", "thread_id prefix")))
        raw = q.get("limit") or "50"
        if raw not in map(str, PAGE_SIZES):
            raise Refused(400, f"Page size must be one of {', '.join(map(str, PAGE_SIZES))}.")
        order = q.get("order") or "newest"
        if order not in ORDERS:
            raise Refused(400, f"Unknown order {order!r}: choose one of {', '.join(ORDERS)}.")
        since, until = (q.get(k, "").strip()[:40] or None for k in ("since", "until"))
        f = cls(status, agent, int(raw), q.get("cursor") or None, version, since, until,
                prefix, order)
        if f.since_ts is not None and f.until_ts is not None and f.since_ts >= f.until_ts:
            raise Refused(400, f"Created since ({since}) must be before until ({until}).")
        if f.cursor is not None:
            if len(f.cursor) > 1024:
                raise Refused(400, "The page cursor in this address is too long.")
            decode_cursor(f.cursor)
        return f

    @classmethod
    def as_typed(cls, q: dict[str, str]) -> RunFilter:
        """The filter as typed, unchecked: what a refused form shows again beside its error."""
        raw, order = q.get("limit") or "50", q.get("order") or "newest"
        return cls(q.get("status") or None, q.get("agent", "")[:200] or None,
                   int(raw) if raw in map(str, PAGE_SIZES) else 50, None,
                   q.get("version", "")[:200] or None, q.get("since", "")[:40] or None,
                   q.get("until", "")[:40] or None, q.get("prefix", "")[:200] or None,
                   order if order in ORDERS else "newest")

    @property
    def since_ts(self) -> float | None:
        return None if self.since is None else parse_time(self.since, "Created since")

    @property
    def until_ts(self) -> float | None:
        return None if self.until is None else parse_time(self.until, "Created until")

    @property
    def narrowed(self) -> bool:
        """Anything but the default listing."""
        return self.query(limit=50) != ""

    def query(self, **change: Any) -> str:
        fields = {"status": self.status, "agent": self.agent, "version": self.version,
                  "since": self.since, "until": self.until, "prefix": self.prefix,
                  "order": self.order, "limit": self.limit, "cursor": self.cursor, **change}
        if fields["limit"] == 50:
            fields["limit"] = None
        if fields["order"] == "newest":
            fields["order"] = None
        return urlencode({k: v for k, v in fields.items() if v is not None})
