"""The Store protocol: the only persistence boundary.

Each method is one operation with a short contract. Every write to a leased run carries the
lease's fencing epoch and checks it in the same statement; a stale epoch writes nothing and
raises LeaseLost. Times are seconds since the Unix epoch on the database clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .audit import AUDIT_ACTIONS as AUDIT_ACTIONS
from .audit import Audit as Audit
from .audit import AuditRecord as AuditRecord
from .deploy_types import DeploymentRecord as DeploymentRecord
from .deploy_types import OpenRuns as OpenRuns
from .deploy_types import WorkerBeat as WorkerBeat
from .deploy_types import WorkerRecord as WorkerRecord
from .measure import LoadStats
from .retention_types import Retention
from .session_types import UiSessions
from .step_types import CHECKPOINT_COLUMNS as CHECKPOINT_COLUMNS
from .step_types import INBOX_LIMIT as INBOX_LIMIT
from .step_types import CheckpointRecord as CheckpointRecord
from .step_types import ClaimedReads as ClaimedReads
from .step_types import JournalRecord as JournalRecord
from .step_types import MessageRecord as MessageRecord

TERMINAL = frozenset({"completed", "failed", "cancelled"})


@dataclass(slots=True)  # not frozen: built for every run created or claimed (frozen __init__
# took 1.8 us, plain 0.25); treat as read-only
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
    trace_context: str | None = None
    """The W3C traceparent of the run's trace anchor, if one was stored (tether.observe)."""
    taken_from: str | None = field(default=None, compare=False)
    """Set by claim_runs only (not a column): the worker whose expired lease this claim took
    over, None for a run that was due (queued, or sleeping and awake)."""


RUN_COLUMNS = tuple(f for f in RunRecord.__dataclass_fields__ if f != "taken_from")


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
    trace_context: str | None = None


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

    kind: str  # interrupt | sleep | join
    step: int
    idx: int
    interrupt_id: str | None = None
    payload: bytes | None = None
    seconds: float | None = None
    children: Sequence[str] = ()
    spawn: Sequence[NewRun] = ()


@dataclass(frozen=True, slots=True)
class OutMessage:
    """A message a step sends: to one run (`recipient`) or to every member of `group`."""

    message: bytes
    recipient: str | None = None
    group: str | None = None


def never_ran(run: RunRecord) -> bool:
    """Epoch 1 at step 0, from a claim: the run was never leased before, so it never ran and
    has no journal (every journal row is written by an execution, or by a resume of a run
    that parked in one)."""
    return run.step == 0 and run.epoch == 1


@dataclass(frozen=True, slots=True)
class SentRecord:  # a message a run sent; consumed_step: the recipient's step that read it
    id: int
    recipient: str
    message: bytes
    created_at: float
    consumed_step: int | None


INTERRUPT_CALL = "tether.interrupt"
JOIN_CALL = "tether.join"
SLEEP_CALL = "tether.sleep"


@dataclass(frozen=True, slots=True)
class Lease:
    """Proof of a claim: writes succeed only while `epoch` is still the run's epoch."""

    thread_id: str
    worker: str
    epoch: int


@dataclass(frozen=True, slots=True)
class EffectRow:
    """An effect requested by a step, written with its checkpoint (status "pending"), or
    already performed inside the checkpoint's transaction (transactional: status "done")."""

    key: str
    idx: int
    name: str
    payload: bytes
    apply: Callable[[Any, bytes, str], Any] | None = None
    """Transactional effects only: called as apply(connection, payload, key) inside the
    step's transaction (sync on SQLite, async on Postgres)."""
    compensable: bool = False
    """Its handler has a compensate: a failure or cancel, from any process, undoes it."""


@dataclass(frozen=True, slots=True)
class EffectRecord:
    thread_id: str
    key: str
    step: int
    idx: int
    name: str
    payload: bytes
    status: str  # pending | running | done | dead
    attempts: int
    epoch: int
    next_attempt_at: float
    result: bytes | None
    error: str | None
    compensates: str | None
    created_at: float
    done_at: float | None


