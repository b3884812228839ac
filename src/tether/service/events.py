"""Server-Sent Events of one run.

Two sources are merged: `runtime.subscribe` (live events, including `ctx.stream` ones, when a
worker runs in this process) and a poller that reads the run row every `poll` seconds and
synthesizes the same event types when the row changed, so a client sees progress when the
worker is another process. The poller is shared (`run_poller`, a `SharedPoller`): one read of
a run per poll however many streams follow it, one task for all of them. Step events are
monotonic: a step is announced once, by whichever source sees it first, with the same shape
from either (`step`, `node` that ran it, `next_node`, `status`); the poller reads the
checkpoints of steps committed between two polls and announces each. `step` is the step an
event concerns: the step that committed for `step`, the step that parked (and runs again on
resume) for `interrupted` and `sleeping`.

Every frame has an SSE `id`: an opaque token of what the client has been told so far. A
client that reconnects with `Last-Event-ID` gets only what it missed (no new `status` event
first). The stream ends after one terminal event (completed, failed, cancelled).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
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
        self.asked: set[str] = set()  # interrupt ids announced, their resume not yet
        self.seq = 0

    def stamp(self, ev: Event) -> Event:
        """The event with its SSE id: the tracker's state once the client has seen it."""
        self.seq += 1
        raw = orjson.dumps([self.seq, self.step, self.status, sorted(self.asked)])
        return {**ev, "_id": base64.urlsafe_b64encode(raw).decode().rstrip("=")}

    def restore(self, event_id: str) -> bool:
        """Continue after the event whose id is `event_id` (False: not an id of ours)."""
        value = _decode_id(event_id)
        if value is None:
            return False
        self.seq, self.step, self.status, asked = value
        self.asked = set(asked)
        self.seen = {("interrupted", i) for i in self.asked}
        return True

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
            self.asked.discard(str(ev.get("interrupt_id")))
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
        moved = rec.step > self.step
        if self.asked and (rec.status != "waiting" or moved):  # answered: before its steps
            out += await self._resumed(runtime)
        if moved:
            out += await self._steps(runtime, rec)
            self.step = rec.step
        # Parked again at a later step (a second interrupt, another sleep) is news too.
        if (rec.status != self.status or rec.status in TERMINAL
                or (moved and rec.status in ("waiting", "sleeping"))):
            old, self.status = self.status, str(rec.status)
            out += await self._settle(runtime, rec, old,
                                      resumed=any(e["type"] == "resumed" for e in out))
        return out

    async def _steps(self, runtime: Runtime, rec: Run) -> list[Event]:
        """One event per step committed since the last one announced, from the checkpoints
        (the latest snapshot and the deltas after it; every row when more steps passed)."""
        rows = await runtime.store.load_checkpoints(self.thread_id, upto=rec.step)
        if not rows or rows[0].step > self.step + 1:
            rows = await runtime.store.checkpoints(self.thread_id)
        out: list[Event] = [
            {"type": "step", "thread_id": self.thread_id, "step": cp.step, "node": cp.node,
             "next_node": cp.next_node,
             "status": str(rec.status) if cp.step == rec.step else "running"}
            for cp in rows if self.step < cp.step <= rec.step]
        if not out or out[-1]["step"] != rec.step:  # no checkpoint row (pruned meanwhile)
            out.append({"type": "step", "thread_id": self.thread_id, "step": rec.step,
                        "node": None, "next_node": rec.node, "status": str(rec.status)})
        return out

    async def _resumed(self, runtime: Runtime) -> list[Event]:
        """`resumed` events of the announced interrupts answered since."""
        out: list[Event] = []
        for i in await runtime.interrupts(thread_id=self.thread_id, status="resolved",
                                          limit=1_000):
            key: tuple[str, object] = ("resumed", i.id)
            if i.id in self.asked and key not in self.seen:
                self.seen.add(key)
                self.asked.discard(i.id)
                out.append({"thread_id": self.thread_id, "type": "resumed",
                            "interrupt_id": i.id, "step": i.step})
        return out

    async def _settle(self, runtime: Runtime, rec: Run, old: str | None,
                      resumed: bool = False) -> list[Event]:
        """Events that describe the run's current status (it changed from `old`; `resumed`:
        the resumed events of that change were sent)."""
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
                                "node": rec.node, "interrupt_id": i.id,
                                "payload": i.payload})
        elif status == "sleeping":
            key: tuple[str, object] = ("sleeping", rec.step + 1)
            if key not in self.seen:
                self.seen.add(key)
                out.append({**base, "type": "sleeping", "step": rec.step + 1,
                            "node": rec.node, "wake_at": rec.wake_at})
        if not out and old is not None and not (old == "waiting" and resumed):
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
    after: str | None = None,
) -> AsyncIterator[Event | None]:
    """The run's events, starting with a `status` event; None means "send a keepalive".
    With `after` (a Last-Event-ID, checked by `valid_event_id`), only the events after that
    one. Each event carries its SSE id under `_id` (encode writes it). Ends early (within
    `poll`) once `draining()` is true: the server is shutting down. The run's row is read by
    `poller` (the server's, shared by its streams; default: its own)."""
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
        if after is not None and tracker.restore(after):
            first = await tracker.poll(runtime, fresh or rec)
        else:
            first = await tracker.initial(runtime, fresh or rec)
        for ev in first:
            yield tracker.stamp(ev)
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
                    yield tracker.stamp(out)
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
                    yield tracker.stamp(ev)
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


def _decode_id(event_id: str) -> tuple[int, int, str, list[str]] | None:
    if len(event_id) > 8192:
        return None
    try:
        value = orjson.loads(base64.urlsafe_b64decode(event_id + "=" * (-len(event_id) % 4)))
    except (binascii.Error, ValueError):
        return None
    if not (isinstance(value, list) and len(value) == 4
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                    for v in value[:2])
            and isinstance(value[2], str) and isinstance(value[3], list)
            and all(isinstance(i, str) for i in value[3])):
        return None
    return value[0], value[1], value[2], value[3]


def valid_event_id(event_id: str) -> bool:
    """Whether `event_id` is an SSE id this module wrote (a Last-Event-ID to resume after)."""
    return _decode_id(event_id) is not None


def encode(ev: Event | None) -> bytes:
    """One SSE frame: `event: <type>`, the JSON `data` and its `id` (when the event has one;
    after the data, which the SSE format allows, so that the frame's first lines stay as they
    were before ids), or a comment as keepalive."""
    if ev is None:
        return b": keepalive\n\n"
    event_id = ev.get("_id")
    if event_id is not None:
        ev = {k: v for k, v in ev.items() if k != "_id"}
    tail = b"\nid: " + str(event_id).encode() if event_id is not None else b""
    return (b"event: " + str(ev["type"]).encode() + b"\ndata: " + orjson.dumps(ev) + tail
            + b"\n\n")
