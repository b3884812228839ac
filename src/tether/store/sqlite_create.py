"""A SQLite start's common case as one fenced write (sqlite_io.Fenced): a run without
idempotency key, queued for any worker or created leased to a worker of the starting process,
with its audit row if the start is audited (every POST /runs). Batched with the other starts
of its group commit into one set-based statement on the commit thread (not one INSERT ...
RETURNING each on the loop thread), its record built here (the clock is this machine's either
way). A thread_id that exists already is left to `fallback` (insert_run's transaction, which
decides what it means, and writes the audit row if it does create the run)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Mapping

from .audit import Audit
from .base import NewRun, RunRecord
from .sqlite_io import Fenced

FRESH_WRITES = ("insert_fresh_run", "insert_queued_run", "insert_audit_row")
"""The statements of fresh_insert, each with its set-based form (name + "_set")."""


_JULIAN_EPOCH_MS = 210866760000000
"""The Unix epoch in SQLite's julian-day milliseconds."""


def sqlite_now(unix: float) -> float:
    """What `(julianday('now') - 2440587.5) * 86400.0` gives at the Unix time `unix`: SQLite's
    clock has millisecond steps, so a queued run's created_at written from Python's clock
    could be up to 1 ms past the claim's `now` run just after it (and not be due yet)."""
    return ((int(unix * 1000 - 0.01) + _JULIAN_EPOCH_MS) / 86400000.0 - 2440587.5) * 86400.0


def fresh_insert(q: Mapping[str, str], new: NewRun, lease: tuple[str, float] | None,
                 fallback: Callable[[sqlite3.Connection], tuple[RunRecord, bool]],
                 audit: Audit | None = None) -> Fenced | None:
    """The write that creates `new` (result: (its record, True)) and, given `audit`, its
    audit row; None when it has an idempotency key (insert_run's job then looks the key up
    first)."""
    if new.idempotency_key is not None:
        return None
    then_sql: str | None = None
    then_params: tuple[object, ...] = ()
    if audit is not None:
        a = audit.params()
        then_sql = q["insert_audit_row"]
        then_params = (a["actor"], a["action"], a["thread_id"], a["target"], a["details"])
    now = time.time()
    if lease is None:
        now = sqlite_now(now)
        run = RunRecord(
            new.thread_id, new.agent, new.version, "queued", new.node, 0, 0, 0, new.input,
            new.input_hash, None, None, None, 0, None, None, None, new.parent_thread_id,
            new.forked_from, new.forked_step, now, now, new.trace_context)
        return Fenced(
            q["insert_queued_run"],
            (new.thread_id, new.agent, new.version, new.node, new.input, new.input_hash,
             new.parent_thread_id, new.forked_from, new.forked_step, now, new.trace_context),
            "", then_sql, then_params, result=(run, True), fallback=fallback)
    run = RunRecord(
        new.thread_id, new.agent, new.version, "running", new.node, 0, 1, 0, new.input,
        new.input_hash, None, lease[0], now + lease[1], 1, None, None, None,
        new.parent_thread_id, new.forked_from, new.forked_step, now, now, new.trace_context)
    return Fenced(
        q["insert_fresh_run"],
        (new.thread_id, new.agent, new.version, new.node, new.input, new.input_hash,
         new.parent_thread_id, new.forked_from, new.forked_step, lease[0],
         run.lease_expires_at, now, new.trace_context),
        "", then_sql, then_params, result=(run, True), fallback=fallback)
