"""Server-Sent Events of one run.

Two sources are merged: `runtime.subscribe` (live events, including `ctx.stream` ones, when a
worker runs in this process) and a poller that reads the run row every `poll` seconds and
synthesizes the same event types when the row changed, so a client sees progress when the
worker is another process. The poller is shared (`run_poller`, a `SharedPoller`): one read of
a run per poll however many streams follow it, one task for all of them. Step events are
monotonic: a step is announced once, by whichever source sees it first; under the poller,
steps committed between two polls coalesce into one event for the latest. The stream ends
after one terminal event (completed, failed, cancelled).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Hashable
from typing import Any

import orjson

from ..errors import RunNotFound
from ..runtime import Runtime
from ..types import TERMINAL, Run
from .streams import SharedPoller

Event = dict[str, Any]
RunPoller = SharedPoller[Run | None]
"""Polls run rows for every event stream of a server; None: the run is gone."""


def _row_fingerprint(row: Run | None) -> Hashable:
    if row is None:
        return None
    return (str(row.status), row.step, row.updated_at, row.attempt, row.node, row.version,
            row.wake_at, row.waiting_for)


def run_poller(poll: float = 0.25) -> RunPoller:
    """The poller event streams share (one per server)."""
    return SharedPoller(poll, "event stream poll", _row_fingerprint)


async def _peek(runtime: Runtime, thread_id: str) -> Run | None:
    try:
        return await runtime.peek(thread_id)
    except RunNotFound:
        return None


class _Tracker:
    """What the client has been told so far; turns local events and polled rows into the
    events it has not seen yet."""

    def __init__(self, thread_id: str, rec: Run) -> None:
        self.thread_id = thread_id
        self.status = str(rec.status)
        self.step = rec.step
        self.seen: set[tuple[str, object]] = set()
        self.asked: set[str] = set()  # interrupt ids announced

    def local(self, ev: Event) -> Event | None:
        kind = ev.get("type")
        if kind == "step":
            step = int(ev.get("step", 0))
            if step <= self.step:
                return None
            self.step, self.status = step, str(ev.get("status", self.status))
        elif kind == "interrupted":
            key = ("interrupted", ev.get("interrupt_id"))
            if key in self.seen:
                return None
            self.seen.add(key)
            self.asked.add(str(ev.get("interrupt_id")))
            self.status = "waiting"
        elif kind == "sleeping":
            key = ("sleeping", ev.get("step"))
            if key in self.seen:
                return None
            self.seen.add(key)
            self.status = "sleeping"
        elif kind == "resumed":
            key = ("resumed", ev.get("interrupt_id"))
            if key in self.seen:
                return None
            self.seen.add(key)
            self.status = "queued"
        elif kind in TERMINAL:
            self.status = str(kind)
        elif kind == "idle":  # an actor run waits for mail
            self.status = "waiting"
        elif kind == "processing":
            self.status = "running"
        return ev

    async def initial(self, runtime: Runtime, rec: Run) -> list[Event]:
        first: Event = {
            "type": "status", "thread_id": self.thread_id, "agent": rec.agent,
            "status": str(rec.status), "step": rec.step, "node": rec.node, "version": rec.version,
            "attempt": rec.attempt, "wake_at": rec.wake_at, "updated_at": rec.updated_at,
        }
        return [first, *await self._settle(runtime, rec, None)]

    async def poll(self, runtime: Runtime, rec: Run) -> list[Event]:
        out: list[Event] = []
        if rec.step > self.step:
            self.step = rec.step
            out.append({"type": "step", "thread_id": self.thread_id, "step": rec.step,
                        "next_node": rec.node, "status": str(rec.status)})
        if rec.status != self.status or rec.status in TERMINAL:
            old, self.status = self.status, str(rec.status)
            out += await self._settle(runtime, rec, old)
        return out

    async def _settle(self, runtime: Runtime, rec: Run, old: str | None) -> list[Event]:
        """Events that describe the run's current status (it changed from `old`)."""
        base: Event = {"thread_id": self.thread_id}
        status = str(rec.status)
        if status in TERMINAL:
            ev: Event = {**base, "type": status, "step": rec.step}
            err = rec.error
            if err is not None:
                ev.update(category=err.category, error=f"{err.type}: {err.message}")
            return [ev]
        out: list[Event] = []
        if status == "waiting":
            for i in await runtime.interrupts(thread_id=self.thread_id, limit=1_000):
                if i.id not in self.asked:
                    self.asked.add(i.id)
                    self.seen.add(("interrupted", i.id))
                    out.append({**base, "type": "interrupted", "step": i.step,
                                "interrupt_id": i.id, "payload": i.payload})
        elif status == "sleeping":
            key: tuple[str, object] = ("sleeping", rec.step + 1)
            if key not in self.seen:
                self.seen.add(key)
                out.append({**base, "type": "sleeping", "step": rec.step + 1,
                            "wake_at": rec.wake_at})
        elif old == "waiting" and self.asked:
            for i in await runtime.interrupts(thread_id=self.thread_id, status="resolved",
                                              limit=1_000):
                rkey: tuple[str, object] = ("resumed", i.id)
                if i.id in self.asked and rkey not in self.seen:
                    self.seen.add(rkey)
                    out.append({**base, "type": "resumed", "interrupt_id": i.id,
                                "step": i.step})
        if not out and old is not None:
            out.append({**base, "type": "status", "status": status, "step": rec.step})
        return out


