"""How the Postgres store says a step's writes: the parameters of the step commits (one
statement: commit_step, commit_step_notify, commit_step_wake) and the transaction of a step
that carries mail, effects or groups (step_transaction). Which kind a step is, and whom it
wakes, is plan.py's to decide."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import orjson
from psycopg.rows import TupleRow

from ..errors import DuplicateEffectKey, EffectError, LeaseLost, RunNotFound
from .base import SLEEP_CALL, Lease, NewRun, Park, StepCommit
from .pg_conn import BEGIN, Conn, Params, TxBody
from .plan import StepWakes

_NEW_RUN_FIELDS: Final = tuple(NewRun.__dataclass_fields__)  # a child run's parameters


def step_params(commit: StepCommit) -> Params:
    lease = commit.lease
    return {
        "thread_id": lease.thread_id,
        "epoch": lease.epoch,
        "step": commit.step,
        "node": commit.node,
        "next_node": commit.next_node,
        "kind": commit.kind,
        "data": commit.data,
        "worker": lease.worker,
        "attempt": commit.attempt,
        "started_at": commit.started_at,
        "finished_at": commit.finished_at,
        "status": commit.status,
        "wake_at": commit.wake_at,
        "waiting_for": commit.waiting_for,
        "ttl": commit.lease_ttl,
    }


def park_params(lease: Lease, park: Park) -> Params:
    """park_run's parameters (the children it spawns included)."""
    waiting = park.kind != "sleep"
    params: Params = {
        "thread_id": lease.thread_id,
        "epoch": lease.epoch,
        "status": "waiting" if waiting else "sleeping",
        "waiting_for": park.kind if waiting else None,
        "seconds": None if waiting else park.seconds,
        "kind": park.kind,
        "step": park.step,
        "idx": park.idx,
        "interrupt_id": park.interrupt_id,
        "payload": park.payload,
        "sleep_name": SLEEP_CALL,
        "timer": None if waiting else orjson.dumps(park.seconds),
    }
    add_children(params, park.spawn)
    return params


def add_children(params: Params, children: Sequence[NewRun]) -> None:
    """The children as one array per field: commit_step_notify unnests them."""
    if not children:  # (most steps and parks: the same empty arrays, never changed)
        params.update(_NO_CHILDREN)
        return
    for name in _NEW_RUN_FIELDS:
        params["c_" + name] = [getattr(child, name) for child in children]


_NO_CHILDREN: Final[Params] = {"c_" + name: [] for name in _NEW_RUN_FIELDS}


def full_params(commit: StepCommit, wakes: StepWakes) -> Params:
    """commit_step_tx's parameters but the mail (sent_mail adds it, once the groups' members
    are known)."""
    params = step_params(commit)
    add_children(params, commit.children)
    roles = dict(commit.groups)  # the last role given for a group wins
    params["g_names"], params["g_roles"] = list(roles), list(roles.values())
    params["consumed"] = list(commit.consumed)
    effects = commit.effects
    params["e_keys"] = [e.key for e in effects]
    params["e_idxs"] = [e.idx for e in effects]
    params["e_names"] = [e.name for e in effects]
    params["e_payloads"] = [e.payload for e in effects]
    params["e_statuses"] = ["pending" if e.apply is None else "done" for e in effects]
    params["e_compensables"] = [e.compensable for e in effects]
    params["direct"] = list(wakes.direct)
    return params


def sent_mail(commit: StepCommit, wakes: StepWakes, params: Params,
              members: dict[str, list[str]]) -> Params:
    """Adds the step's mail to `params` (each group message to every member in `members`);
    the parameters of its wake_after_commit."""
    sent = [(rcpt, m.message) for m in commit.messages
            for rcpt in ([m.recipient] if m.recipient is not None
                         else members.get(m.group or "", []))]
    params["m_recipients"] = [rcpt for rcpt, _ in sent]
    params["m_messages"] = [message for _, message in sent]
    return {"recipients": sorted({rcpt for rcpt, _ in sent}),
            "thread_id": commit.lease.thread_id, "epoch": params["epoch"],
            "step": params["step"], "parent": wakes.terminal,
            "mail": wakes.mail_requeue, "notify": wakes.announce,
            "effects": wakes.dispatchers}