PARKED = ("queued", "waiting", "sleeping")
"""The statuses of a run no worker holds: upgrade may move it to another version."""


COMPENSATION_STEP = 2_000_000_000
"""Compensations sort after every effect of their run (see add_compensations)."""


@dataclass(slots=True)  # not frozen: one is built per step, and frozen __init__ is slower
class StepCommit:
    """Everything one super-step commits atomically (treat as read-only).

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
    effects: Sequence[EffectRow] = field(default_factory=tuple)
    messages: Sequence[OutMessage] = field(default_factory=tuple)
    consumed: Sequence[int] = field(default_factory=tuple)
    """Ids of the inbox messages this step consumed (each consumed by one committed step)."""
    groups: Sequence[tuple[str, str]] = field(default_factory=tuple)
    """(group, role) memberships this run takes (role member | admin)."""
    run: RunRecord | None = None
    """The run as this worker claimed it, if known: a store may build the finished run's
    record from it instead of reading the row back."""
    lease_ttl: float | None = None
    """The worker's lease TTL: a store may extend the lease the commit proves (status
    "running") to its now + lease_ttl."""


@dataclass(frozen=True, slots=True)
class StatusCounts:
    """Store-wide counts: runs by (status, version), effects not done by status. Read with a
    cap, a count that stopped there is a lower bound: its key is in `runs_more` or
    `effects_more` (shown "10,000+")."""

    runs: dict[tuple[str, str], int]
    effects: dict[str, int]
    runs_more: frozenset[tuple[str, str]] = frozenset()
    effects_more: frozenset[str] = frozenset()

    @classmethod
    def from_rows(cls, rows: Sequence[tuple[str, str, str, int]]) -> StatusCounts:
        """Rows of (kind, status, version, n): kind 'run' or 'effect', with a '+' when n is
        a lower bound."""
        runs = {(status, version): int(n) for kind, status, version, n in rows
                if kind.startswith("run")}
        effects = {status: int(n) for kind, status, _, n in rows if kind.startswith("effect")}
        return cls(runs, effects,
                   frozenset((s, v) for kind, s, v, _ in rows if kind == "run+"),
                   frozenset(s for kind, s, _, _ in rows if kind == "effect+"))


class CommitObserver(Protocol):
    """Told of each group commit a store makes (tether.observe's metrics, attached with
    `Store.observe_commits`): `writes` in one transaction, `seconds` from its BEGIN to its
    COMMIT's return. Called on the event loop; must not block."""

    def committed(self, writes: int, seconds: float) -> None: ...


class Deployments(Protocol):
    """The worker registry and the weight table: what rainbow deploys store (tether.deploy
    holds the logic). Each write is one transaction, and an audit row given joins it."""

    async def beat_worker(self, beat: WorkerBeat) -> None:
        """Register or renew the worker's row (last_seen = now, stopped_at cleared), and drop
        rows of workers gone for more than a day; one statement per heartbeat, apart from
        renew_leases."""

    async def stop_worker(self, worker_id: str) -> None:
        """A clean stop: the row gets stopped_at = last_seen = now (it no longer serves)."""

    async def list_workers(self) -> list[WorkerRecord]:
        """Every registry row (stopped and dead ones included), by version then id."""

    async def list_deployments(self) -> list[DeploymentRecord]:
        """The weight table, by version."""

    async def set_weights(self, weights: Sequence[tuple[str, int]], *, replace: bool,
                          audit: Audit | None = None) -> None:
        """Set these versions' weights; `replace`: every version not named gets weight 0.
        One transaction (with the audit row, if given)."""

    async def open_runs(self, cap: int | None = None) -> list[OpenRuns]:
        """Open runs (queued, running, waiting, sleeping) counted by version and status;
        with `cap`, each count stops at cap + 1 (an index range read that far)."""

    async def stranded_runs(self, version: str, before: float, cap: int | None = None) -> int:
        """Open runs of `version` last updated before `before` (at most cap + 1)."""

    async def retire_version(self, version: str, limit: int = 20,
                             audit: Audit | None = None) -> list[str]:
        """In one transaction: if `version` has open runs, return up to `limit` of their
        thread_ids (oldest first) and change nothing; else mark it retired (weight 0), write
        the audit row if given, and return []."""

    async def move_runs(
        self,
        from_version: str,
        to_version: str,
        thread_ids: Sequence[str] | None,
        decide: Callable[[list[RunRecord]], Sequence[str]],
        audit: Audit | None = None,
    ) -> list[RunRecord]:
        """Upgrade, atomically: lock the candidate runs (those named, else every parked run of
        `from_version`), hand them to `decide`, which returns the thread_ids to move (or
        raises to change nothing), and set those runs' version to `to_version` if each is
        still parked on `from_version` (else nothing moves: InvalidState). Moved runs keep
        their status; queued and due ones are announced to `to_version`'s workers; the audit
        row (if given, with `runs`: how many moved) is written with the move. Returns the
        candidates as locked (before the move)."""


