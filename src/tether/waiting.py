"""runtime.wait: until a run is finished (handed over by a worker of this process, else seen
by the hub's shared poller), or until it is in one of the statuses asked for."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from .history import record_of, with_state
from .hub import EventHub
from .records import statuses_of, to_run
from .store.base import Store
from .types import TERMINAL, Run


async def wait_run(store: Store, hub: EventHub, thread_id: str, timeout: float | None,
                   until: str | Iterable[str] | None) -> Run:
    """See Runtime.wait."""
    if until is not None:
        wanted = statuses_of(until)
        if not wanted <= TERMINAL:
            return await _wait_status(store, hub, thread_id, wanted, timeout)
    # Registered before the read: a run that ends while it is read still wakes this waiter.
    entry = hub.expect(thread_id)
    try:
        # A run a worker here drives exists and is not over; else one read (with the other
        # waits begun now) says whether the run exists, and is over already.
        if not hub.driving(thread_id):
            status = await hub.status_of(thread_id)
            if status is None or status in TERMINAL:
                rec = await record_of(store, thread_id)  # (RunNotFound, RunPruned)
                if rec.status in TERMINAL:
                    hub.forget(thread_id, entry)
                    return await with_state(store, rec)
    except BaseException:
        hub.forget(thread_id, entry)
        raise
    end = await hub.finished(thread_id, entry, timeout)
    handed = end.state
    if handed is not None and end.record is not None and end.record.step == end.step:
        return to_run(end.record, handed)
    found = await record_of(store, thread_id)
    if handed is not None and found.status in TERMINAL and found.step == end.step:
        return to_run(found, handed)
    return await with_state(store, found)  # also: woken by a cancel not finished yet


async def _wait_status(store: Store, hub: EventHub, thread_id: str, wanted: frozenset[str],
                       timeout: float | None) -> Run:
    async with asyncio.timeout(timeout):
        while True:
            rec = await record_of(store, thread_id)
            if rec.status in wanted or rec.status in TERMINAL:
                return await with_state(store, rec)
            await hub.wait_status(thread_id, wanted, None)
