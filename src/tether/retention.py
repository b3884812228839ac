"""Retention: remove finished runs a policy no longer needs, and compact long logs.

A policy names, per terminal status, how long after a run *finished* it is kept (never from
its creation: a run that took a month and just finished stays its full term), optionally for
one agent. Non-terminal runs are never removed, nor runs with an effect still to perform or
mail not yet read.

The pruner takes a maintenance lease in the store (one pruner at a time across processes;
a killed pruner's lease expires), walks the runs table once (in the order the store's rows
are best removed in: thread_id on SQLite, creation on Postgres), and removes
runs in batches: each batch is one transaction that re-checks every run, writes its
tombstone and deletes its checkpoints, journal, effects, mail, interrupts and group
memberships, so a pruner killed at any point leaves a consistent store and the next one
finishes the job. A reused thread_id starts a fresh run that can never see the old rows:
they went in the same transaction as the tombstone.

Between batches the pruner rests, longer while a worker is running runs; afterwards it gives
the freed pages back to the file system in short writes (SQLite in incremental auto-vacuum
mode; Postgres leaves that to autovacuum). A batch is bounded in runs and, by shrinking the
next one when a batch took longer than BATCH_SECONDS, in time; a `stop` event set meanwhile
(tether prune on SIGINT or SIGTERM, a worker shutting down) ends the prune after the batch
under way, its report saying so (`stopped`): the next prune finishes the job.

Compaction (`keep_steps`) keeps a run's last N checkpoints: the oldest kept one is rewritten
as a snapshot of the state after it (and, with `keep_interrupts`, so is each checkpoint a
fork needs to re-ask an interrupt), then the earlier ones and their journal go.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from . import serde
from .errors import ConfigError
from .history import load_state
from .store.audit import audit_of
from .store.base import Audit, Store
from .store.retention_types import Cutoffs

log = logging.getLogger("tether.retention")

LOCK = "prune"
BATCH = {"sqlite": 200, "postgres": 1000}
"""Runs per transaction: a SQLite batch shares the group commit with workers' steps (about
20 ms at 200 runs of 10 steps); a Postgres batch holds only its own runs' rows."""
PACE = {"sqlite": 1.0, "postgres": 0.25}
"""After each batch the pruner rests this many times the batch's duration, so workers sharing
the database keep most of it (SQLite: its one writer; Postgres: the disk and CPU)."""
BUSY_PACE = {"sqlite": 9.0, "postgres": 4.0}
"""The rest while a worker is running runs (checked before each batch). On SQLite a worker's
event loop waits for the write lock while a batch holds it, so the pruner keeps to a tenth of
the writer's time, in batches a quarter the size (shorter waits). On Postgres a batch's
deletes take a core and the WAL's writes from the workers' commits (W2 beside a prune at
1.10x its time alone with the pruner at half its time in full batches), so it keeps to a
fifth, in batches a quarter the size."""
BUSY_BATCH = {"sqlite": 4, "postgres": 4}
"""The batch is divided by this while a worker is running runs."""
BATCH_SECONDS = 0.5
"""A batch that took longer makes the next one smaller in proportion (and a quicker one lets
it grow back, at most twofold a batch, up to the batch size): how long a stop waits for the
batch under way, and how long one transaction holds its rows."""
MIN_BATCH = 10
RECLAIM_PAGES = 256
"""Pages a first give-back write returns to the file system (SQLite); later ones are sized so
each takes about RECLAIM_SECONDS (divided by BUSY_BATCH while workers run), within
RECLAIM_RANGE."""
RECLAIM_SECONDS = 0.02
RECLAIM_RANGE = (32, 4096)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

Age = float | int | str | timedelta