class Store(Protocol):
    """Async persistence for runs, checkpoints, journal, leases (and later outbox, mail)."""

    url: str
    dialect: str
    work_available: asyncio.Event
    """Set when this process learns a run may have become claimable (a local write, a
    database notification, or on SQLite another connection's commit that made a run due for
    a worker claiming through this store); workers also poll, so a missed wake-up only costs
    latency."""

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

    async def create_run(
        self, new: NewRun, lease: tuple[str, float] | None = None, audit: Audit | None = None
    ) -> tuple[RunRecord, bool]:
        """Insert a queued run, or return the existing one (created=False) when the same
        idempotency key or the same thread_id with the same agent and input exists. A
        thread_id or key that exists with another agent or input raises RunConflict.
        With `lease` (worker, ttl): a new run is inserted running, leased to that worker at
        epoch 1 as if it had claimed it (a worker in the starting process takes it at once);
        nobody else is woken for it."""

    async def get_run(self, thread_id: str) -> RunRecord | None: ...

    async def run_statuses(self, thread_ids: Sequence[str]) -> dict[str, str]:
        """Status of each existing run among `thread_ids`, in one query."""

    async def list_runs(
        self,
        *,
        status: str | None = None,
        agent: str | None = None,
        limit: int = 100,
        before: tuple[float, str] | None = None,
        version: str | None = None,
        parent: str | None = None,
        since: float | None = None,
        until: float | None = None,
        prefix: str | None = None,
        order: str = "newest",
    ) -> list[RunRecord]:
        """Runs in `order` (newest, oldest: by created_at; updated: by updated_at, latest
        first), filtered by status, agent, version, parent run, created_at in [since, until)
        and thread_id prefix; `before` is the cursor of the last row seen, in the order's key
        ((created_at or updated_at, thread_id)). See store/listing.py."""

    async def claim_runs(
        self, worker: str, version: str, agents: Sequence[str], limit: int, lease_ttl: float
    ) -> list[RunRecord]:
        """Atomically lease up to `limit` claimable runs of this version and these agents:
        queued or sleeping ones whose wake_at has passed, and running ones whose lease
        expired. Each claim bumps the epoch and the attempt; no run is returned to two
        callers for the same epoch. A run whose expired lease was taken over has
        `taken_from` set to the worker that held it."""

    async def renew_leases(self, worker: str, lease_ttl: float,
                           only: Sequence[str] | None = None) -> set[str]:
        """Extend every lease `worker` holds (of the runs `only` names, if given: those it
        drives, so that a run it no longer drives expires and is taken over: one a failover
        to an asynchronous standby gave back to it, say), in one statement; returns the
        thread_ids held."""

    async def release_runs(self, leases: Sequence[Lease]) -> None:
        """Give leased runs back (status queued, lease cleared) so any worker resumes them."""

    async def release_worker(self, worker: str, audit: Audit | None = None) -> list[str]:
        """An operator's release of everything `worker` leases, whatever its expiry: its
        running runs become queued and its running effects pending, each epoch bumped (a
        worker still alive commits nothing more for them). Returns the runs released."""

    async def retry_run(self, thread_id: str, node: str, audit: Audit | None = None
                        ) -> RunRecord | None:
        """Move a failed run back to queued at `node` (its failed step), error and failure
        count cleared, attempt count kept. None (nothing written) if the run is not failed."""

    def record_call(
        self, lease: Lease, step: int, idx: int, name: str, result: bytes,
        args: str | None = None,
    ) -> Awaitable[None]:
        """Durably journal one call result (and `args`, what the call was given, for people).
        Raises LeaseLost if the epoch moved. (An awaitable, so a store may return its group
        commit's future without a coroutine around it.)"""

    async def load_journal(self, thread_id: str, step: int) -> list[JournalRecord]: ...

    async def journal_usage(self, thread_id: str, prefix: bytes) -> list[bytes]:
        """The run's journaled results (every step) whose bytes begin with `prefix`."""

    def commit_step(self, commit: StepCommit) -> Awaitable[RunRecord | None]:
        """Append the checkpoint, move the run, and write the step's effects (performing the
        transactional ones), atomically, fenced by the lease epoch. Raises LeaseLost (and
        writes nothing) if the epoch moved, DuplicateEffectKey if an effect key was used
        before in the run; an exception from a transactional effect aborts the commit.
        Resolves to the run's record as committed when the step ended the run, if the store
        has it at hand (None otherwise, and for a run that goes on)."""

    async def fail_step(
        self,
        lease: Lease,
        *,
        failures: int,
        wake_at: float | None,
        error: bytes | None,
        final: bool,
        compensate: Sequence[str] = (),
    ) -> None:
        """Record a failed attempt: `final` -> status failed with `error`, and compensations
        queued for the run's effects named in `compensate`; otherwise the run is released as
        queued, claimable from `wake_at`. Fenced; raises LeaseLost."""

    async def send_message(self, thread_id: str, message: bytes, sender: str | None = None,
                           audit: Audit | None = None) -> int:
        """Deliver a message from outside a step, waking the recipient if it waits for mail.
        Returns the message id; raises RunNotFound for an unknown thread_id and InvalidState
        (`mail_refused`) for a finished run, which can never read it."""

    async def load_inbox(self, thread_id: str, limit: int = INBOX_LIMIT) -> list[MessageRecord]:
        """Unconsumed messages of the run, oldest first."""

    async def with_mail(self, thread_ids: Sequence[str]) -> set[str]:
        """The runs among `thread_ids` that have unconsumed messages (one query for a claim's
        runs: those without any skip their load_inbox)."""

    async def load_claimed(self, runs: Sequence[RunRecord]) -> dict[str, ClaimedReads]:
        """For runs just claimed by this worker, what each one's first step reads, by
        thread_id: load_checkpoints (if its step > 0), load_journal of its next step (unless
        it never ran) and load_inbox, for all of them at once (Postgres: one round trip, a
        statement per kind). Safe to read early: only the lease holder writes a run's
        checkpoints and journal, and mail that arrives later is read at its next step, as
        for a run mid-step."""

    async def inbox_depth(self, thread_id: str) -> int: ...

    async def sent_mail(self, sender: str, limit: int = 100) -> list[SentRecord]:
        """Messages sent as `sender` (a run's steps send as its thread_id; to a group: a row
        per recipient), newest first, at most `limit`."""

    async def group_members(self, group: str) -> list[str]: ...

    async def park_run(self, lease: Lease, park: Park) -> None:
        """Release a running run as waiting (interrupt, join) or sleeping (timer), recording
        the interrupt or the journaled timer in the same transaction; a join whose children
        all finished meanwhile leaves the run queued. Fenced; raises LeaseLost."""

    async def resume_interrupt(
        self, thread_id: str, value: bytes, interrupt_id: str | None = None,
        audit: Audit | None = None,
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

    async def cancel_run(
        self, thread_id: str, compensate: Sequence[str] = (), audit: Audit | None = None
    ) -> RunRecord | None:
        """Cancel a non-terminal run and its descendants at once, bumping their epochs so
        their holders commit nothing more, withdraw their pending interrupts, and queue
        compensations for their effects that are compensable or named in `compensate`.
        Returns the run as it is now (terminal runs unchanged)."""

    effects_available: asyncio.Event
    """Set when this process learns an effect may have become due."""

    async def claim_effects(
        self, worker: str, names: Sequence[str], limit: int, lease_ttl: float
    ) -> list[EffectRecord]:
        """Lease due effects with these handler names, at most one per run at a time and in
        each run's request order; each claim bumps the effect's epoch and attempts. Only a
        run's head (its first effect still pending or running) is claimable; runs are taken
        fairly (a store may visit them round robin rather than by due time)."""

    async def renew_effect_leases(self, worker: str, lease_ttl: float) -> None:
        """Extend every effect lease `worker` holds (a slow handler keeps its effect)."""

    async def complete_effect(self, effect: EffectRecord, result: bytes) -> bool:
        """Mark done with the result, fenced by the effect epoch; False if the lease was lost.
        Concurrent calls may be written together (one statement for many done marks)."""

    async def complete_effects(
        self, items: Sequence[tuple[EffectRecord, bytes]]
    ) -> list[bool]:
        """complete_effect for a batch, in one statement: each row is fenced by its own epoch
        (a row whose lease was taken over is not marked); one answer per item, in order."""

    async def fail_effect(self, effect: EffectRecord, error: str, delay: float | None) -> bool:
        """Retry after `delay` seconds, or dead when delay is None; fenced like complete."""

    async def get_effect(self, thread_id: str, key: str) -> EffectRecord | None: ...

    async def list_effects(
        self, *, thread_id: str | None = None, status: str | None = None, limit: int = 100
    ) -> list[EffectRecord]: ...

    async def retry_effect(self, key: str, thread_id: str | None = None,
                           audit: Audit | None = None) -> list[EffectRecord]:
        """Make dead effects with this key pending again with a fresh attempt budget."""

    async def load_checkpoints(
        self, thread_id: str, upto: int | None = None
    ) -> list[CheckpointRecord]:
        """The latest snapshot at or before `upto` (default: the last step) and every delta
        after it up to `upto`; what a replay of the state needs."""

    async def checkpoints(self, thread_id: str) -> list[CheckpointRecord]:
        """Every checkpoint row of the run, by step."""

    async def measure(self, window: float) -> LoadStats:
        """The load over the last `window` seconds (database clock), for the scaling advisor:
        reads only, a few scans; see store/measure.py."""

    async def status_counts(self, cap: int | None = None) -> StatusCounts:
        """Runs by status and version and effects by status, store-wide, in one query; with
        `cap`, each count read through an index and stopping there (StatusCounts.runs_more)."""

    @property
    def retention(self) -> Retention:
        """The retention operations (tether prune), a part of the store: see Retention."""

    # -- introspection (tether.observe) ---------------------------------------------------

    def observe_commits(self, observer: CommitObserver | None) -> None:
        """Tell `observer` of every group commit from now on (None: nobody); with none the
        write path pays one check per commit."""

    def pool_statistics(self) -> dict[str, int]:
        """The connection pool now: in_use (checked out), idle, max, waiting (requests
        queued for a connection); {} for a store without a pool (SQLite) or not open."""

    @property
    def deploys(self) -> Deployments:
        """The worker registry and the deployment weights (rainbow deploys), a part of the
        store: see Deployments."""

    @property
    def sessions(self) -> UiSessions:
        """The dashboard's sign-ins (revocable sessions), a part of the store: see
        store/session_types.py."""

    async def list_audit(
        self, *, thread_id: str | None = None, action: str | None = None, limit: int = 100,
        before: int | None = None,
    ) -> list[AuditRecord]:
        """Audit rows newest first, by run and action; `before` is the last id seen."""
