"""Closing a Runtime whose workers still run in this process (an exception or Ctrl-C inside
`async with runtime:` while `runtime.work()` runs): the workers stop first and give their
leases back, then the store closes. Closing the store first would leave the workers writing
to a closed store ("store is not open") and their runs leased until the lease TTL passed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from .worker import Worker

log = logging.getLogger("tether.runtime")

MARGIN = 5.0
"""Seconds allowed beyond the workers' own shutdown (steps, then effects, each up to the
grace) before closing anyway."""


async def stop_local(workers: Sequence[Worker], grace: float) -> None:
    """Stop `workers` (claim nothing more; in-flight steps and effects get `grace` seconds,
    then they are cancelled) and wait until each has returned its leases."""
    running = [w for w in workers if not w.stopped.is_set()]
    if not running:
        return
    for w in running:
        w.stop()
    log.info("stopping %d worker(s) of this process before closing the runtime", len(running))
    waits = [asyncio.ensure_future(w.stopped.wait()) for w in running]
    _, late = await asyncio.wait(waits, timeout=2 * grace + MARGIN)
    for wait in late:
        wait.cancel()
    if late:
        log.warning("%d worker(s) did not stop within %.1fs; closing the runtime anyway (their "
                    "runs are claimable again after the lease TTL)", len(late), 2 * grace + MARGIN)