async def run_events(
    runtime: Runtime,
    rec: Run,
    *,
    poll: float = 0.25,
    keepalive: float = 15.0,
    draining: Callable[[], bool] = lambda: False,
    poller: RunPoller | None = None,
) -> AsyncIterator[Event | None]:
    """The run's events, starting with a `status` event; None means "send a keepalive".
    Ends early (within `poll`) once `draining()` is true: the server is shutting down. The
    run's row is read by `poller` (the server's, shared by its streams; default: its own)."""
    thread_id = rec.thread_id
    # Live events; None: the poller has a new row for this stream.
    queue: asyncio.Queue[Event | None] = asyncio.Queue(maxsize=10_000)

    async def pump() -> None:
        async for ev in runtime.subscribe(thread_id):
            # A client too slow for the stream loses live events rather than growing this
            # queue; a lost status change is still seen by the poller.
            if not queue.full():
                queue.put_nowait(ev)

    def arrived() -> None:
        if not queue.full():
            queue.put_nowait(None)

    rows = run_poller(poll) if poller is None else poller
    following = rows.follow(thread_id, lambda: _peek(runtime, thread_id), wake=arrived)
    row_of = await following.__aenter__()
    task = asyncio.create_task(pump())
    loop = asyncio.get_running_loop()
    try:
        await asyncio.sleep(0)  # the pump subscribes before the row is read: no gap
        try:
            fresh: Run | None = await runtime.peek(thread_id)
        except RunNotFound:
            fresh = None
        tracker = _Tracker(thread_id, fresh or rec)
        last_sent = loop.time()
        for ev in await tracker.initial(runtime, fresh or rec):
            yield ev
            if ev["type"] in TERMINAL:
                return
        next_poll = loop.time() + poll
        while True:
            wait = next_poll - loop.time()
            ev_or_none: Event | None = None
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    ev_or_none = await asyncio.wait_for(queue.get(), wait)
            elif not queue.empty():
                ev_or_none = queue.get_nowait()
            if ev_or_none is not None:
                out = tracker.local(ev_or_none)
                if out is not None:
                    last_sent = loop.time()
                    yield out
                    if out["type"] in TERMINAL:
                        return
                continue
            if loop.time() < next_poll and not row_of.changed.is_set():
                continue
            if draining():
                return
            next_poll = loop.time() + poll
            if row_of.changed.is_set():
                row = row_of.take()
                if row is None:  # the run is gone
                    return
                for ev in await tracker.poll(runtime, row):
                    last_sent = loop.time()
                    yield ev
                    if ev["type"] in TERMINAL:
                        return
            if loop.time() - last_sent >= keepalive:
                last_sent = loop.time()
                yield None
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await following.__aexit__(None, None, None)
        if poller is None:
            await rows.close()


def encode(ev: Event | None) -> bytes:
    """One SSE frame: `event: <type>` and the JSON `data`, or a comment as keepalive."""
    if ev is None:
        return b": keepalive\n\n"
    return b"event: " + str(ev["type"]).encode() + b"\ndata: " + orjson.dumps(ev) + b"\n\n"
