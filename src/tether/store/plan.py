"""What a step commit is, and whom it wakes: decided here, once, for every store.

A store only says each kind in its dialect (sqlite.py, postgres.py): which statements write
it, and how the wake-ups below reach the database and the process. The kinds, from the most
common:

    ADVANCE  the run goes on under the same lease and nothing else is written (the hot path)
    FINISH   the last step of a run known to have no parent, nothing else written: nobody
             to wake, and the finished record can be built from the claimed one
    MOVE     any other step that writes nothing else and wakes nobody (it parks in the
             commit, or goes on with a timer)
    RELEASE  the run is released (queued) or ends, nothing else written: it may wake
             workers and, ended, its parent
    SPAWN    the step spawns children (and may release or end the run), nothing else
    FULL     the step carries mail, effects, group memberships or consumed mail, or parks
             for mail: everything in one transaction that checks and wakes (StepWakes)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ..errors import DuplicateEffectKey
from .base import TERMINAL, StepCommit

ADVANCE: Final = "advance"
FINISH: Final = "finish"
MOVE: Final = "move"
RELEASE: Final = "release"
SPAWN: Final = "spawn"
FULL: Final = "full"


def step_kind(commit: StepCommit) -> str:
    """The kind of `commit` (one of the constants above; compare with `is`)."""
    if (commit.effects or commit.messages or commit.consumed or commit.groups
            or commit.waiting_for == "mail"):
        return FULL
    if commit.children:
        return SPAWN
    status = commit.status
    if status == "running" and commit.wake_at is None and commit.waiting_for is None:
        return ADVANCE
    if status == "completed" and (run := commit.run) is not None and run.parent_thread_id is None:
        return FINISH
    if status == "queued" or status in TERMINAL:
        return RELEASE
    return MOVE


def wakes_workers(kind: str) -> bool:
    """Whether this process's claimers should look for work after a commit of `kind` other
    than FULL (for FULL see StepWakes.workers): children were spawned, or the run was
    released, or it ended and its parent may be waiting for it. FINISH wakes nobody: the
    worker that drove the run looks for work once its task ends anyway."""
    return kind is RELEASE or kind is SPAWN


@dataclass(frozen=True, slots=True)
class StepWakes:
    """What a FULL step checks and whom it wakes, beyond the run itself."""

    terminal: bool
    """The run ends: its parent, if parked in join, re-checks its children, and the run's
    record as committed is the commit's result."""
    announce: bool
    """Something became claimable in other processes: children, mail recipients, or the run
    itself released."""
    workers: bool
    """This process's claimers should look for work (wakes_workers)."""
    dispatchers: bool
    """Effects were requested that a dispatcher performs (not transactional ones, done in the
    commit)."""
    mail_requeue: bool
    """The run parks for mail: it is queued again at once if mail already waits."""
    direct: tuple[str, ...]
    """The direct recipients, sorted, each once: each must be an existing run (RunNotFound)."""
    groups: tuple[str, ...]
    """The groups messaged, sorted, each once: every member but the sender gets the mail."""


def step_wakes(commit: StepCommit) -> StepWakes:
    """The checks and wake-ups of a FULL step. Raises DuplicateEffectKey if the step uses an
    effect key twice (a key used in an earlier step is the store's to find)."""
    effects = commit.effects
    if effects and len({e.key for e in effects}) < len(effects):
        raise DuplicateEffectKey(
            f"run {commit.lease.thread_id!r}: an effect key is used twice in step "
            f"{commit.step}; explicit effect keys must be unique within a run")
    status, messages = commit.status, commit.messages
    terminal = status in TERMINAL
    announce = bool(commit.children or messages) or status == "queued"
    return StepWakes(
        terminal=terminal,
        announce=announce,
        workers=announce or terminal,
        dispatchers=any(e.apply is None for e in effects),
        mail_requeue=commit.waiting_for == "mail",
        direct=tuple(sorted({m.recipient for m in messages if m.recipient is not None})),
        groups=tuple(sorted({m.group for m in messages
                             if m.recipient is None and m.group is not None})),
    )
