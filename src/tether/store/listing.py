"""The runs list's filters and orders, decided once for every store: which named query serves
a listing and with which parameters (each store only runs it).

Every order is a keyset over an index: `newest` and `oldest` walk runs_created
(created_at, thread_id) down or up, `updated` orders by (updated_at, thread_id), read as
parts that together hold every run once: the running runs (what workers lease: per version
a range of runs_open, read whole and sorted), the resting ones (queued, waiting, sleeping),
a page of each status walked down runs_idle (status, idle_at, thread_id), where idle_at is
updated_at while a run rests (migration 0017), and the finished ones, walked down
runs_finished (finished_at, thread_id), where finished_at is updated_at once a run is
terminal (migration 0012); both kept by the database. updated_at itself has no index, as
every step commit rewrites it. A status filter reads only the part that can hold it
(`_running`, `_idle`, `_finished`). A listing's
`before` is the cursor of the last row seen, in that order's key: (created_at, thread_id), or
(updated_at, thread_id) for `updated`. Bounds that are not set are bound as infinities, so
the time range and the cursor are always one index range, never an `IS NULL OR` the planner
cannot use.

A thread_id prefix is a range of the primary key, [prefix, the next string after every string
that starts with it), where strings order by code point: SQLite's BINARY collation, a
Postgres database in C, POSIX or C.UTF-8. Under a linguistic collation (en_US.UTF-8, ICU)
the strings that start with a prefix need not be one range ('order-9' sorts after 'order.'),
so there the prefix is only a filter (`starts_with`), exact but read along runs_created.

An open status (queued, running, waiting, sleeping; newest or oldest first, with neither a
parent nor a prefix range) walks runs_open: per version (a skip scan of the versions), its
(version, status, created_at, thread_id) range past the cursor, a page each, merged: a page
of a million parked runs reads a page per version (`_open`).
A rare terminal status (failed, cancelled; newest or oldest first, with neither a parent
nor a prefix range) walks its partial index instead (runs_failed, runs_cancelled: that
status's runs in creation order), so a filter that matches nothing reads that status's runs,
not the whole table; with a version, its `_version` query checks it in the index's key (a
version with none of them reads no run). An agent (newest or oldest first, no open or rare
status) walks runs_agent (agent, created_at, thread_id, version: a version checked in its
key), a version without an agent runs_version (version, created_at, thread_id), completed
without either runs_completed (that status's runs in creation order): a filter that matches
no recent run reads that agent's, version's or status's runs, never the whole of
runs_created (migration 0017). Every one of these columns is written once, at creation or
at the end: a step that goes on changes no entry of them.

On Postgres runs_created, runs_agent and runs_version are run_keys_created, run_keys_agent
and run_keys_version (migration 0018): on run_keys, one row per run that the database keeps
in step with runs, each run then read by primary key. (Any change of a run's status writes
an entry in every index of runs; these took one on each although their columns never move.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import DefinitionError

ORDERS = ("newest", "oldest", "updated")
INDEXED_STATUSES = ("failed", "cancelled")  # each with a partial index (migration 0011)
OPEN_STATUSES = ("queued", "running", "waiting", "sleeping")  # runs_open's
FINISHED_STATUSES = ("completed", "failed", "cancelled")  # finished_at is set (0012)
MAX_PREFIX = 200
_INF = math.inf


@dataclass(frozen=True, slots=True)
class RunQuery:
    """One listing: the filters (None = any), the order, the cursor and the page size."""

    status: str | None = None
    agent: str | None = None
    version: str | None = None
    parent: str | None = None
    since: float | None = None
    until: float | None = None
    prefix: str | None = None
    order: str = "newest"
    before: tuple[float, str] | None = None
    limit: int = 100

    def __post_init__(self) -> None:
        for name in ("status", "agent", "version", "parent", "prefix"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value
                                      or len(value) > MAX_PREFIX or "\x00" in value):
                raise DefinitionError(f"{name} must be a non-empty string of at most "
                                      f"{MAX_PREFIX} characters without NUL, got {value!r}")
        for name in ("since", "until"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool)
                                      or not isinstance(value, (int, float))
                                      or not math.isfinite(value)):
                raise DefinitionError(f"{name} must be a finite number of seconds since the "
                                      f"epoch, got {value!r}")
        if self.order not in ORDERS:
            raise DefinitionError(f"order must be one of {', '.join(ORDERS)}, got "
                                  f"{self.order!r}")
        if self.before is not None:
            ts, tid = self.before
            if (isinstance(ts, bool) or not isinstance(ts, (int, float))
                    or not math.isfinite(ts) or not isinstance(tid, str)):
                raise DefinitionError(f"before must be a (seconds, thread_id) cursor, got "
                                      f"{self.before!r}")
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1:
            raise DefinitionError(f"limit must be a positive integer, got {self.limit!r}")

    def _variant(self) -> str:
        """The query's variant when neither a parent nor a prefix range serves it."""
        status = self.status
        if self.order == "updated":
            return ("_running" if status == "running" else "_idle" if status in OPEN_STATUSES
                    else "_finished" if status in FINISHED_STATUSES else "")
        if status in INDEXED_STATUSES:  # the version is in that index's key
            return f"_{status}" + ("_version" if self.version is not None else "")
        if status in OPEN_STATUSES:
            return "_open"
        # An agent's or a version's runs before the completed ones: completed runs are most
        # of a store, so the agent's range (or the version's) holds few that are not.
        return ("_agent" if self.agent is not None else "_version" if self.version is not None
                else "_completed" if status == "completed" else "")

    def plan(self, *, code_point_order: bool) -> tuple[str, dict[str, object]]:
        """The named query and its parameters. `code_point_order`: the store's thread_id
        collation orders by code point, so a prefix can be a primary-key range."""
        end = prefix_end(self.prefix) if self.prefix is not None else None
        ranged = end is not None and code_point_order and self.parent is None
        variant = ("_parent" if self.parent is not None else "_prefix" if ranged
                   else self._variant())
        name = f"list_runs_{self.order}{variant}"
        down = self.order != "oldest"
        if self.before is not None:
            cur_ts, cur_id = float(self.before[0]), self.before[1]
        else:  # a cursor before every row: +inf going down, -inf going up
            cur_ts, cur_id = (_INF, "") if down else (-_INF, "")
        if self.order != "updated":
            # In created order the time range is a bound of the cursor's too, (until, "")
            # going down and (since, "") going up (no thread_id is empty): the index range
            # then starts there, where a cursor at infinity started a walk down (or up) from
            # the newest (oldest) run to the range.
            if down and self.until is not None:
                cur_ts, cur_id = min((cur_ts, cur_id), (float(self.until), ""))
            elif not down and self.since is not None:
                cur_ts, cur_id = max((cur_ts, cur_id), (float(self.since), ""))
        params: dict[str, object] = {
            "status": self.status, "agent": self.agent, "version": self.version,
            "parent": self.parent, "prefix": self.prefix,
            "since": -_INF if self.since is None else float(self.since),
            "until": _INF if self.until is None else float(self.until),
            "cur_ts": cur_ts, "cur_id": cur_id, "limit": self.limit,
        }
        if ranged:
            params["lo"], params["hi"] = self.prefix, end
        return name, params


def index_ordered(name: str) -> bool:
    """Whether the named listing reads an index in its own order, a page of it (of each
    version's range, for `_open`), no sort of what it matched: Postgres reads those with
    sorting off (read_by_index), so no statistics make the planner sort every
    matching run instead. The others sort a bounded set (a run's children, a prefix's
    range, the running runs by updated_at), which sorting off would turn into a walk of
    runs_created."""
    return not name.endswith(("_parent", "_prefix")) and name not in (
        "list_runs_updated", "list_runs_updated_running")


def prefix_end(prefix: str) -> str | None:
    """The least string greater than every string that starts with `prefix`, in code point
    order: its last character incremented (surrogates skipped; a last U+10FFFF carries).
    None when every character is U+10FFFF: no such string (the prefix is then a filter)."""
    chars = list(prefix)
    while chars:
        last = ord(chars.pop())
        if last < 0x10FFFF:
            nxt = last + 1
            if 0xD800 <= nxt <= 0xDFFF:
                nxt = 0xE000
            return "".join(chars) + chr(nxt)
    return None
