"""The Store protocol: the only persistence boundary.

Each method is one operation with a short contract. Every write to a leased run carries the
lease's fencing epoch and checks it in the same statement; a stale epoch writes nothing and
raises LeaseLost. Times are seconds since the Unix epoch on the database clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

TERMINAL = frozenset({"completed", "failed", "cancelled"})


@dataclass(frozen=True, slots=True)
class RunRecord:
    thread_id: str
    agent: str
    version: str
    status: str
    node: str | None
    step: int
    attempt: int
    failures: int
    input: bytes
    input_hash: str
    idempotency_key: str | None
    lease_owner: str | None
    lease_expires_at: float | None
    epoch: int
    wake_at: float | None
    waiting_for: str | None
    error: bytes | None
    parent_thread_id: str | None
    forked_from: str | None
    forked_step: int | None
    created_at: float
    updated_at: float


RUN_COLUMNS = tuple(RunRecord.__dataclass_fields__)


@dataclass(frozen=True, slots=True)
class NewRun:
    thread_id: str
    agent: str
    version: str
    node: str
    input: bytes
    input_hash: str
    idempotency_key: str | None = None
    parent_thread_id: str | None = None
    forked_from: str | None = None
    forked_step: int | None = None


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


@dataclass(frozen=True, slots=True)
class InterruptRecord:
    thread_id: str
    step: int
    idx: int
    id: str
    payload: bytes
    value: bytes | None
    status: str  # pending | resolved
    created_at: float
    resolved_at: float | None


@dataclass(frozen=True, slots=True)
class Park:
    """A step that stopped before finishing: the run waits for input or sleeps.

    kind "interrupt": status waiting; a pending interrupt (id, payload) is recorded at
    (step, idx). kind "sleep": status sleeping until now + seconds; the timer is journaled at
    (step, idx) so the re-executed node passes it."""

    kind: str
    step: int
    idx: int
    interrupt_id: str | None = None
    payload: bytes | None = None
    seconds: float | None = None


INTERRUPT_CALL = "tether.interrupt"
SLEEP_CALL = "tether.sleep"


@dataclass(frozen=True, slots=True)
class Lease:
    """Proof of a claim: writes succeed only while `epoch` is still the run's epoch."""

    thread_id: str
    worker: str
    epoch: int


@dataclass(frozen=True, slots=True)
class StepCommit:
    """Everything one super-step commits atomically.

    status: the run's status after the step: "running" (the worker keeps the lease and goes
    on), "queued" (released), "completed", "waiting", "sleeping".
    """

    lease: Lease
    step: int
    node: str
    next_node: str | None
    kind: str
    data: bytes
    attempt: int
    started_at: float
    finished_at: float
    status: str
    wake_at: float | None = None
    waiting_for: str | None = None
    children: Sequence[NewRun] = field(default_factory=tuple)


class Store(Protocol):
    """Async persistence for runs, checkpoints, journal, leases (and later outbox, mail)."""

    url: str
    dialect: str
    work_available: asyncio.Event
    """Set when this process learns a run may have become claimable (local write or a
    database notification); workers also poll, so a missed wake-up only costs latency."""

    async def open(self, *, check_schema: bool = True) -> None:
        """Connect. Raises StoreUnavailable, or SchemaError if the schema is behind."""

    async def close(self) -> None:
        """Release connections and threads; idempotent."""

    async def migrate(self) -> list[int]:
        """Apply pending numbered migrations (serialized across processes); returns them."""

    async def schema_version(self) -> tuple[int, int]:
        """(version applied, latest version shipped)."""

    async def now(self) -> float:
        """The database clock."""

    async def create_run(self, new: NewRun) -> tuple[RunRecord, bool]:
        """Insert a queued run, or return the existing one (created=False) when the same
        idempotency key or the same thread_id with the same agent and input exists. A
        thread_id or key that exists with another agent or input raises RunConflict."""

    async def get_run(self, thread_id: str) -> RunRecord | None: ...

    async def list_runs(
        self,
        *,
        status: str | None = None,
        agent: str | None = None,
        limit: int = 100,
        before: tuple[float, str] | None = None,
    ) -> list[RunRecord]:
        """Newest first; `before` is the (created_at, thread_id) cursor of the last row seen."""

    async def claim_runs(
        self, worker: str, version: str, agents: Sequence[str], limit: int, lease_ttl: float
    ) -> list[RunRecord]:
        """Atomically lease up to `limit` claimable runs of this version and these agents:
        queued or sleeping ones whose wake_at has passed, and running ones whose lease
        expired. Each claim bumps the epoch and the attempt; no run is returned to two
        callers for the same epoch."""

    async def renew_leases(self, worker: str, lease_ttl: float) -> set[str]:
        """Extend every lease `worker` holds, in one statement; returns the thread_ids held."""

    async def release_runs(self, leases: Sequence[Lease]) -> None:
        """Give leased runs back (status queued, lease cleared) so any worker resumes them."""

    async def record_call(self, lease: Lease, step: int, idx: int, name: str, result: bytes) -> None:
        """Durably journal one call result. Raises LeaseLost if the epoch moved."""

    async def load_journal(self, thread_id: str, step: int) -> list[JournalRecord]: ...

    async def commit_step(self, commit: StepCommit) -> None:
        """Append the checkpoint and move the run, atomically, fenced by the lease epoch.
        Raises LeaseLost (and writes nothing) if the epoch moved."""

    async def fail_step(
        self,
        lease: Lease,
        *,
        failures: int,
        wake_at: float | None,
        error: bytes | None,
        final: bool,
    ) -> None:
        """Record a failed attempt: `final` -> status failed with `error`; otherwise the run is
        released as queued, claimable from `wake_at`. Fenced; raises LeaseLost."""

    async def park_run(self, lease: Lease, park: Park) -> None:
        """Release a running run as waiting (interrupt) or sleeping (timer), recording the
        interrupt or the journaled timer in the same transaction. Fenced; raises LeaseLost."""

    async def resume_interrupt(
        self, thread_id: str, value: bytes, interrupt_id: str | None = None
    ) -> InterruptRecord | None:
        """Answer the run's pending interrupt (or the one with `interrupt_id`) exactly once:
        the value is journaled for the re-executed node and the run becomes queued, in one
        transaction. None when there is no such pending interrupt (already answered, or the
        run is not waiting)."""

    async def get_interrupt(self, interrupt_id: str) -> InterruptRecord | None: ...

    async def list_interrupts(
        self, *, thread_id: str | None = None, status: str | None = "pending", limit: int = 100
    ) -> list[InterruptRecord]:
        """Interrupts oldest first (the inbox a person answers)."""

    async def cancel_run(self, thread_id: str) -> RunRecord | None:
        """Cancel a non-terminal run at once, bumping the epoch so its holder commits
        nothing more. Returns the run as it is now (terminal runs unchanged)."""

    async def load_checkpoints(
        self, thread_id: str, upto: int | None = None
    ) -> list[CheckpointRecord]:
        """The latest snapshot at or before `upto` (default: the last step) and every delta
        after it up to `upto`; what a replay of the state needs."""

    async def checkpoints(self, thread_id: str) -> list[CheckpointRecord]:
        """Every checkpoint row of the run, by step."""
