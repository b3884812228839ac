"""Runtime.resume's write: the answer to a run's interrupt, and the hand-over of the run to a
worker of this process with a free slot (as Runtime.start hands over a run it starts), so the
run goes on at once: no claim, no wake-up of other workers."""

from __future__ import annotations

import time
from collections.abc import Sequence

from .store.base import Audit, Handover, InterruptRecord, Lease, Store
from .worker import Worker


async def answer(store: Store, workers: Sequence[Worker], lease_ttl: float, thread_id: str,
                 value: bytes, interrupt_id: str | None,
                 audit: Audit | None) -> InterruptRecord | None:
    """Store.resume_interrupt, offering the run to the first of `workers` (the runtime's own,
    of its version) with a free slot; a run of another version or agent, or answered with
    every slot taken, is queued for a claim as before."""
    worker = next((w for w in workers if w.reserve()), None)
    if worker is None:
        return await store.resume_interrupt(thread_id, value, interrupt_id, audit=audit)
    handover = Handover(worker.id, worker.registry.version, tuple(worker.registry.agents),
                        lease_ttl)
    since = time.monotonic()  # the run's lease runs from (at the latest) now
    try:
        rec = await store.resume_interrupt(thread_id, value, interrupt_id, audit=audit,
                                           handover=handover)
    except BaseException:
        worker.unreserve()
        raise
    if rec is None or rec.run is None:
        worker.unreserve()
    elif not worker.adopt(rec.run, since, fresh=False):  # it began stopping meanwhile
        await store.release_runs([Lease(rec.thread_id, worker.id, rec.run.epoch)])
    return rec
