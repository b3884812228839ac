"""Store records turned into the value types users get (tether.types): one place for it."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from . import serde
from .errors import DefinitionError
from .store.base import CheckpointRecord, EffectRecord, InterruptRecord, RunRecord, Store
from .types import Checkpoint, Effect, Interrupt, Run, RunError, RunStatus, SentMessage

MAX_SENT = 1000


def run_error(data: bytes | None) -> RunError | None:
    if data is None:
        return None
    d = serde.loads(data)
    return RunError(d.get("category", "exception"), d.get("type", ""), d.get("message", ""),
                    d.get("traceback", ""), d.get("node"))


def statuses_of(until: str | Iterable[str]) -> frozenset[str]:
    """`until` as a set of statuses, each one checked (a typo must not wait forever)."""
    names = [until] if isinstance(until, str) else list(until)
    known = {s.value for s in RunStatus}
    for name in names:
        if name not in known:
            raise DefinitionError(f"unknown run status {name!r} in until; one of: "
                                  f"{', '.join(s.value for s in RunStatus)}")
    if not names:
        raise DefinitionError("until names no status")
    return frozenset(str(n) for n in names)


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")


def to_run(rec: RunRecord, state: dict[str, Any] | None, *, created: bool = False,
           inbox_depth: int | None = None) -> Run:
    return Run(
        created=created,
        inbox_depth=inbox_depth,
        thread_id=rec.thread_id,
        agent=rec.agent,
        status=RunStatus(rec.status),
        state=state if state is not None else {},
        step=rec.step,
        version=rec.version,
        node=rec.node,
        attempt=rec.attempt,
        error=run_error(rec.error),
        created_at=rec.created_at,
        updated_at=rec.updated_at,
        idempotency_key=rec.idempotency_key,
        parent_thread_id=rec.parent_thread_id,
        forked_from=rec.forked_from,
        forked_step=rec.forked_step,
        lease_owner=rec.lease_owner,
        wake_at=rec.wake_at,
        waiting_for=rec.waiting_for,
    )


def effect_of(rec: EffectRecord) -> Effect:
    return Effect(rec.thread_id, rec.key, rec.name, rec.step, serde.loads(rec.payload),
                  rec.status, rec.attempts,
                  None if rec.result is None else serde.loads(rec.result), rec.error,
                  rec.compensates, rec.created_at, rec.done_at)


def interrupt_of(rec: InterruptRecord) -> Interrupt:
    return Interrupt(rec.id, rec.thread_id, rec.step, serde.loads(rec.payload), rec.status,
                     None if rec.value is None else serde.loads(rec.value), rec.created_at,
                     rec.resolved_at)


def checkpoint_of(cp: CheckpointRecord, state: dict[str, Any]) -> Checkpoint:
    return Checkpoint(cp.thread_id, cp.step, cp.node, cp.next_node, state, cp.kind, cp.worker,
                      cp.attempt, cp.started_at, cp.finished_at)


async def sent_by(store: Store, thread_id: str, limit: int) -> list[SentMessage]:
    """The messages run `thread_id` sent, newest first, at most `limit` (1..MAX_SENT)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_SENT:
        raise DefinitionError(f"limit must be within 1..{MAX_SENT}, got {limit!r}")
    return [SentMessage(m.id, thread_id, m.recipient, serde.loads(m.message), m.created_at,
                        m.consumed_step) for m in await store.sent_mail(thread_id, limit)]
