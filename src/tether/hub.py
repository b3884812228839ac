"""EventHub: one process's live events and waiters of runs.

Two things flow from the workers of a process up to its users, and both go through here so
that a worker never reaches up into the Runtime:

- live events (`emit`), delivered to the subscribers of the run (`subscribe`: SSE clients,
  `runtime.subscribe`); nothing is stored, a slow subscriber drops events;
- finished runs (`notify_finished`), which wake the run's waiters (`expect`, `finished`) at
  once, handing over the final state a local worker already holds (a waiter replays nothing);
- what the workers did, for observers (`observe`: metrics, traces, logs; tether.observe has
  them). A worker asks `observe_run` once per run it drives and tells the RunObserver it gets
  about each step, call, retry and end; with no observer attached it gets None and pays one
  check per step.

Runs driven by a worker elsewhere are noticed by one shared poller, one query per poll interval
for all waited-for runs. Workers of this process attach themselves (`attach`) so the poller
skips the runs they drive: those wake their waiters themselves. A waiter is registered
(`expect`) before anything is read for it, so an end notified meanwhile is never missed; the
status reads of waits begun together are one query (`status_of`).

Waiting until a run reaches a status that is not terminal (`wait_status`: `waiting`, say) goes
through the same poller, for every run, local or not: a worker tells the hub only when a run
finishes, so such a waiter learns of a park within one poll interval (the step loop stays as it
is). A run that finishes first wakes it at once, as it can then never reach the status.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .store.base import RunRecord, Store
from .types import TERMINAL

log = logging.getLogger("tether.hub")

FINAL_EVENTS = frozenset({"completed", "failed", "cancelled"})
_TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")


def valid_traceparent(value: str | None) -> str | None:
    """`value` if it is a W3C traceparent of version 00, else None (an invalid one is
    ignored, as the W3C recommendation says)."""
    if isinstance(value, str) and _TRACEPARENT.fullmatch(value.strip()):
        return value.strip()
    return None


if TYPE_CHECKING:
    from .retry import FailureCategory
    from .store.base import EffectRecord, NewRun


class Driver(Protocol):
    """A local worker, as the hub sees it."""

    id: str
    concurrency: int

    def driving(self, thread_id: str) -> bool: ...

    @property
    def active(self) -> int: ...


class RunObserver(Protocol):
    """What an observer hears about one run while a worker drives it: from its claim (or its
    start in this process) until it parks, finishes, fails or is given back. Times are
    seconds since the epoch (time.time()). Called on the worker's loop: must not block."""

    def call(self, step: int, name: str, replayed: bool, started: float, finished: float,
             llm: Mapping[str, Any] | None = None) -> None:
        """A journaled call of the step in flight: made now, or its recorded result replayed;
        `llm`: OpenTelemetry's gen_ai.* attributes of a model call made now (model, token
        usage: tether.llm.gen_ai_attributes), else None."""

    def step(self, step: int, node: str, attempt: int, started: float, finished: float,
             status: str, received: int, sent: int) -> None:
        """The step committed; `status` is the run's after it (running, completed, waiting...);
        it consumed `received` messages and sent `sent`."""

    def parked(self, step: int, node: str, attempt: int, started: float, kind: str) -> None:
        """The step suspended the run (kind: interrupt, sleep, join)."""

    def failed(self, step: int, node: str | None, attempt: int, started: float,
               category: FailureCategory, exc: BaseException, final: bool) -> None:
        """The step failed: retried later (`final` False) or the run failed for good."""

    def released(self, reason: str) -> None:
        """The worker stopped driving the run without ending it (reason: lease_lost,
        store_unavailable or another failure category, shutdown, cancelled, superseded)."""


