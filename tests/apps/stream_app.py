"""http_app's agents, with every read of a run's row (`Runtime.peek`, what event streams
poll) counted: a process that loads `stream_app:runtime` with STREAM_APP_READS set appends
`<thread_id>` to that file for each one, so a test can count what its streams cost the store.
(Counted on the class: `tether serve --db` configures a new Runtime from the app's.)"""

from __future__ import annotations

import os

from http_app import DB, echo, ticker

import tether

READS = os.environ.get("STREAM_APP_READS")
_peek = tether.Runtime.peek


async def _counted(self: tether.Runtime, thread_id: str) -> tether.Run:
    if READS:
        with open(READS, "a") as f:
            f.write(thread_id + "\n")
    return await _peek(self, thread_id)


tether.Runtime.peek = _counted  # type: ignore[method-assign]

runtime = tether.Runtime(DB, agents=[echo, ticker], version="v1", lease_ttl=2.0,
                         poll_interval=0.1)
