"""Live updates of dashboard views: one poller for every view, however many tabs show them.

A view (a topic: "overview", "runs?status=failed", "run:<thread_id>", ...) has a probe, an
async function returning a fingerprint (a short string) of what the page shows. The page is
rendered with its fingerprint and follows with it: while at least one browser tab follows a
topic, the hub's one task (a `SharedPoller`, tether.service.streams) calls the topic's probe
every `poll` seconds and tells each follower whose fingerprint differs (so a change between the
page's render and its subscription is not missed); the tab then fetches the page again
(live.js). A topic's last follower to leave drops it. So N tabs on one view cost one probe per
poll, not N, and tabs on many views share one task rather than one each.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from .streams import Follower, SharedPoller

Probe = Callable[[], Awaitable[str]]


class Changes:
    """What a follower of a topic waits on: `get()` returns when the topic's fingerprint has
    differed from the last one it saw (several changes in between count as one)."""

    __slots__ = ("_f",)

    def __init__(self, follower: Follower[str]) -> None:
        self._f = follower

    async def get(self) -> None:
        await self._f.changed.wait()
        self._f.take()

    def empty(self) -> bool:
        return not self._f.changed.is_set()


class LiveHub:
    def __init__(self, poll: float) -> None:
        self.poll = poll
        self.poller: SharedPoller[str] = SharedPoller(poll, "live probe")

    def followers(self, key: str) -> int:
        return self.poller.followers(key)

    @contextlib.asynccontextmanager
    async def follow(self, key: str, probe: Probe, seen: str) -> AsyncIterator[Changes]:
        """Changes of the topic's fingerprint from the last one this follower saw (`seen`:
        the one its page was rendered with)."""
        async with self.poller.follow(key, probe, seen) as me:
            yield Changes(me)

    async def close(self) -> None:
        await self.poller.close()