class Observer(Protocol):
    """Something told what the workers of this process do (tether.observe has a Prometheus
    and an OpenTelemetry one). Each method is called on the event loop and must not block."""

    def run_created(self, new: NewRun, parent: RunRecord | None, traceparent: str | None,
                    at: float) -> str | None:
        """A run is being created in this process (started, forked, or spawned by `parent`'s
        step), `traceparent` the caller's trace context if any: the trace context to store
        with it (None: nothing to store)."""

    def run_observer(self, run: RunRecord, worker: str) -> RunObserver | None:
        """A worker begins to drive `run` (as claimed or created): what hears about it."""

    def effect(self, effect: EffectRecord, outcome: str, started: float, finished: float) -> None:
        """An effect handler ran: outcome done, retry, dead or lost (lease lost before done)."""

    def worker_started(self, worker: Driver) -> None: ...

    def worker_stopped(self, worker: Driver) -> None: ...


class _FanOut:
    """Several observers of one run, told in turn."""

    __slots__ = ("_all",)

    def __init__(self, observers: list[RunObserver]) -> None:
        self._all = observers

    def call(self, step: int, name: str, replayed: bool, started: float, finished: float,
             llm: Mapping[str, Any] | None = None) -> None:
        for o in self._all:
            o.call(step, name, replayed, started, finished, llm)

    def step(self, step: int, node: str, attempt: int, started: float, finished: float,
             status: str, received: int, sent: int) -> None:
        for o in self._all:
            o.step(step, node, attempt, started, finished, status, received, sent)

    def parked(self, step: int, node: str, attempt: int, started: float, kind: str) -> None:
        for o in self._all:
            o.parked(step, node, attempt, started, kind)

    def failed(self, step: int, node: str | None, attempt: int, started: float,
               category: FailureCategory, exc: BaseException, final: bool) -> None:
        for o in self._all:
            o.failed(step, node, attempt, started, category, exc, final)

    def released(self, reason: str) -> None:
        for o in self._all:
            o.released(reason)


@dataclass(slots=True)
class Finished:
    """How a waited-for run ended, as far as this process knows: the `step` and final `state`
    a local worker handed over and the run's `record` as that step committed it (each None or
    -1 when the run finished elsewhere, or was cancelled)."""

    step: int = -1
    state: dict[str, Any] | None = None
    record: RunRecord | None = None


class _ReadFailed(Exception):
    """The shared read of EventHub.status_of failed."""


@dataclass(slots=True)
class _Waiting:
    """The waiters of one run: woken together; the handed-over state goes to the first."""

    event: asyncio.Event
    count: int = 0
    finished: Finished | None = None


