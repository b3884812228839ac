"""A prune batch is bounded in time as well as runs: one that took longer than BATCH_SECONDS
makes the next smaller in proportion; quicker ones let it grow back (at most twofold) to the
batch size; a rest ends early when the prune is asked to stop."""

from __future__ import annotations

import asyncio
import time

from tether.retention import BATCH_SECONDS, MIN_BATCH, next_batch, rest


def test_a_slow_batch_shrinks_the_next_in_proportion() -> None:
    assert next_batch(1000, 1000, 4 * BATCH_SECONDS) == 250
    assert next_batch(1000, 1000, 1000 * BATCH_SECONDS) == MIN_BATCH


def test_quick_batches_grow_back_at_most_twofold_up_to_the_batch_size() -> None:
    assert next_batch(250, 1000, BATCH_SECONDS / 10) == 500
    assert next_batch(800, 1000, BATCH_SECONDS / 10) == 1000
    assert next_batch(1000, 1000, BATCH_SECONDS) == 1000
    assert next_batch(5, 5, 100.0) == 5  # never above the batch asked for


async def test_a_rest_ends_when_the_prune_is_asked_to_stop() -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.05, stop.set)
    t0 = time.monotonic()
    await rest(stop, 30.0)
    assert time.monotonic() - t0 < 5.0
    t0 = time.monotonic()
    await rest(stop, 30.0)  # already set: no rest at all
    assert time.monotonic() - t0 < 0.5
