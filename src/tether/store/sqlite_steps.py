"""How the SQLite store says a step's writes that are not the hot path's fenced ones (plan.py
decides the kind and the wake-ups): one job, run in the step's transaction."""

from __future__ import annotations

import sqlite3
from typing import Any, Final

import orjson

from ..errors import DuplicateEffectKey, EffectError, RunNotFound
from .base import RUN_COLUMNS, StepCommit
from .plan import StepWakes
from .rows import new_run_params

_PARENT: Final = RUN_COLUMNS.index("parent_thread_id")


def step_job(q: dict[str, str], commit: StepCommit, cp: tuple[Any, ...], wakes: StepWakes
             ) -> Any:
    """The job writing `commit` (its checkpoint row `cp`): it returns the run's row as
    committed, or None if the lease was lost (nothing written)."""
    lease = commit.lease
    run_params = {
        "thread_id": lease.thread_id,
        "epoch": lease.epoch,
        "step": commit.step,
        "next_node": commit.next_node,
        "status": commit.status,
        "wake_at": commit.wake_at,
        "waiting_for": commit.waiting_for,
    }
    effects = commit.effects
    # A run that stays running keeps its status: the statement that does not set it (no
    # trigger on status runs).
    commit_run = q["commit_run_on" if commit.status == "running" else "commit_run"]

    def job(conn: sqlite3.Connection) -> tuple[Any, ...] | None:
        # The fence first: a commit that lost the race for this step finds the effect keys
        # the run's new holder wrote, and that is a lost lease, not a key used twice.
        rows = conn.execute(commit_run, run_params).fetchall()
        if not rows:
            return None
        if effects:
            keys = orjson.dumps([e.key for e in effects]).decode()
            taken = conn.execute(q["effect_keys_taken"],
                                 {"thread_id": lease.thread_id, "keys": keys}).fetchall()
            if taken:
                raise DuplicateEffectKey(
                    f"run {lease.thread_id!r}: effect key {taken[0][0]!r} was already used "
                    "in this run; explicit effect keys must be unique within a run")
        conn.execute(q["insert_checkpoint"], cp)
        _write_extras(q, conn, commit, wakes, rows[0][_PARENT] is not None)
        return tuple(rows[0])

    return job


def _write_extras(q: dict[str, str], conn: sqlite3.Connection, commit: StepCommit,
                  wakes: StepWakes, has_parent: bool) -> None:
    """The rarer parts of a step's transaction: children, messages, group membership,
    consumed mail, effects, and waking the parent (if any) that waits on this run."""
    tid, step = commit.lease.thread_id, commit.step
    for child in commit.children:
        conn.execute(q["insert_run"], new_run_params(child)).fetchall()
    for group, role in commit.groups:
        conn.execute(q["join_group"], {"group_name": group, "thread_id": tid, "role": role})
    if commit.consumed:
        conn.execute(q["consume_messages"], {"thread_id": tid, "step": step,
                                             "ids": orjson.dumps(list(commit.consumed)).decode()})
    if wakes.direct:
        found = {r[0] for r in conn.execute(
            q["runs_exist"], {"ids": orjson.dumps(wakes.direct).decode()}).fetchall()}
        if missing := [r for r in wakes.direct if r not in found]:
            raise RunNotFound(f"run {tid!r} sent a message to unknown thread_id "
                              f"{missing[0]!r}")
    for m in commit.messages:
        recipients = [m.recipient] if m.recipient is not None else [
            r[0] for r in conn.execute(q["group_members"], {"group_name": m.group})
            if r[0] != tid]
        for rcpt in recipients:
            conn.execute(q["insert_message"],
                         {"thread_id": rcpt, "sender": tid, "message": m.message})
            conn.execute(q["wake_for_mail"], {"thread_id": rcpt})
    for e in commit.effects:
        conn.execute(q["insert_effect"], {
            "thread_id": tid, "key": e.key, "step": step, "idx": e.idx, "name": e.name,
            "payload": e.payload, "status": "pending" if e.apply is None else "done",
            "compensable": e.compensable})
        if e.apply is not None:
            try:
                e.apply(conn, e.payload, e.key)
            except Exception as exc:
                raise EffectError(f"transactional effect {e.name!r} failed: {exc!r}") from exc
    if wakes.mail_requeue:
        conn.execute(q["requeue_if_mail"], {"thread_id": tid})
    if wakes.terminal and has_parent:
        conn.execute(q["wake_parent"], {"thread_id": tid})
