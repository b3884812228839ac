"""The records a step reads back (Store.load_checkpoints, load_journal, load_inbox), and the
three of them together for a claimed run (Store.load_claimed)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CheckpointRecord:
    thread_id: str
    step: int
    node: str
    next_node: str | None
    kind: str  # "s" snapshot | "d" delta
    data: bytes
    worker: str
    attempt: int
    started_at: float
    finished_at: float


CHECKPOINT_COLUMNS = tuple(CheckpointRecord.__dataclass_fields__)


@dataclass(frozen=True, slots=True)
class JournalRecord:
    idx: int
    name: str
    result: bytes
    args: str | None = None
    """What the call was given, as JSON text for people (tether.calls.args_preview)."""


@dataclass(frozen=True, slots=True)
class MessageRecord:
    id: int
    sender: str | None
    message: bytes
    created_at: float


@dataclass(frozen=True, slots=True)
class ClaimedReads:
    """What a claimed run's first step reads (Store.load_claimed): its checkpoints since the
    latest snapshot (none at step 0), the journal of the step it is about to run (none for a
    run that never ran) and its unconsumed mail, oldest first (at most INBOX_LIMIT)."""

    checkpoints: list[CheckpointRecord]
    journal: list[JournalRecord]
    inbox: list[MessageRecord]


INBOX_LIMIT = 1000
"""Messages a step reads at most (load_inbox's default limit)."""
