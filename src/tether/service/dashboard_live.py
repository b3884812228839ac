"""Live updates of dashboard views: one poller per view, however many tabs show it.

A view (a topic: "overview", "runs?status=failed", "run:<thread_id>", ...) has a probe, an
async function returning a fingerprint (a short string) of what the page shows. The page is
rendered with its fingerprint and follows with it: while at least one browser tab follows the
topic, one task calls the probe every `poll` seconds and tells each follower whose fingerprint
differs (so a change between the page's render and its subscription is not missed); the tab
then fetches the page again (live.js). The last follower to leave stops the task. So N tabs on
one view cost one probe per poll, not N.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

log = logging.getLogger("tether.dashboard")

Probe = Callable[[], Awaitable[str]]


@dataclass(eq=False, slots=True)
class _Follower:
    seen: str
    queue: asyncio.Queue[None] = field(default_factory=lambda: asyncio.Queue(maxsize=1))


@dataclass(slots=True)
class _Topic:
    followers: set[_Follower] = field(default_factory=set)
    task: asyncio.Task[None] | None = None


class LiveHub:
    def __init__(self, poll: float) -> None:
        self.poll = poll
        self._topics: dict[str, _Topic] = {}

    def followers(self, key: str) -> int:
        topic = self._topics.get(key)
        return 0 if topic is None else len(topic.followers)

    @contextlib.asynccontextmanager
    async def follow(self, key: str, probe: Probe, seen: str) -> AsyncIterator[
            asyncio.Queue[None]]:
        """A queue that gets an item each time the topic's fingerprint differs from the last
        one this follower saw (`seen`: the one its page was rendered with)."""
        me = _Follower(seen)
        topic = self._topics.setdefault(key, _Topic())
        topic.followers.add(me)
        if topic.task is None or topic.task.done():
            topic.task = asyncio.create_task(self._run(key, topic, probe),
                                             name=f"tether-dashboard-live:{key}")
        try:
            yield me.queue
        finally:
            topic.followers.discard(me)
            if not topic.followers:
                self._topics.pop(key, None)
                if topic.task is not None:
                    topic.task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await topic.task

    async def _run(self, key: str, topic: _Topic, probe: Probe) -> None:
        while topic.followers:
            try:
                now = await probe()
            except Exception:  # an outage must not end the view's only poller
                log.warning("live probe of %s failed; retrying", key, exc_info=True)
            else:
                for f in list(topic.followers):
                    if f.seen != now:
                        f.seen = now
                        if f.queue.empty():  # one pending "changed" is as good as many
                            f.queue.put_nowait(None)
            await asyncio.sleep(self.poll)

    async def close(self) -> None:
        for topic in list(self._topics.values()):
            if topic.task is not None:
                topic.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await topic.task
        self._topics.clear()
