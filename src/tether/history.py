"""A run's state read back from its checkpoint log: the one place that loads and replays;
and what its past says about an answer that was refused."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from . import serde
from .errors import InvalidState, ResumeConflict, RunNotFound, RunPruned
from .records import iso, to_run
from .state import State, apply, replay
from .store.base import CheckpointRecord, RunRecord, Store
from .types import Run


async def load_state(store: Store, run: RunRecord, upto: int | None = None) -> tuple[State, int]:
    """The run's state after step `upto` (default: its last committed step), and how many
    checkpoints were read after the latest snapshot (the worker's next snapshot is due when
    that reaches snapshot_every). A run at step 0 is its input: nothing is read."""
    rows = await store.load_checkpoints(run.thread_id, upto) if run.step > 0 else []
    return state_from(run, rows)


def state_from(run: RunRecord, rows: Sequence[CheckpointRecord]) -> tuple[State, int]:
    """load_state from the rows store.load_checkpoints gave (read already)."""
    since_snapshot = len(rows) - (1 if rows and rows[0].kind == "s" else 0)
    return replay(run.input, ((cp.kind, cp.data) for cp in rows)), since_snapshot


async def states_after(store: Store, run: RunRecord) -> list[tuple[CheckpointRecord, State]]:
    """Every checkpoint row of the run with the state after it (each its own copy)."""
    state: dict[str, Any] = dict(serde.loads(run.input))
    out = []
    for cp in await store.checkpoints(run.thread_id):
        state = apply(state, cp.kind, cp.data)
        # A copy per checkpoint (typed: it may hold an Agent(typed_state=True)'s values).
        out.append((cp, serde.loads(serde.dumps(state, typed=True))))
    return out


async def not_resumed(store: Store, run: RunRecord, interrupt_id: str | None
                      ) -> InvalidState | ResumeConflict:
    """Why an answer to `run`'s interrupt (`interrupt_id`, else its pending one) changed
    nothing: it was answered already (ResumeConflict), there is no such interrupt, or the
    run does not wait for input (InvalidState)."""
    thread_id = run.thread_id
    answered = await store.get_interrupt(interrupt_id) if interrupt_id else None
    if answered is None and interrupt_id is None:
        done = await store.list_interrupts(thread_id=thread_id, status="resolved", limit=1_000)
        answered = next((i for i in reversed(done) if i.step == run.step + 1), None)
    if answered is not None and answered.thread_id == thread_id and answered.status == "resolved":
        return ResumeConflict(f"interrupt {answered.id!r} of run {thread_id!r} was already answered")
    if interrupt_id is not None and (answered is None or answered.thread_id != thread_id):
        return InvalidState(f"run {thread_id!r} has no interrupt {interrupt_id!r}")
    return InvalidState(f"run {thread_id!r} is {run.status}, not waiting for input")


async def next_node(store: Store, run: RunRecord, step: int, start_node: Callable[[], str]
                    ) -> str | None:
    """The node that runs after `step` of the run (`start_node()` after step 0; None when
    that step finished the run)."""
    if step == 0:
        return start_node()
    rows = await store.load_checkpoints(run.thread_id, step)
    return rows[-1].next_node if rows else None


async def retry_node(store: Store, run: RunRecord, start_node: Callable[[], str]) -> str:
    """The node a retry of the failed `run` runs again, or InvalidState saying why it cannot
    be retried."""
    if run.status != "failed":
        hint = ("fork it to run steps again (tether runs fork)"
                if run.status in ("completed", "cancelled") else "wait for it to fail or finish")
        raise InvalidState(f"run {run.thread_id!r} is {run.status}, not failed: only a failed "
                           f"run can be retried; {hint}")
    node = await next_node(store, run, run.step, start_node)
    if node is None:  # a failed run's last committed step never finished it
        raise InvalidState(f"run {run.thread_id!r} has no step to run again")
    return node


async def record_of(store: Store, thread_id: str) -> RunRecord:
    """The run's row; RunPruned (with when) if retention removed it, else RunNotFound."""
    rec = await store.get_run(thread_id)
    if rec is None:
        tomb = await store.retention.get_tombstone(thread_id)
        if tomb is not None:
            raise RunPruned(f"run {thread_id!r} ({tomb.status}) was pruned by retention at "
                            f"{iso(tomb.pruned_at)}", thread_id=thread_id,
                            pruned_at=tomb.pruned_at)
        raise RunNotFound(f"no run with thread_id {thread_id!r}")
    return rec


async def with_state(store: Store, rec: RunRecord) -> Run:
    """The run as users see it, with its current state (read back from the log)."""
    return to_run(rec, (await load_state(store, rec))[0])