def parse_age(value: Age, what: str = "age") -> float:
    """Seconds in 30d, 12h, 15m, 90s, 0s (or a number of seconds, or a timedelta)."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        raw = value.strip().lower()
        try:
            seconds = (float(raw[:-1]) * _UNITS[raw[-1]] if raw and raw[-1] in _UNITS
                       else float(raw))
        except ValueError:
            raise ConfigError(f"{what}: {value!r} is not a duration (use e.g. 30d, 12h, 15m, "
                              "90s or 0s)") from None
    else:
        raise ConfigError(f"{what}: {value!r} is not a duration")
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigError(f"{what}: a duration must be >= 0, got {value!r}")
    return seconds


@dataclass(frozen=True, slots=True)
class Policy:
    """How long finished runs are kept, per status (None: that status is never removed)."""

    completed: float | None = None
    failed: float | None = None
    cancelled: float | None = None
    agent: str | None = None
    keep_steps: int | None = None
    keep_interrupts: bool = False
    every: float | None = None
    """A worker applies the policy this often (Runtime(retention=...), tether worker
    --prune-every); None: only when asked."""

    @classmethod
    def of(cls, *, completed: Age | None = None, failed: Age | None = None,
           cancelled: Age | None = None, agent: str | None = None,
           keep_steps: int | None = None, keep_interrupts: bool = False,
           every: Age | None = None) -> Policy:
        if completed is None and failed is None and cancelled is None and keep_steps is None:
            raise ConfigError("a retention policy needs at least one of completed, failed, "
                              "cancelled (an age, e.g. 30d) or keep_steps")
        if keep_steps is not None and (not isinstance(keep_steps, int) or keep_steps < 1):
            raise ConfigError(f"keep_steps must be a whole number >= 1, got {keep_steps!r}")
        if agent is not None and (not isinstance(agent, str) or not agent):
            raise ConfigError("agent must be a non-empty string")
        interval = None if every is None else parse_age(every, "prune every")
        if interval is not None and interval <= 0:
            raise ConfigError("prune every: the interval must be > 0")
        return cls(
            None if completed is None else parse_age(completed, "completed"),
            None if failed is None else parse_age(failed, "failed"),
            None if cancelled is None else parse_age(cancelled, "cancelled"),
            agent, keep_steps, keep_interrupts, interval)

    def cutoffs(self, now: float) -> Cutoffs:
        def cut(age: float | None) -> float | None:
            return None if age is None else now - age

        return Cutoffs(cut(self.completed), cut(self.failed), cut(self.cancelled), self.agent)

    @property
    def removes_runs(self) -> bool:
        return not (self.completed is None and self.failed is None and self.cancelled is None)


@dataclass(slots=True)
class Report:
    """What a prune removed (or, dry, would remove)."""

    dry_run: bool
    runs: int = 0
    rows: int = 0
    by: dict[tuple[str, str], int] = field(default_factory=dict)
    """Runs by (status, agent)."""
    bytes: int = 0
    """Dry run: the payload bytes of what would go."""
    compacted_runs: int = 0
    compacted_rows: int = 0
    seconds: float = 0.0
    freed_bytes: int = 0
    """Bytes given back to the file system (SQLite in incremental auto-vacuum mode)."""
    free_bytes: int | None = None
    """Bytes still free inside the database after the prune (reused by new rows)."""
    vacuum_needed: bool = False
    """A SQLite file created without incremental auto-vacuum: only a VACUUM shrinks it."""
    db_bytes_before: int | None = None
    db_bytes_after: int | None = None
    stopped: bool = False
    """Stopped when asked (the `stop` event) before the work was done: what is left goes in
    the next prune."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run, "runs": self.runs, "rows": self.rows,
            "by_status_agent": [{"status": s, "agent": a, "runs": n}
                                for (s, a), n in sorted(self.by.items())],
            "bytes": self.bytes, "compacted_runs": self.compacted_runs,
            "compacted_rows": self.compacted_rows, "seconds": round(self.seconds, 3),
            "freed_bytes": self.freed_bytes, "free_bytes": self.free_bytes,
            "vacuum_needed": self.vacuum_needed,
            "rows_per_s": round(self.rows / self.seconds, 1) if self.seconds else None,
            "db_bytes_before": self.db_bytes_before, "db_bytes_after": self.db_bytes_after,
            "stopped": self.stopped,
        }


class PrunerBusy(ConfigError):
    """Another process is pruning this database now."""


Progress = Callable[[Report], None]


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


