"""The value types users get back: Run, RunStatus, RunError, Checkpoint, Effect, Interrupt.

Plain frozen dataclasses with no behaviour beyond formatting: the bottom layer, imported by
the store, the engine, the runtime and the service alike. Building them from store records
is the runtime's job (runtime.py), so this module knows nothing of storage.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

TERMINAL = frozenset({"completed", "failed", "cancelled"})
"""The statuses a run never leaves (as plain strings, the way the store holds them)."""


class RunStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    SLEEPING = "sleeping"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value

    @property
    def terminal(self) -> bool:
        return self.value in TERMINAL


@dataclass(frozen=True, slots=True)
class RunError:
    """Why a run failed: a category (see retry.FailureCategory), the exception and traceback."""

    category: str
    type: str
    message: str
    traceback: str
    node: str | None = None
    """The node whose step raised (None for errors recorded before round 3)."""

    def __str__(self) -> str:
        return f"[{self.category}] {self.type}: {self.message}"


@dataclass(frozen=True, slots=True)
class Run:
    thread_id: str
    agent: str
    status: RunStatus
    state: dict[str, Any]
    step: int
    version: str
    node: str | None
    attempt: int
    error: RunError | None
    created_at: float
    updated_at: float
    idempotency_key: str | None = None
    parent_thread_id: str | None = None
    forked_from: str | None = None
    forked_step: int | None = None
    lease_owner: str | None = None
    wake_at: float | None = None
    waiting_for: str | None = None
    inbox_depth: int | None = None
    """Unconsumed messages (filled in by runtime.get)."""
    usage: dict[str, int] | None = None
    """LLM token usage summed over the run's journaled calls ({"input_tokens",
    "output_tokens", ...}; each call counted once, however often its step re-ran); filled in
    by runtime.get, {} when no call reported any."""
    created: bool = False
    """True on the Run that runtime.start returned when that call created the run (False when
    it found the run already there: the same idempotency key or thread_id and input)."""

    @property
    def failed_node(self) -> str | None:
        """The node whose step failed: None unless the run failed."""
        if self.status is not RunStatus.FAILED or self.error is None:
            return None
        return self.error.node

    @property
    def actor_state(self) -> str | None:
        """The actor state of a run that has mail or parks for it: "idle" (parked, no worker
        held) or "processing" (mail delivered, being claimed or processed). "response" is the
        moment its replies commit: an event of `runtime.subscribe`, not a lasting state."""
        if self.waiting_for == "mail":
            return "idle"
        if self.status in (RunStatus.RUNNING, RunStatus.QUEUED) and self.inbox_depth:
            return "processing"
        return None

    def to_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        del out["created"]  # a fact about one start() call, not about the run
        out["status"] = self.status.value
        out["actor_state"] = self.actor_state
        out["failed_node"] = self.failed_node
        out["error"] = None if self.error is None else {
            "category": self.error.category, "type": self.error.type,
            "message": self.error.message, "traceback": self.error.traceback,
            "node": self.error.node,
        }
        return out


@dataclass(frozen=True, slots=True)
class Checkpoint:
    thread_id: str
    step: int
    node: str
    next_node: str | None
    state: dict[str, Any]
    kind: str
    worker: str
    attempt: int
    started_at: float
    finished_at: float

    @property
    def duration(self) -> float:
        return self.finished_at - self.started_at

    def to_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["duration"] = self.duration
        return out


@dataclass(frozen=True, slots=True)
class Effect:
    """One outbox row: a side effect requested by a step (or a compensation)."""

    thread_id: str
    key: str
    name: str
    step: int
    payload: Any
    status: str
    attempts: int
    result: Any
    error: str | None
    compensates: str | None
    created_at: float
    done_at: float | None

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True, slots=True)
class Call:
    """One result a step journaled (ctx.call, and the engine's own timers and values): its
    index in the step, the function's name and the recorded result, as a re-execution of
    the step would replay it; and what the call was given (`args`: {"args": [...],
    "kwargs": {...}} as JSON values, secrets masked, values JSON cannot carry as their repr;
    None for a call with no arguments, the engine's own values, or one journaled before
    tether kept arguments; a string when the preview was cut at 4,000 characters)."""

    thread_id: str
    step: int
    index: int
    name: str
    result: Any
    args: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True, slots=True)
class SentMessage:
    """A message a run's step sent (ctx.send, or to a group: one per recipient): to whom,
    when, and the recipient's step that read it (`consumed_step`; None: not read yet)."""

    id: int
    sender: str
    recipient: str
    body: Any
    created_at: float
    consumed_step: int | None

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True, slots=True)
class Interrupt:
    """A question a run asked a person (ctx.interrupt) and, once answered, the answer."""

    id: str
    thread_id: str
    step: int
    payload: Any
    status: str
    value: Any
    created_at: float
    resolved_at: float | None

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """An operator action, as the audit log recorded it (in the action's own transaction):
    who (`actor`: the token's name over HTTP, the OS user on the CLI), when (`at`, database
    clock), what (`action`, the run `thread_id` it concerns, its `target`), and `details`."""

    id: int
    at: float
    actor: str
    action: str
    thread_id: str | None
    target: str | None
    details: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "at": self.at, "actor": self.actor, "action": self.action,
                "thread_id": self.thread_id, "target": self.target, "details": self.details}
