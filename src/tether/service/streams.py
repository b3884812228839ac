"""Open streams (GET /runs/{thread_id}/events, the dashboard's /ui/live): one shared poller,
and a cap on how many are open.

`SharedPoller`: followers subscribe to a key (a thread_id, a dashboard topic) with a probe, an
async function that reads what the key shows. One task, for every key of the poller, calls
each followed key's probe once every `poll` seconds and hands the value to each follower whose
last seen fingerprint differs. So N streams on one run cost one read per poll, not N, and
streams on many runs share one task. A key is dropped when its last follower leaves (nothing
of it is kept), and the task ends once no key is left.

`StreamSlots`: every stream holds a slot while it is open, at most `total` in all and
`per_client` per client address; past either, the request is refused with 429
(`TooManyStreams`). A slot is released when its response ends, however it ends (the stream
finished, the client went away, an error). When many streams have closed, the memory they
used is handed back to the system (`release_memory`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ctypes
import gc
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

log = logging.getLogger("tether.service")

T = TypeVar("T")

MAX_STREAMS = 1000
"""Default cap on the streams open on one server (`tether serve --max-streams`)."""
MAX_STREAMS_PER_CLIENT = 50
"""Default cap on the streams one client address has open (`--max-streams-per-client`)."""
RETRY_AFTER = 5
"""Seconds a refused client is told to wait (Retry-After) before it tries again."""
PROBES_AT_ONCE = 8
"""Probes of different keys one tick runs concurrently (a slow one does not hold the rest)."""

_UNSEEN = object()


@dataclass(eq=False, slots=True)
class Follower(Generic[T]):
    """One stream's view of a key: the latest value it has not consumed, and an event set
    when one arrives."""

    seen: Hashable
    wake: Callable[[], None] | None = None
    """Called when a value arrives (besides `changed` being set)."""
    value: T | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def take(self) -> T | None:
        """The value that arrived since the last take (None: none did), and clears `changed`."""
        value, self.value = self.value, None
        self.changed.clear()
        return value


@dataclass(slots=True)
class _Key(Generic[T]):
    probe: Callable[[], Awaitable[T]]
    followers: set[Follower[T]] = field(default_factory=set)


class SharedPoller(Generic[T]):
    """One task polling every followed key each `poll` seconds (see the module's doc).
    `fingerprint` turns a probed value into what followers compare (default: the value)."""

    def __init__(self, poll: float, what: str,
                 fingerprint: Callable[[T], Hashable] | None = None) -> None:
        self.poll = poll
        self.what = what
        self.fingerprint = fingerprint
        self.probes = 0
        """Probes called so far (what the streams cost the store)."""
        self._keys: dict[str, _Key[T]] = {}
        self._task: asyncio.Task[None] | None = None

    def followers(self, key: str) -> int:
        entry = self._keys.get(key)
        return 0 if entry is None else len(entry.followers)

    @property
    def keys(self) -> int:
        return len(self._keys)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @contextlib.asynccontextmanager
    async def follow(self, key: str, probe: Callable[[], Awaitable[T]],
                     seen: Hashable = _UNSEEN, wake: Callable[[], None] | None = None,
                     ) -> AsyncIterator[Follower[T]]:
        """Follow `key` (the first follower's `probe` reads it): the follower gets each value
        whose fingerprint differs from the last one it saw (`seen`: what it already shows;
        by default none, so the first poll hands it the current value); `wake` is called
        each time one arrives."""
        me: Follower[T] = Follower(seen, wake)
        entry = self._keys.get(key)
        if entry is None:
            entry = self._keys[key] = _Key(probe)
        entry.followers.add(me)
        if not self.running:
            # A context of its own: not the first follower's request's (its trace span).
            self._task = asyncio.create_task(self._run(), name=f"tether-{self.what}",
                                             context=contextvars.Context())
        try:
            yield me
        finally:
            entry.followers.discard(me)
            if not entry.followers and self._keys.get(key) is entry:
                del self._keys[key]

    async def _run(self) -> None:
        limit = asyncio.Semaphore(PROBES_AT_ONCE)
        while self._keys:
            entries = list(self._keys.items())
            if len(entries) == 1:
                await self._probe(*entries[0], limit)
            else:
                await asyncio.gather(*(self._probe(k, e, limit) for k, e in entries))
            await asyncio.sleep(self.poll)
            # Ends once no key is left: a follower arriving before that is served by this
            # task, one arriving after starts a new one.

    async def _probe(self, key: str, entry: _Key[T], limit: asyncio.Semaphore) -> None:
        if not entry.followers:
            return
        async with limit:
            self.probes += 1
            try:
                value = await entry.probe()
            except Exception:  # an outage must not end the streams' only poller
                log.warning("%s of %s failed; retrying", self.what, key, exc_info=True)
                return
        now: Hashable = value if self.fingerprint is None else self.fingerprint(value)
        for f in list(entry.followers):
            if f.seen != now:
                f.seen, f.value = now, value
                f.changed.set()
                if f.wake is not None:
                    f.wake()

    async def close(self) -> None:
        self._keys.clear()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


# -- caps ---------------------------------------------------------------------------------


class TooManyStreams(Exception):
    """Refused: the client, or the server, has as many streams open as allowed (429)."""

    status = 429
    type = "TooManyStreams"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.headers: Mapping[str, str] = {"Retry-After": str(RETRY_AFTER)}


class Slot:
    """An open stream's place under the caps; `release` (idempotent) gives it back."""

    __slots__ = ("__weakref__", "_client", "_slots")

    def __init__(self, slots: StreamSlots, client: str) -> None:
        self._slots: StreamSlots | None = slots
        self._client = client

    def release(self) -> None:
        slots, self._slots = self._slots, None
        if slots is not None:
            slots._release(self._client)


class StreamSlots:
    """The open streams, per client address and in all, under their caps."""

    def __init__(self, total: int = MAX_STREAMS,
                 per_client: int = MAX_STREAMS_PER_CLIENT) -> None:
        if total < 1 or per_client < 1:
            raise ValueError(f"stream caps must be >= 1, got {total} and {per_client}")
        self.total = total
        self.per_client = per_client
        self.open = 0
        self._by_client: dict[str, int] = {}
        self._peak = 0  # most open since memory was last released
        self._trim: asyncio.TimerHandle | None = None

    def by_client(self, client: str) -> int:
        return self._by_client.get(client, 0)

    def acquire(self, client: str) -> Slot:
        """A slot for one more stream of `client`, or TooManyStreams."""
        if self.open >= self.total:
            raise TooManyStreams(
                f"this server has {self.total} streams open, its cap (--max-streams or "
                "TETHER_MAX_STREAMS): try again later")
        mine = self._by_client.get(client, 0)
        if mine >= self.per_client:
            raise TooManyStreams(
                f"this client has {self.per_client} streams open, the cap per client "
                "(--max-streams-per-client or TETHER_MAX_STREAMS_PER_CLIENT): close one "
                "before opening another")
        self._by_client[client] = mine + 1
        self.open += 1
        self._peak = max(self._peak, self.open)
        return Slot(self, client)

    def _release(self, client: str) -> None:
        left = self._by_client.get(client, 0) - 1
        if left > 0:
            self._by_client[client] = left
        else:
            self._by_client.pop(client, None)
        self.open -= 1
        # Many streams closed: once the rush is over, hand their memory back.
        if self._peak - self.open >= 32 and self.open <= self._peak // 2 and self._trim is None:
            with contextlib.suppress(RuntimeError):  # no running loop: at exit
                self._trim = asyncio.get_running_loop().call_later(1.0, self._released)

    def _released(self) -> None:
        self._trim = None
        self._peak = self.open
        release_memory()


_trim: list[Callable[[int], Any] | None] = []


def release_memory() -> None:
    """Collect what the closed streams left in reference cycles (a cancelled task's
    traceback holds its frames) and give free heap pages back to the system (glibc's
    malloc_trim; elsewhere only the collection)."""
    gc.collect()
    if not _trim:
        try:
            _trim.append(getattr(ctypes.CDLL(None), "malloc_trim", None))
        except (OSError, TypeError):
            _trim.append(None)
    if _trim[0] is not None:
        _trim[0](0)


class HeldStream(StreamingResponse):
    """A streaming response that holds a slot until it ends, however it ends."""

    def __init__(self, content: AsyncIterator[bytes], status_code: int = 200, *,
                 slot: Slot | None = None, headers: Mapping[str, str] | None = None,
                 media_type: str | None = None) -> None:
        super().__init__(content, status_code, headers=headers, media_type=media_type)
        self.slot = slot
        if slot is not None:  # never called (the request was cancelled first): still freed
            weakref.finalize(self, slot.release)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self.slot is not None:
                self.slot.release()


def client_of(scope: Scope) -> str:
    """The client address a stream counts against (behind a proxy: the proxy's)."""
    client = scope.get("client")
    return str(client[0]) if client else ""