class EventHub:
    def __init__(self, store: Store, poll_interval: float) -> None:
        self._store = store
        self._poll_interval = poll_interval
        self._subscribers: dict[str, set[asyncio.Queue[dict[str, Any]]]] = {}
        self._waiting: dict[str, _Waiting] = {}
        self._status_waiting: dict[str, list[tuple[frozenset[str], asyncio.Event]]] = {}
        self._poller: asyncio.Task[None] | None = None
        self._lookups: list[tuple[str, asyncio.Future[str | None]]] = []  # see status_of
        self._reading: set[asyncio.Task[None]] = set()  # the status reads in flight
        self._drivers: list[Driver] = []
        self.observers: list[Observer] = []
        """Attached observers; empty (falsy) when nobody observes, the common case."""

    # -- live events -----------------------------------------------------------------------

    async def subscribe(self, thread_id: str) -> AsyncIterator[dict[str, Any]]:
        """The run's events emitted in this process from now on; ends after a final one."""
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=10_000)
        self._subscribers.setdefault(thread_id, set()).add(queue)
        try:
            while True:
                event = await queue.get()
                yield event
                if event["type"] in FINAL_EVENTS:
                    return
        finally:
            subs = self._subscribers.get(thread_id)
            if subs is not None:
                subs.discard(queue)
                if not subs:
                    del self._subscribers[thread_id]

    def watched(self, thread_id: str) -> bool:
        """Someone in this process subscribes to the run's events (else emit() drops them)."""
        return thread_id in self._subscribers

    def emit(self, thread_id: str, event: dict[str, Any]) -> None:
        """Deliver an event to this process's subscribers of the run (slow ones drop events)."""
        subs = self._subscribers.get(thread_id)
        if not subs:
            return
        event = {"thread_id": thread_id, **event}
        for queue in subs:
            if not queue.full():
                queue.put_nowait(event)

    # -- local workers ---------------------------------------------------------------------

    def attach(self, driver: Driver) -> None:
        self._drivers.append(driver)
        for o in self.observers:
            o.worker_started(driver)

    def detach(self, driver: Driver) -> None:
        self._drivers.remove(driver)
        for o in self.observers:
            o.worker_stopped(driver)

    @property
    def drivers(self) -> tuple[Driver, ...]:
        return tuple(self._drivers)

    # -- observers -------------------------------------------------------------------------

    def observe(self, observer: Observer) -> None:
        """Attach an observer (before the workers start, to hear about every run)."""
        self.observers.append(observer)
        for d in self._drivers:
            observer.worker_started(d)

    def unobserve(self, observer: Observer) -> None:
        self.observers.remove(observer)

    def observe_run(self, run: RunRecord, worker: str) -> RunObserver | None:
        """What hears about `run` while `worker` drives it; None when nobody observes."""
        if len(self.observers) == 1:
            return self.observers[0].run_observer(run, worker)
        found = [o for o in (ob.run_observer(run, worker) for ob in self.observers)
                 if o is not None]
        if not found:
            return None
        return found[0] if len(found) == 1 else _FanOut(found)

    def run_created(self, new: NewRun, parent: RunRecord | None = None,
                    traceparent: str | None = None, at: float = 0.0) -> str | None:
        """The trace context to store with a run being created (the first an observer gives),
        else `traceparent` as given."""
        traceparent = valid_traceparent(traceparent)
        for o in self.observers:
            found = o.run_created(new, parent, traceparent, at)
            if found is not None:
                return found
        return traceparent

    def effect_done(self, effect: EffectRecord, outcome: str, started: float,
                    finished: float) -> None:
        for o in self.observers:
            o.effect(effect, outcome, started, finished)

    def driving(self, thread_id: str) -> bool:
        """A worker of this process runs this run now (so it exists and will notify)."""
        return any(d.driving(thread_id) for d in self._drivers)

    # -- waiters ---------------------------------------------------------------------------

    def notify_finished(self, thread_id: str, step: int = -1,
                        state: dict[str, Any] | None = None,
                        record: RunRecord | None = None) -> None:
        """Wake the run's waiters. A worker finishing the run hands over its final `state`
        after `step` (exactly what a replay of the log gives) and, when the store returned
        it, the run's `record` as committed: then a waiter reads nothing."""
        entry = self._waiting.get(thread_id)
        if entry is not None:
            # The poller's word (no state) never replaces a worker's handed-over state that
            # no waiter has taken yet: it may see the run's end before its waiters run.
            if state is not None or entry.finished is None or entry.finished.state is None:
                entry.finished = Finished(step, state, record)
            entry.event.set()
        for _, event in self._status_waiting.get(thread_id, ()):
            event.set()

    def expect(self, thread_id: str) -> _Waiting:
        """A waiter of the run's end, registered now: an end notified from here on reaches
        it. Then wait with `finished` (which unregisters it), or unregister it with
        `forget`."""
        entry = self._waiting.get(thread_id)
        if entry is None:
            entry = self._waiting[thread_id] = _Waiting(asyncio.Event())
        entry.count += 1
        return entry

    def forget(self, thread_id: str, entry: _Waiting) -> None:
        """Unregister a waiter `expect` registered that will not wait after all."""
        entry.count -= 1
        if entry.count <= 0 and self._waiting.get(thread_id) is entry:
            del self._waiting[thread_id]

    async def finished(self, thread_id: str, entry: _Waiting,
                       timeout: float | None) -> Finished:
        """Until the run's end is notified here or seen by the poller (TimeoutError after
        `timeout` seconds), for a waiter `expect` registered. Only the first of several
        waiters gets the handed-over state."""
        try:
            self._start_poller()
            async with asyncio.timeout(timeout):
                await entry.event.wait()
        finally:
            self.forget(thread_id, entry)
        finished = entry.finished or Finished()
        if finished.state is not None:
            entry.finished = Finished(finished.step, None, finished.record)
        return finished

    async def wait_status(self, thread_id: str, statuses: frozenset[str],
                          timeout: float | None) -> None:
        """Until the poller sees the run in one of `statuses` (or gone), or its end is
        notified here (TimeoutError after `timeout` seconds). The caller reads the run."""
        entry = (statuses, asyncio.Event())
        self._status_waiting.setdefault(thread_id, []).append(entry)
        self._start_poller()
        try:
            async with asyncio.timeout(timeout):
                await entry[1].wait()
        finally:
            waiters = self._status_waiting[thread_id]
            waiters.remove(entry)
            if not waiters:
                del self._status_waiting[thread_id]

    async def status_of(self, thread_id: str) -> str | None:
        """The run's status (None: no such run), read in one query with those that every
        other caller of this loop iteration asks for: 10,000 `runtime.wait` calls gathered
        make one read, not 10,000."""
        fut: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        if not self._lookups:  # the read runs once this iteration's callers have asked
            task = asyncio.create_task(self._read_statuses())
            self._reading.add(task)
            task.add_done_callback(self._reading.discard)
        self._lookups.append((thread_id, fut))
        try:
            return await fut
        except _ReadFailed:  # each caller then reads its own (and raises its own error)
            rec = await self._store.get_run(thread_id)
            return None if rec is None else rec.status

    async def _read_statuses(self) -> None:
        asked, self._lookups = self._lookups, []
        try:
            statuses = await self._store.run_statuses(list({tid for tid, _ in asked}))
        except BaseException as exc:
            log.debug("reading %d runs' statuses failed: %s", len(asked), exc)
            for _, fut in asked:
                if not fut.done():
                    fut.set_exception(_ReadFailed())
            if not isinstance(exc, Exception):
                raise
            return
        for tid, fut in asked:
            if not fut.done():  # (a waiter that timed out cancelled its own)
                fut.set_result(statuses.get(tid))

    def _start_poller(self) -> None:
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll())

    async def _poll(self) -> None:
        """Wake waiters whose runs finished elsewhere (another process's worker), and status
        waiters whose runs reached a wanted status (anywhere)."""
        while self._waiting or self._status_waiting:
            # One query covers every waiter, and its cost grows with their number: with many
            # waiters poll less often, so the poller costs about one 1,000-id lookup per poll
            # interval. Runs driven by a worker in this process wake their waiters at once.
            n = len(self._waiting) + len(self._status_waiting)
            await asyncio.sleep(self._poll_interval * max(1.0, n / 1000))
            drivers = self._drivers
            if len(drivers) == 1:  # the common case: one bound method, no generator a run
                driving = drivers[0].driving
                finishing = [tid for tid in self._waiting if not driving(tid)]
            else:
                finishing = [tid for tid in self._waiting if not self.driving(tid)]
            ids = list({*finishing, *self._status_waiting})
            if not ids:
                continue
            try:
                statuses = await self._store.run_statuses(ids)
            except Exception:  # a store outage must not kill the waiters' only poller
                log.warning("checking finished runs failed; retrying", exc_info=True)
                continue
            for tid in finishing:
                status = statuses.get(tid)
                if status is None or status in TERMINAL:
                    self.notify_finished(tid)
            for tid in ids:
                status = statuses.get(tid)
                for wanted, event in self._status_waiting.get(tid, ()):
                    if status is None or status in TERMINAL or status in wanted:
                        event.set()

    def waited(self) -> frozenset[str]:
        """The runs someone in this process waits for now (introspection)."""
        return frozenset(self._waiting)

    def close(self) -> None:
        for task in list(self._reading):
            task.cancel()
        if self._poller is not None:
            self._poller.cancel()
            self._poller = None
