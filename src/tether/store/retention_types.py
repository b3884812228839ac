"""The records of retention (tether prune) that cross the Store boundary."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .audit import Audit

PRUNE_TABLES = ("checkpoints", "journal", "outbox", "mailbox", "interrupts", "groups",
                "child_links", "runs_rows")
"""What goes with a pruned run, in the order it is removed (the run's row last)."""


@dataclass(frozen=True, slots=True)
class Cutoffs:
    """Which terminal runs a prune removes: those finished before these times (database
    clock; None keeps every run of that status), of `agent` only if given."""

    completed: float | None = None
    failed: float | None = None
    cancelled: float | None = None
    agent: str | None = None

    def params(self) -> dict[str, Any]:
        return {"completed": self.completed, "failed": self.failed,
                "cancelled": self.cancelled, "agent": self.agent}

    @property
    def horizon(self) -> float | None:
        """The latest cut-off: a run created after it cannot have finished before it."""
        cuts = [c for c in (self.completed, self.failed, self.cancelled) if c is not None]
        return max(cuts) if cuts else None


@dataclass(frozen=True, slots=True)
class Candidates:
    """A batch of runs a prune may remove, and where the walk goes on after it (a position
    of the store's own walk; None: the start)."""

    thread_ids: list[str]
    after: Any


@dataclass(frozen=True, slots=True)
class Tombstone:
    """What is left of a pruned run."""

    thread_id: str
    agent: str
    status: str
    finished_at: float
    pruned_at: float


@dataclass(frozen=True, slots=True)
class Pruned:
    """One batch's outcome: the runs removed and the rows removed with them."""

    thread_ids: list[str]
    rows: int


@dataclass(frozen=True, slots=True)
class Space:
    """One step of giving free space back: `freed` bytes went back to the file system,
    `free` bytes are still free inside the database (reused by new rows); `gives_back` is
    False for a SQLite file created without incremental auto-vacuum (until a VACUUM)."""

    freed: int
    free: int
    gives_back: bool


class Retention(Protocol):
    """What a store does for retention: the pruner's lock, finding and removing runs a policy
    covers, tombstones, and compacting long checkpoint logs. Each operation is one statement
    or one transaction; batching, pacing and policy are the caller's (tether.retention)."""

    async def take_lock(self, name: str, owner: str, ttl: float) -> bool:
        """Take or renew the maintenance lease `name` for `owner` for `ttl` seconds; False
        while another owner holds it unexpired."""

    async def drop_lock(self, name: str, owner: str) -> None:
        """Release the lease if `owner` still holds it."""

    async def prune_candidates(self, cutoffs: Cutoffs, after: Any, limit: int) -> Candidates:
        """Up to `limit` runs the cut-offs remove (terminal for long enough, no effect left to
        perform, no unconsumed mail), after the position `after` (None: from the start) of a
        walk that meets each run once, in the order the store's rows are best removed in."""

    async def running_now(self) -> bool:
        """Whether some worker is running a run now (its lease unexpired)."""

    async def prune_estimate(self, cutoffs: Cutoffs) -> list[tuple[str, str, int, int]]:
        """(status, agent, runs, payload bytes) of what a prune would remove; changes nothing."""

    async def prune_runs(self, thread_ids: Sequence[str], cutoffs: Cutoffs,
                         audit: Audit | None = None) -> Pruned:
        """In one transaction: of `thread_ids`, the runs still removable, with their
        checkpoints, journal, effects, mail, interrupts and group memberships; a tombstone
        for each; children's links to them cleared; and `audit`'s row (its details given the
        count removed) if any was. All or nothing."""

    async def get_tombstone(self, thread_id: str) -> Tombstone | None: ...

    async def reclaim(self, pages: int) -> Space | None:
        """In one short write: give up to `pages` free pages of the database back to the
        file system (SQLite in incremental auto-vacuum mode). None: the database does this
        itself (Postgres: autovacuum)."""

    async def long_logs(self, keep: int, after: str, limit: int) -> list[str]:
        """Runs with more than `keep` committed steps, after `after` in thread_id order."""

    async def interrupt_steps(self, thread_id: str, before: int) -> list[int]:
        """The steps (before `before`) whose state a fork needs to re-ask an interrupt."""

    async def compact_log(self, thread_id: str, snapshots: dict[int, bytes], before: int,
                          keep: Sequence[int]) -> int:
        """In one transaction: rewrite each step of `snapshots` as a snapshot of that state,
        then remove the run's checkpoints before `before` but those in `keep`, and the
        journal of steps before `before`. Returns the rows removed."""

    async def compact_estimate(self, thread_id: str, before: int, keep: Sequence[int],
                               cutoffs: Cutoffs) -> int:
        """The rows compact_log(thread_id, ..., before, keep) would remove now, changing
        nothing; 0 for a run a prune with `cutoffs` removes first."""
