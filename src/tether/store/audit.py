"""The audit record an operator action passes to the store (written in the action's own
transaction), and the row read back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

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


@dataclass(frozen=True, slots=True)
class AuditRecord:
    id: int
    at: float
    actor: str
    action: str
    thread_id: str | None
    target: str | None
    details: str  # JSON