def full_outcome(commit: StepCommit, wakes: StepWakes, locked: dict[str, TupleRow],
                 taken: list[TupleRow], committed: bool) -> None:
    """Raises what kept a FULL step from committing (its transaction committed or not, the
    step wrote nothing then), from the rows lock_runs locked, the effect keys found taken and
    whether commit_step_tx wrote the step. The lease first: a worker that lost the race for
    this step to the run's new holder finds the effect keys that holder wrote; that is a lost
    lease, not a key used twice by the run's own code."""
    tid = commit.lease.thread_id
    own = locked.get(tid)
    lost = LeaseLost(f"run {tid!r}: lease lost; step {commit.step} not committed")
    if own is None or own[1] != commit.lease.epoch or own[2] != "running":
        raise lost
    if committed:
        return
    if taken:
        raise DuplicateEffectKey(
            f"run {tid!r}: effect key {taken[0][0]!r} was already used "
            "in this run; explicit effect keys must be unique within a run")
    if missing := [r for r in wakes.direct if r not in locked]:
        raise RunNotFound(f"run {tid!r} sent a message to unknown thread_id "
                          f"{missing[0]!r}")
    raise lost  # no check above explains it


def step_transaction(q: dict[str, bytes], commit: StepCommit, wakes: StepWakes
                     ) -> tuple[TxBody[None], bool]:
    """A FULL step (plan.py), with its checks and wake-ups `wakes`: one transaction that
    locks every run row it touches first (lock_runs), then writes (commit_step_tx), then
    wakes (wake_after_commit), in three statements and as few round trips. Unless a
    transactional effect must run in it, the COMMIT goes in the same pipeline: one round
    trip, so the locks on the rows of the run's recipients are held for one round trip,
    not two. That is safe because a step that must not commit (lease lost, an effect key
    used before, an unknown recipient) writes nothing: commit_step_tx and
    wake_after_commit check it on the server; the results read afterwards say which
    error to raise (full_outcome). (body, whether it commits). Many such steps of
    different runs share one transaction through pg_full.py."""
    tid = commit.lease.thread_id
    params = full_params(commit, wakes)
    effects = commit.effects
    applied = [e for e in effects if e.apply is not None]
    groups = list(wakes.groups)

    async def body(conn: Conn) -> None:
        members: dict[str, list[str]] = {}
        if groups:
            async with conn.pipeline():
                await conn.execute(BEGIN)
                cur = await conn.execute(q["group_recipients"],
                                         {"groups": groups, "thread_id": tid})
            for group, member in await cur.fetchall():
                members.setdefault(group, []).append(member)
        wake = sent_mail(commit, wakes, params, members)
        async with conn.pipeline():
            if not groups:
                await conn.execute(BEGIN)
            c_lock = await conn.execute(q["lock_runs"], {
                "ids": [tid, *wake["recipients"]], "thread_id": tid, "parent": wakes.terminal})
            c_taken = (await conn.execute(q["effect_keys_taken"], {
                "thread_id": tid, "keys": params["e_keys"]}) if effects else None)
            c_step = await conn.execute(q["commit_step_tx"], params)
            if not applied:
                await conn.execute(q["wake_after_commit"], wake)
                await conn.execute(b"COMMIT")
        locked = {r[0]: r for r in await c_lock.fetchall()}
        taken = await c_taken.fetchall() if c_taken is not None else []
        full_outcome(commit, wakes, locked, taken, c_step.rowcount >= 1)
        for e in applied:
            assert e.apply is not None
            try:
                await e.apply(conn, e.payload, e.key)
            except Exception as exc:
                raise EffectError(f"transactional effect {e.name!r} failed: {exc!r}") from exc
        if applied:
            await conn.execute(q["wake_after_commit"], wake)

    return body, not applied
