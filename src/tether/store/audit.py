"""The audit record an operator action passes to the store (written in the action's own
transaction), and the row read back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from ..errors import DefinitionError

AUDIT_ACTIONS = ("start", "resume", "cancel", "fork", "send", "retry", "release", "route",
                 "drain", "retire", "upgrade", "effect.retry", "prune")
"""Operator actions the audit log records (DESIGN's list, and the runs' retry and release)."""


@dataclass(frozen=True, slots=True)
class Audit:
    """An operator action to record with the action itself. A Store method taking `audit=`
    writes the row in the action's own transaction, only when the action happened (a refused
    or failed action leaves none). `actor`: the token's name over HTTP, the OS user on the
    CLI; `thread_id`: the run acted on (None for deployment actions); `target`: what was acted
    on (a thread_id, a version, an effect key); `details`: a JSON object."""

    actor: str
    action: str
    thread_id: str | None = None
    target: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def counted(self, runs: int) -> Audit:
        """This record with `runs` (how many the action's transaction changed) in details."""
        return Audit(self.actor, self.action, self.thread_id, self.target,
                     {**self.details, "runs": runs})

    def params(self) -> dict[str, Any]:
        """The insert_audit query's parameters."""
        return {"actor": self.actor, "action": self.action, "thread_id": self.thread_id,
                "target": self.target, "details": orjson.dumps(self.details).decode()}

    def prefixed(self) -> dict[str, Any]:
        """params() named as the *_audited statements take them, beside the action's own
        (audit_actor, audit_action, ...)."""
        return {f"audit_{k}": v for k, v in self.params().items()}


def audit_of(actor: str | None, action: str, thread_id: str | None, target: str | None,
             details: dict[str, Any] | None = None) -> Audit | None:
    """The audit record of an operator action, when an actor is named (DefinitionError for
    an actor that is not a non-empty string of at most 200 characters)."""
    if actor is None:
        return None
    if not isinstance(actor, str) or not actor or len(actor) > 200 or "\x00" in actor:
        raise DefinitionError("actor must be a non-empty string of at most 200 characters")
    return Audit(actor, action, thread_id, target, details or {})


def check_audit_query(action: str | None, limit: int) -> None:
    """DefinitionError for an audit query by an unknown action or with a limit out of range."""
    if action is not None and action not in AUDIT_ACTIONS:
        raise DefinitionError(f"unknown audit action {action!r}; one of: "
                              f"{', '.join(AUDIT_ACTIONS)}")
    if not isinstance(limit, int) or not 1 <= limit <= 10_000:
        raise DefinitionError(f"limit must be within 1..10000, got {limit!r}")


@dataclass(frozen=True, slots=True)
class AuditRecord:
    id: int
    at: float
    actor: str
    action: str
    thread_id: str | None
    target: str | None
    details: str  # JSON
