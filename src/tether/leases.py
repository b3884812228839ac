"""When a run's lease ends, as far as this process can know it (LeaseClock), and the rule a
worker keeps with it: no step starts, and no journaled call is made, on a lease that is
expired or about to expire by the store's clock.

The store sets a lease's expiry to its own `now + ttl` when a statement runs (a claim, a
renewal, the insert of a run leased to a local worker). That statement ran after this process
sent it, so `monotonic() at send + ttl`, on this process's clock, is never later than the
store's expiry: a conservative deadline, with no clock skew between hosts involved (both
clocks run at the same rate, to parts per million).

A lease with less than a third of its TTL left (the heartbeat renews every third: only a
lagging heartbeat lets a lease get there) is renewed first, in one statement for every lease
the worker holds (`refresh`); if the store says the lease is no longer held, the step or call
does not happen (LeaseLost). A worker that went on after an outage with stale leases would
make a call another worker, which took the run over, makes again: a paid LLM call twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from .errors import LeaseLost, StoreError
from .store.base import Lease, Store

log = logging.getLogger("tether.worker")

Refresh = Callable[[Lease], Awaitable[None]]
"""Renew `lease` now (with the worker's other leases), or raise LeaseLost."""


class LeaseClock:
    """One lease's conservative deadline (time.monotonic()) and the way to renew it."""

    __slots__ = ("deadline", "lease", "margin", "refresh", "ttl")

    def __init__(self, lease: Lease, since: float, ttl: float, refresh: Refresh) -> None:
        self.lease = lease
        self.ttl = ttl
        self.deadline = since + ttl
        """The lease is held at least until then (monotonic seconds)."""
        self.margin = ttl / 3
        """Less than this left: renew before a step or a call."""
        self.refresh = refresh

    def renewed(self, since: float) -> None:
        """A statement sent at `since` (monotonic) set the lease to the store's now + ttl."""
        deadline = since + self.ttl
        if deadline > self.deadline:
            self.deadline = deadline

    def expiring(self) -> bool:
        """Too little of the lease is left to start a step or make a call on it."""
        return self.deadline - time.monotonic() < self.margin

    async def ensure(self) -> None:
        """Return at once if enough of the lease is left; else renew it first (LeaseLost if
        it is no longer ours)."""
        if self.deadline - time.monotonic() < self.margin:
            await self.refresh(self.lease)

    def left(self) -> float:
        """Seconds of the lease known to be left (negative: it may have expired)."""
        return self.deadline - time.monotonic()


class Renewals:
    """A worker's lease clocks and their renewal: one renew_leases statement for every lease
    the worker holds, shared by every caller meanwhile (the heartbeat, and runs whose lease is
    about to expire). `driving()`: the thread_ids the worker runs now; `lost(thread_id)`:
    abandon that run (its lease is gone); `current(lease)`: the lease is the one the worker
    drives its run on."""

    def __init__(self, store: Store, worker: str, ttl: float, *,
                 driving: Callable[[], set[str]], lost: Callable[[str], None],
                 current: Callable[[Lease], bool]) -> None:
        self._store = store
        self._worker = worker
        self.ttl = ttl
        self._driving, self._lost, self._current = driving, lost, current
        self.clocks: dict[str, LeaseClock] = {}
        self._renewal: asyncio.Future[set[str]] | None = None

    def track(self, lease: Lease, since: float) -> None:
        """A lease set by a statement sent at `since` (monotonic)."""
        self.clocks[lease.thread_id] = LeaseClock(lease, since, self.ttl, self.refresh)

    def clock(self, lease: Lease) -> LeaseClock | None:
        clock = self.clocks.get(lease.thread_id)
        return clock if clock is not None and clock.lease is lease else None

    def forget(self, lease: Lease) -> None:
        clock = self.clocks.get(lease.thread_id)
        if clock is not None and clock.lease is lease:
            del self.clocks[lease.thread_id]

    async def renew(self) -> set[str]:
        """Renew every lease the worker holds (or join the renewal in flight); move their
        deadlines and abandon the runs whose lease is gone. The thread_ids held."""
        renewal = self._renewal
        if renewal is None or renewal.done():
            renewal = self._renewal = asyncio.ensure_future(self._renew_once())
            renewal.add_done_callback(_retrieved)
        return await asyncio.shield(renewal)

    async def _renew_once(self) -> set[str]:
        driving = self._driving()
        since = time.monotonic()
        held = await self._store.renew_leases(self._worker, self.ttl, sorted(driving))
        clocks = self.clocks
        for thread_id in held:
            clock = clocks.get(thread_id)
            if clock is not None:
                clock.renewed(since)
        for thread_id in driving - held:
            # Taken over (the zombie case) or cancelled: stop running its node.
            self._lost(thread_id)
        return held

    async def refresh(self, lease: Lease) -> None:
        """A run's lease is about to expire (a lagging heartbeat, an outage): renew it now,
        or raise LeaseLost. While the store is unreachable, keep trying for a while (the run
        can do nothing else); then raise the StoreError (the run is released)."""
        delay = 0.1
        give_up = time.monotonic() + max(2 * self.ttl, 10.0)
        while True:
            try:
                held = await self.renew()
            except StoreError as exc:
                if time.monotonic() >= give_up:
                    raise
                log.info("run %s: lease about to expire, renewal failed (%s); retrying in "
                         "%.1fs", lease.thread_id, exc, delay)
                await asyncio.sleep(delay)
                delay = min(2 * delay, 1.0)
                continue
            if lease.thread_id in held and self._current(lease):
                return
            raise LeaseLost(f"run {lease.thread_id!r}: lease expired; no step or call made "
                            "on it")


def _retrieved(fut: asyncio.Future[set[str]]) -> None:
    """A renewal nobody waits for any more (its callers were cancelled) raised: seen."""
    if not fut.cancelled():
        fut.exception()
