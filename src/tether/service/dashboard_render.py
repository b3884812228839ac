"""What the dashboard's templates need besides the data: the Jinja2 environment (autoescaped,
templates shipped in the package), value formatting, the state diff between two steps and
the checkpoint timeline's pages, whose states are rebuilt from the checkpoint rows only
where a page shows them."""

from __future__ import annotations

import bisect
import datetime
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import orjson
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from .. import serde
from ..deploy import at_least
from ..records import checkpoint_of
from ..state import apply
from ..store.base import CheckpointRecord

TIMELINE_PAGE = 100
"""Steps per page of a run's timeline."""
MISSING: Any = object()
"""The diff's marker for "this path did not exist on that side"."""


@dataclass(frozen=True, slots=True)
class Change:
    """One difference between two states: `path` like `a.b[2]`, `op` added/removed/changed/
    appended (a list that grew at its end: `new` is the list of items added)."""

    path: str
    op: str
    old: Any
    new: Any


def state_diff(old: Any, new: Any, path: str = "") -> list[Change]:
    """The changes that turn `old` into `new`, by path, dict keys in sorted order. Dicts are
    compared key by key; a list that only grew at its end is one `appended` change (what
    `tether.append` does); any other list or value change is one `changed` at its path."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[Change] = []
        for key in sorted(old.keys() | new.keys(), key=str):
            sub = f"{path}.{key}" if path else str(key)
            if key not in new:
                out.append(Change(sub, "removed", old[key], MISSING))
            elif key not in old:
                out.append(Change(sub, "added", MISSING, new[key]))
            else:
                out += state_diff(old[key], new[key], sub)
        return out
    if _same(old, new):
        return []
    if (isinstance(old, list) and isinstance(new, list) and len(new) > len(old)
            and _same(old, new[:len(old)])):
        return [Change(path or "(state)", "appended", old, new[len(old):])]
    return [Change(path or "(state)", "changed", old, new)]


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON values. Python's == says 1 == True == 1.0, JSON does not: containers
    that compare equal (at C speed) are confirmed by their encodings."""
    if type(a) is not type(b) or a != b:
        return False
    if isinstance(a, (dict, list)):
        return _encode(a) == _encode(b)
    return True


def _encode(value: Any) -> bytes:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):
        return repr(value).encode()


def to_json(value: Any, indent: bool = True) -> str:
    if value is MISSING:
        return ""
    opts = orjson.OPT_SORT_KEYS | (orjson.OPT_INDENT_2 if indent else 0)
    try:
        return orjson.dumps(value, option=opts).decode()
    except (TypeError, orjson.JSONEncodeError):
        return repr(value)


def short_json(value: Any, limit: int = 120) -> str:
    text = to_json(value, indent=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def when(ts: float | None) -> str:
    if ts is None:
        return ""
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def age(ts: float | None, now: float) -> str:
    """How long ago `ts` was, in the largest unit that fits: `42s`, `5m`, `3h`, `2d`."""
    if ts is None:
        return ""
    secs = max(0.0, now - ts)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{int(secs // size)}{unit}"
    return f"{int(secs)}s"


def duration(secs: float | None) -> str:
    if secs is None or not math.isfinite(secs):
        return ""
    if secs < 1:
        return f"{secs * 1000:.1f} ms"
    if secs < 120:
        return f"{secs:.2f} s"
    return f"{secs / 60:.1f} min"


def bar_width(value: float, largest: float) -> float:
    """A step's duration bar as a percentage of the longest step's (at least 1 to be seen)."""
    if largest <= 0 or not math.isfinite(value):
        return 1.0
    return max(1.0, min(100.0, 100.0 * value / largest))


_VIEWS = {"overview": "/ui", "inbox": "/ui/interrupts", "effects": "/ui/effects",
          "deployments": "/ui/deployments", "workers": "/ui/workers"}


def view_url(live: str | None) -> str | None:
    """The GET page a live topic follows ("run:T" -> /ui/runs/T, "runs:QUERY" ->
    /ui/runs?QUERY): what a page rendered for a refused action (at its POST URL) fetches
    again when its view changes."""
    if live is None:
        return None
    kind, _, arg = live.partition(":")
    if kind == "run":
        return "/ui/runs/" + quote(arg, safe="")
    if kind == "runs":
        return "/ui/runs" + (f"?{arg}" if arg else "")
    return _VIEWS.get(kind)


def environment() -> Environment:
    env = Environment(
        loader=PackageLoader("tether.service", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(json=to_json, short_json=short_json, when=when, duration=duration)
    env.globals.update(MISSING=MISSING, age=age, bar_width=bar_width, at_least=at_least)
    return env


def render(env: Environment, name: str, context: Mapping[str, Any]) -> str:
    return env.get_template(name).render(**context)


def states_at(base: bytes, rows: Sequence[CheckpointRecord], wanted: Iterable[int]
              ) -> dict[int, dict[str, Any]]:
    """The state after each wanted row (an index into `rows`, the run's checkpoints in step
    order; `base`: its input), replayed only from the latest snapshot at or before it: a
    1,000-step run's page decodes the rows it shows, not its whole log. Each state is its
    own dict; they share the values that did not change (a replay never changes a value in
    place: a delta sets keys and appends to new lists), so they are for reading only."""
    snaps = [i for i, cp in enumerate(rows) if cp.kind == "s"]
    out: dict[int, dict[str, Any]] = {}
    state: dict[str, Any] | None = None
    at = -1  # `state` is the state after rows[at] (-1: the input), None until first needed
    for want in sorted(set(wanted)):
        k = bisect.bisect_right(snaps, want) - 1
        if k >= 0 and snaps[k] > at:  # a snapshot at or before it, later than where we are
            at = snaps[k]
            state = dict(serde.loads(rows[at].data))
        elif state is None:
            state = dict(serde.loads(base))
        for i in range(at + 1, want + 1):
            state = apply(state, rows[i].kind, rows[i].data)
        at = want
        out[want] = dict(state)
    return out


def timeline(rows: Sequence[CheckpointRecord], base: bytes, upto: int | None = None
             ) -> dict[str, Any]:
    """One page of the run's checkpoint timeline (`rows`: its checkpoints in step order,
    `base`: its input): the TIMELINE_PAGE steps ending at `upto` (default: the latest), each
    with its diff from the step before (the first step has no earlier checkpoint to compare
    with) and its duration bar; the neighbouring pages; and `state`, the state after the
    last step (None without steps). Only the shown steps' states are rebuilt and diffed."""
    steps = [cp.step for cp in rows]
    end = len(rows) if upto is None else bisect.bisect_right(steps, upto)
    start = max(0, end - TIMELINE_PAGE)
    longest = max((cp.finished_at - cp.started_at for cp in rows), default=0.0)
    states = states_at(base, rows, [*range(max(0, start - 1), end),
                                    *([len(rows) - 1] if rows else [])])
    shown: list[dict[str, Any]] = []
    for i in range(start, end):
        shown.append({"cp": checkpoint_of(rows[i], states[i]), "longest": longest,
                      "diff": None if i == 0 else state_diff(states[i - 1], states[i])})
    return {
        "rows": shown, "total": len(rows),
        "earlier": rows[start - 1].step if start > 0 else None,
        "later": rows[min(len(rows), end + TIMELINE_PAGE) - 1].step if end < len(rows) else None,
        "state": states[len(rows) - 1] if rows else None,
    }