async def prune(store: Store, policy: Policy, *, lock_ttl: float, dry_run: bool = False,
                progress: Progress | None = None, batch: int | None = None,
                audit: Audit | None = None, stop: asyncio.Event | None = None) -> Report:
    """Apply `policy` once (see the module's docstring); `progress(report)` after each batch.
    The pruner's lease lasts `lock_ttl` seconds (the runtime's lease TTL) after each batch.
    `stop` set: end after the batch under way (the report's `stopped`)."""
    started = time.monotonic()
    report = Report(dry_run)
    ops = store.retention
    stop = stop or asyncio.Event()
    cutoffs = policy.cutoffs(await store.now())
    if dry_run:  # what the real prune below would do, counted, changing nothing
        if policy.removes_runs:
            for status, agent, n, size in await ops.prune_estimate(cutoffs):
                report.by[(status, agent)] = n
                report.runs += n
                report.bytes += size
        if policy.keep_steps is not None:
            await _compact(store, policy, report, None, lock_ttl, progress, stop, cutoffs)
        report.seconds = time.monotonic() - started
        return report
    owner = owner_id()
    if not await ops.take_lock(LOCK, owner, lock_ttl):
        raise PrunerBusy("another process is pruning this database now; try again later "
                         f"(its lease lasts {lock_ttl:g} s after it last renewed it)")
    try:
        if policy.removes_runs:
            await _remove(store, cutoffs, report, owner, lock_ttl, progress, audit, stop,
                          batch or BATCH.get(store.dialect, 500), started)
        if policy.keep_steps is not None and not stop.is_set():
            await _compact(store, policy, report, owner, lock_ttl, progress, stop, None)
        if not stop.is_set():
            await _give_back(store, report, owner, lock_ttl, progress, stop)
    finally:
        await ops.drop_lock(LOCK, owner)
    report.stopped = stop.is_set()
    report.seconds = time.monotonic() - started
    return report


