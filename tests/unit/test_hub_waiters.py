"""EventHub's waiters of a run's end, without a database (the store is never reached)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from tether.hub import EventHub
from tether.store.base import Store


async def test_the_pollers_word_does_not_replace_a_handed_over_state() -> None:
    hub = EventHub(cast(Store, object()), poll_interval=60.0)
    entry = hub.expect("t1")
    try:
        state: dict[str, Any] = {"done": True}
        hub.notify_finished("t1", 5, state)  # the worker that finished it
        hub.notify_finished("t1")  # the poller, before the waiter has run
        end = await asyncio.wait_for(hub.finished("t1", entry, None), 5)
    finally:
        hub.close()
    assert (end.step, end.state) == (5, state)
    assert hub.waited() == frozenset()


async def test_the_first_waiter_takes_the_state_the_others_read() -> None:
    hub = EventHub(cast(Store, object()), poll_interval=60.0)
    first, second = hub.expect("t1"), hub.expect("t1")
    try:
        hub.notify_finished("t1", 2, {"n": 1})
        a = await asyncio.wait_for(hub.finished("t1", first, None), 5)
        b = await asyncio.wait_for(hub.finished("t1", second, None), 5)
    finally:
        hub.close()
    assert a.state == {"n": 1} and b.state is None and b.step == 2