async def _remove(store: Store, cutoffs: Cutoffs, report: Report, owner: str, lock_ttl: float,
                  progress: Progress | None, audit: Audit | None, stop: asyncio.Event,
                  base: int, started: float) -> None:
    ops, size = store.retention, base
    after: Any = None  # the store's position in its walk
    while not stop.is_set():
        t0 = time.monotonic()
        busy = await ops.running_now()
        pace = (BUSY_PACE if busy else PACE).get(store.dialect, 1.0)
        n = max(1, size // BUSY_BATCH.get(store.dialect, 1)) if busy else size
        found = await ops.prune_candidates(cutoffs, after, n)
        if not found.thread_ids:
            return
        after = found.after
        done = await ops.prune_runs(found.thread_ids, cutoffs, audit)
        took = time.monotonic() - t0
        size = next_batch(size, base, took)
        report.runs += len(done.thread_ids)
        report.rows += done.rows
        report.seconds = time.monotonic() - started
        if progress is not None:
            progress(report)
        if not await ops.take_lock(LOCK, owner, lock_ttl):
            log.warning("the prune lease was taken over; stopping (the other pruner goes on)")
            return
        await rest(stop, took * pace)


def next_batch(size: int, base: int, took: float) -> int:
    """The next batch's size after one of `size` runs took `took` seconds: toward
    BATCH_SECONDS a batch, growing at most twofold, within MIN_BATCH..base."""
    scaled = int(size * min(2.0, BATCH_SECONDS / max(took, 1e-3)))
    return max(min(MIN_BATCH, base), min(base, scaled))


async def rest(stop: asyncio.Event, seconds: float) -> None:
    """Sleep `seconds`, or less if `stop` is set meanwhile."""
    if seconds <= 0 or stop.is_set():
        return
    try:
        async with asyncio.timeout(seconds):
            await stop.wait()
    except TimeoutError:
        pass


async def _compact(store: Store, policy: Policy, report: Report, owner: str | None,
                   lock_ttl: float, progress: Progress | None, stop: asyncio.Event,
                   dry: Cutoffs | None) -> None:
    """Compact every long log to its last `keep_steps` checkpoints; `dry` (the prune's
    cut-offs): count what that would remove (runs the prune removes first aside) instead."""
    assert policy.keep_steps is not None
    ops, keep = store.retention, policy.keep_steps
    after = ""
    while not stop.is_set():
        ids = await ops.long_logs(keep, after, 100)
        if not ids:
            return
        after = ids[-1]
        for tid in ids:
            if stop.is_set():
                return
            run = await store.get_run(tid)
            if run is None or run.step <= keep:
                continue
            before = run.step - keep + 1  # the oldest step kept
            steps = [before]
            if policy.keep_interrupts:
                steps = sorted(set(await ops.interrupt_steps(tid, before)) | {before})
            if dry is not None:
                removed = await ops.compact_estimate(tid, before, steps[:-1], dry)
            else:
                snapshots: dict[int, bytes] = {}
                for s in steps:
                    state, _ = await load_state(store, run, upto=s)
                    snapshots[s] = serde.dumps(state, "state")
                removed = await ops.compact_log(tid, snapshots, before, steps[:-1])
            if removed:
                report.compacted_runs += 1
                report.compacted_rows += removed
        if progress is not None:
            progress(report)
        if owner is not None:
            await ops.take_lock(LOCK, owner, lock_ttl)


async def _give_back(store: Store, report: Report, owner: str, lock_ttl: float,
                     progress: Progress | None, stop: asyncio.Event) -> None:
    """Return the free pages to the file system in short writes, resting between them as
    between batches, so no write holds workers' commits up for long. What a killed (or
    stopped) pruner left free is given back by the next prune."""
    ops, pages = store.retention, RECLAIM_PAGES
    low, high = RECLAIM_RANGE
    while not stop.is_set():
        busy = await ops.running_now()
        pace = (BUSY_PACE if busy else PACE).get(store.dialect, 1.0)
        target = RECLAIM_SECONDS / (BUSY_BATCH.get(store.dialect, 1) if busy else 1)
        t0 = time.monotonic()
        space = await ops.reclaim(pages)
        if space is None:
            return
        took = time.monotonic() - t0
        report.freed_bytes += space.freed
        report.free_bytes = space.free
        report.vacuum_needed = not space.gives_back and space.free > 0
        if not space.freed or not space.free:
            return
        if progress is not None:
            progress(report)
        if not await ops.take_lock(LOCK, owner, lock_ttl):
            return
        # toward `target` seconds a write, growing at most twofold (a write's time is noisy)
        pages = max(low, min(high, int(pages * min(2.0, target / max(took, 1e-3)))))
        await rest(stop, took * pace)


def standing(policy: Policy | Mapping[str, Any] | None) -> Policy | None:
    """A Runtime(retention=...) argument as a Policy (a dict takes Policy.of's keywords)."""
    if policy is None or isinstance(policy, Policy):
        return policy
    if isinstance(policy, Mapping):
        return Policy.of(**policy)
    raise ConfigError(f"retention must be a tether Policy or a dict, got {type(policy).__name__}")


async def alongside(work: Awaitable[None], store: Store, policy: Policy | None,
                    lock_ttl: float) -> None:
    """Await `work` (a worker's run) with the standing `policy` applied beside it, every
    `policy.every` seconds, until the work ends (just the work without a periodic policy)."""
    if policy is None or policy.every is None:
        await work
        return
    halt = asyncio.Event()
    async with asyncio.TaskGroup() as tg:
        tg.create_task(prune_periodically(store, policy, lock_ttl, halt))
        try:
            await work
        finally:
            halt.set()


async def prune_periodically(store: Store, policy: Policy, lock_ttl: float,
                             stop: asyncio.Event) -> None:
    """A worker's standing policy: apply it every `policy.every` seconds until `stop`."""
    assert policy.every is not None
    while not stop.is_set():
        try:
            report = await prune(store, policy, lock_ttl=lock_ttl, stop=stop)
            if report.runs or report.compacted_rows:
                log.info("pruned %d runs (%d rows), compacted %d runs in %.1fs", report.runs,
                         report.rows, report.compacted_runs, report.seconds)
        except PrunerBusy:
            log.debug("another process is pruning; skipping this round")
        except Exception:  # a store outage must not stop the worker
            log.warning("prune failed; retrying next round", exc_info=True)
        try:
            async with asyncio.timeout(policy.every):
                await stop.wait()
        except TimeoutError:
            pass


async def known_agent(store: Store, agent: str | None, agents: Mapping[str, object]) -> None:
    """ConfigError for a prune of an agent that neither the runtime nor the store knows."""
    if agent is not None and agent not in agents and not await store.list_runs(
            agent=agent, limit=1):
        raise ConfigError(f"unknown agent {agent!r}: no run of it in the store and this "
                          f"runtime has {', '.join(agents) or 'no agents'}")


def prune_audit(actor: str | None, **policy: object) -> Audit | None:
    """The audit record of a prune (each batch of runs removed is one row, in its
    transaction): the policy as given, ages as written ("30d") or seconds."""
    audit = audit_of(actor, "prune", None, None)
    if audit is None:
        return None
    return Audit(audit.actor, audit.action, None, None,
                 {k: (v if v is None or isinstance(v, (int, float, str)) else str(v))
                  for k, v in policy.items()})
