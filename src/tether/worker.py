"""The worker: claim -> load -> run node -> commit, for many runs at once.

One asyncio.TaskGroup holds the claimer (this coroutine), the heartbeat and one task per
leased run. A run task keeps its lease across steps, so a run's state stays in memory from
step to step and is replayed from the log only when the run is claimed. Every commit carries
the lease's fencing epoch; a refused commit (LeaseLost) abandons the run without side effects.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import socket
import time
import weakref
from concurrent.futures import Executor, ProcessPoolExecutor
from typing import Any

from . import serde
from .agent import Agent, Command
from .calls import retry_delay
from .config import Settings
from .context import Context, Message, Suspend
from .errors import DefinitionError, LeaseLost, StoreError, StoreUnavailable
from .history import load_state, state_from
from .hub import EventHub, RunObserver
from .leases import Renewals
from .outbox import Dispatcher
from .registry import Registry
from .retry import FINAL_CATEGORIES, FailureCategory, categorize
from .state import apply_delta, delta_of, encode_delta
from .store.base import (
    ClaimedReads,
    Lease,
    Park,
    RunRecord,
    StepCommit,
    Store,
    WorkerBeat,
    never_ran,
)
from .worker_records import agents_json, error_json, report_stranded, worker_id

log = logging.getLogger("tether.worker")
STRANDED_EVERY = 5.0
"""Seconds between a worker's checks for stranded runs of other versions, at least (twice
the lease TTL when that is longer)."""
_RUNNING: weakref.WeakSet[Worker] = weakref.WeakSet()
"""The workers running in this process (see `co_resident`)."""


class Worker:
    """Runs steps of claimable runs of `registry.version` until stopped.

    Given its parts, never the Runtime: the `store` it claims from and commits to, the
    `registry` of agents and effect handlers it serves, and the `hub` it tells about events
    and finished runs (the only way anything flows from here up to the process's users)."""

    def __init__(
        self,
        store: Store,
        registry: Registry,
        hub: EventHub,
        settings: Settings,
        *,
        concurrency: int,
        claim_batch: int = 1000,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.store = store
        self.registry = registry
        self.hub = hub
        self.settings = settings
        self.id = worker_id()
        self.concurrency = concurrency
        self.claim_batch = claim_batch
        self.steps_committed = 0
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._leases: dict[str, Lease] = {}
        self._renewals = Renewals(  # the leases' deadlines, and their renewal
            store, self.id, settings.lease_ttl, driving=lambda: set(self._tasks),
            lost=self._lease_gone, current=lambda le: self._leases.get(le.thread_id) is le)
        self._abandoned: dict[Lease, str] = {}  # lease -> why its task was cancelled
        self._orphans: dict[str, Lease] = {}
        self._stopping = False
        self.stopped = asyncio.Event()
        """Set once run() has returned: its leases given back (or their release tried)."""
        self.given_back = 0
        """At shutdown: the runs whose leases it gave back (any worker resumes them now)."""
        self.still_leased = 0
        """At shutdown: leases it could not give back (they expire after the lease TTL)."""
        self.effects_given_back = 0
        """At shutdown: effects whose handler it stopped (pending again, for any worker)."""
        self._tg: asyncio.TaskGroup | None = None
        self._reserved = 0  # slots promised to runs being started in this process
        self._full = False  # the claim loop waits for a free slot: a run's end wakes it
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cpu_pool: ProcessPoolExecutor | None = None  # made by the first ctx.cpu_call
        self._agents_json = "{}"
        self.dispatcher = Dispatcher(
            store, registry.effect_handlers, self.id, lease_ttl=self.settings.lease_ttl,
            poll_interval=self.settings.poll_interval)

    def __repr__(self) -> str:
        return f"Worker({self.id!r}, active={len(self._tasks)})"

    # -- control ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; in-flight steps finish (up to the grace period) and their runs are
        released for other workers."""
        self._stopping = True
        self.store.work_available.set()

    def cancel_local(self, thread_id: str, reason: str = "cancelled") -> None:
        """Abandon a run this worker is driving (reason: cancelled, lease_lost, superseded)."""
        task = self._tasks.get(thread_id)
        lease = self._leases.get(thread_id)
        if task is not None and not task.done() and lease is not None:
            self._abandoned[lease] = reason
            task.cancel()

    @property
    def active(self) -> int:
        return len(self._tasks)

    def driving(self, thread_id: str) -> bool:
        """This worker runs the run now (its task notifies waiters if it finishes it)."""
        return thread_id in self._tasks

    # -- runs started in this process ------------------------------------------------------
    # Runtime.start asks for a slot first; if it gets one, the run is inserted already leased
    # to this worker (no claim, no wake-up, no reads: a new run has no journal, checkpoints or
    # mail yet) and handed over with adopt(). Runs from elsewhere still come through claims.

    def reserve(self) -> bool:
        """Take a free slot for a run about to be started here (release it with adopt() or
        unreserve())."""
        if (self._tg is None or self._stopping
                or len(self._tasks) + self._reserved >= self.concurrency):
            return False
        self._reserved += 1
        return True

    def unreserve(self) -> None:
        self._reserved -= 1

    def adopt(self, rec: RunRecord, since: float | None = None) -> bool:
        """Drive a run created leased to this worker (uses the slot reserve() took); `since`:
        time.monotonic() when its insert was sent (its lease runs from then). False if the
        worker is stopping: the caller must release the run."""
        self.unreserve()
        if self._tg is None or self._stopping:
            return False
        lease = Lease(rec.thread_id, self.id, rec.epoch)
        self._leases[rec.thread_id] = lease
        self._renewals.track(lease, time.monotonic() if since is None else since)
        self._tasks[rec.thread_id] = self._tg.create_task(self._drive(rec, lease, fresh=True))
        return True

    # -- main loop -------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event | None = None) -> None:
        log.info("worker %s starting (version %s, concurrency %d, lease %.1fs)",
                 self.id, self.registry.version, self.concurrency, self.settings.lease_ttl)
        self._loop = asyncio.get_running_loop()
        _RUNNING.add(self)
        self.hub.attach(self)
        if self.hub.observers:
            self.dispatcher.observe = self.hub.effect_done
        try:
            await self._run(stop)
        finally:
            _RUNNING.discard(self)
            self.hub.detach(self)
            self.stopped.set()
        log.info("worker %s stopped after %d steps", self.id, self.steps_committed)

    async def _run(self, stop: asyncio.Event | None) -> None:
        self._agents_json = agents_json(self.registry)
        try:
            await self._serve(stop)
        finally:
            try:
                await self.store.deploys.stop_worker(self.id)
            except StoreError as exc:
                log.warning("could not deregister worker %s (it shows as dead after %.1fs): "
                            "%s", self.id, self.settings.lease_ttl, exc)

    async def _beat(self) -> None:
        """Register this worker or renew its registry row (one statement)."""
        try:
            await self.store.deploys.beat_worker(WorkerBeat(
                id=self.id, host=socket.gethostname(), pid=os.getpid(),
                version=self.registry.version, agents=self._agents_json,
                concurrency=self.concurrency, busy=len(self._tasks),
                lease_ttl=self.settings.lease_ttl))
        except StoreError as exc:
            log.warning("worker heartbeat failed: %s", exc)

    async def _serve(self, stop: asyncio.Event | None) -> None:
        async with asyncio.TaskGroup() as tg:
            self._tg = tg  # before any await: runs started here may be handed over from now
            heartbeat = tg.create_task(self._heartbeat())
            dispatch = tg.create_task(self.dispatcher.run(tg))
            watcher = tg.create_task(self._watch(stop)) if stop is not None else None
            try:
                await self._beat()  # registered before the first claim
                await self._claim_loop(tg)
            finally:
                self._stopping = True
                self.dispatcher.stop()
                await self._drain()
                self._tg = None
                if self._cpu_pool is not None:
                    pool, self._cpu_pool = self._cpu_pool, None
                    await asyncio.to_thread(pool.shutdown, True, cancel_futures=True)
                heartbeat.cancel()
                dispatch.cancel()
                if watcher is not None:
                    watcher.cancel()

    async def _watch(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self.stop()

    async def _claim_loop(self, tg: asyncio.TaskGroup) -> None:
        wake = self.store.work_available
        agents = list(self.registry.agents)
        poll = self.settings.poll_interval
        while not self._stopping:
            free = self.concurrency - len(self._tasks) - self._reserved
            wake.clear()
            self._full = free <= 0
            if free > 0:
                want = min(free, self.claim_batch)
                since = time.monotonic()  # the claimed leases run from (at the latest) now
                try:
                    claimed = await self.store.claim_runs(
                        self.id, self.registry.version, agents, want, self.settings.lease_ttl
                    )
                except StoreError as exc:
                    log.warning("claim failed, retrying in %.1fs: %s", poll, exc)
                    claimed = []
                reads = await self._load_claimed(claimed)
                for rec in claimed:
                    if self._stopping:
                        self._orphans[rec.thread_id] = Lease(rec.thread_id, self.id, rec.epoch)
                        continue
                    # Our own lease expired (a blocked loop) and we re-claimed the run: the old
                    # task's epoch is stale, so abandon it before the new one takes its place.
                    self.cancel_local(rec.thread_id, "superseded")
                    if rec.taken_from is not None and rec.taken_from != self.id:
                        log.info("worker %s: took over run %s from worker %s (its lease "
                                 "expired)", self.id, rec.thread_id, rec.taken_from)
                    lease = Lease(rec.thread_id, self.id, rec.epoch)
                    self._leases[rec.thread_id] = lease
                    self._renewals.track(lease, since)
                    self._tasks[rec.thread_id] = tg.create_task(self._drive(
                        rec, lease, reads=None if reads is None else reads.get(rec.thread_id)))
                if len(claimed) == want:
                    await asyncio.sleep(0)
                    continue
            try:
                async with asyncio.timeout(poll):
                    await wake.wait()
            except TimeoutError:
                pass

    async def _drain(self) -> None:
        """Shutdown: let in-flight steps finish within the grace period, then cancel the
        rest and release every lease still held so other workers resume at once."""
        self._stopping = True
        grace = self.settings.shutdown_grace
        if self._tasks:
            pending = list(self._tasks.values())
            log.info("worker %s: finishing %d in-flight steps", self.id, len(pending))
            _, late = await asyncio.wait(pending, timeout=grace)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)
        self.effects_given_back = await self.dispatcher.give_back(timeout=grace)
        leases = list(self._orphans.values()) + list(self._leases.values())
        self._orphans.clear()
        if leases:
            try:
                await self.store.release_runs(leases)
                self.given_back += len(leases)
            except StoreError as exc:
                self.still_leased = len(leases)
                log.warning("could not release %d leases (they expire in %.1fs): %s",
                            len(leases), self.settings.lease_ttl, exc)

    async def _heartbeat(self) -> None:
        interval = self.settings.lease_ttl / 3
        report_every = max(2 * self.settings.lease_ttl, STRANDED_EVERY)
        reported = time.monotonic()
        while True:
            await asyncio.sleep(interval)
            await self._beat()
            if time.monotonic() - reported >= report_every:
                reported = time.monotonic()
                await report_stranded(self.store, self.registry.version, self.settings.lease_ttl)
            try:
                if self._orphans:
                    orphans = list(self._orphans.values())
                    await self.store.release_runs(orphans)
                    for le in orphans:
                        self._orphans.pop(le.thread_id, None)
                if self.dispatcher.active:
                    await self.store.renew_effect_leases(self.id, self.settings.lease_ttl)
                if self._tasks:
                    await self._renewals.renew()
            except StoreError as exc:
                log.warning("heartbeat failed: %s", exc)

    def _lease_gone(self, thread_id: str) -> None:
        if thread_id in self._tasks:
            log.info("lost lease on %s; abandoning its in-flight step", thread_id)
            self.cancel_local(thread_id, FailureCategory.LEASE_LOST.value)

    # -- one run ---------------------------------------------------------------------------

    async def _load_claimed(self, claimed: list[RunRecord]) -> dict[str, ClaimedReads] | None:
        """What the claimed runs' first steps read, for all of them at once (None: not read,
        so each run reads its own)."""
        if not claimed:
            return {}
        try:
            return await self.store.load_claimed(claimed)
        except StoreError as exc:
            log.debug("reads of %d claimed runs failed: %s", len(claimed), exc)
            return None

    async def _drive(self, rec: RunRecord, lease: Lease, fresh: bool = False,
                     reads: ClaimedReads | None = None) -> None:
        """A run's task: run steps until the run parks, finishes, fails or is released.
        `fresh`: created just now leased to us, so it has no checkpoints, journal or mail to
        read yet (mail sent from now on is seen at its next step, as for any run mid-step);
        `reads`: claimed, and what its first step reads was read with the claim's other
        runs (Store.load_claimed); None: it reads its own.
        One coroutine, not a wrapper around another: every resume of a step passes through
        each level of the chain (here, the node, ctx.call, ...), one cache miss or more each
        with thousands of runs in flight."""
        thread_id = rec.thread_id
        registry, hub, store = self.registry, self.hub, self.store
        obs = hub.observe_run(rec, self.id) if hub.observers else None
        clock = self._renewals.clock(lease)
        try:
            agent = registry.agents.get(rec.agent)
            if agent is None:  # not claimable by us; claim filters by agent
                raise DefinitionError(f"agent {rec.agent!r} is not registered in this worker")
            if reads is not None:
                state, since_snapshot = state_from(rec, reads.checkpoints)
                journal, mail = reads.journal, reads.inbox
            else:
                state, since_snapshot = await load_state(store, rec)
                # A run that never ran (epoch 1 from a claim; runs routed to another
                # version's worker start so) has no journal.
                journal = ([] if fresh or never_ran(rec)
                           else await store.load_journal(rec.thread_id, rec.step + 1))
                mail = [] if fresh else await store.load_inbox(rec.thread_id)
            inbox = [Message(m.id, m.sender, serde.loads(m.message), m.created_at)
                     for m in mail]
            step, node_name, attempt, failures = rec.step, rec.node, rec.attempt, rec.failures
            snapshot_every = self.settings.snapshot_every
            while True:
                step += 1
                if clock is not None and clock.expiring():
                    await clock.refresh(lease)  # no step on a lease about to expire
                started = time.time()
                try:
                    if node_name is None:
                        raise DefinitionError(f"run {rec.thread_id!r} has no next node")
                    node = agent.get_node(node_name)
                    ctx = Context(store=store, lease=lease, agent=agent.name, node=node_name,
                                  step=step, attempt=attempt, journal=journal, sink=hub.emit,
                                  effect_handlers=registry.effect_handlers, inbox=inbox,
                                  agents=registry.agents, version=registry.version,
                                  observer=obs, cpu=self._cpu, clock=clock)
                    if inbox:
                        hub.emit(rec.thread_id, {"type": "processing", "step": step,
                                                     "inbox": len(inbox)})
                    try:
                        cmd = await node.fn(dict(state), ctx)
                    except Suspend as suspend:
                        await self._park(lease, step, node_name, suspend.park)
                        if obs is not None:
                            obs.parked(step, node_name, attempt, started, suspend.park.kind)
                        return
                    next_node = _check_command(agent, node_name, cmd)
                    parks = cmd.kind == "receive"
                    delta = delta_of(state, cmd.update)
                    data, decoded = encode_delta(delta, node_name, agent.typed_state)
                    # The next step sees exactly what a replay from the log would see.
                    apply_delta(state, decoded)
                    kind = "d"
                    if since_snapshot + 1 >= snapshot_every:
                        kind, data = "s", serde.dumps(state, "state", typed=agent.typed_state)
                        since_snapshot = 0
                    else:
                        since_snapshot += 1
                except (LeaseLost, StoreError):
                    raise
                except Exception as exc:
                    failures += 1
                    await self._failed(agent, node_name, lease, failures, exc, obs, step,
                                       attempt, started)
                    return
                if parks:
                    status = "waiting"
                elif next_node is None:
                    status = "completed"
                else:
                    status = "queued" if self._stopping else "running"
                ended = time.time()
                try:
                    finished = await store.commit_step(StepCommit(
                        lease=lease, step=step, node=node_name or "", next_node=next_node, kind=kind,
                        data=data, attempt=attempt, started_at=started, finished_at=ended,
                        status=status, waiting_for="mail" if parks else None, effects=ctx.effects,
                        children=ctx.children, messages=ctx.messages, groups=ctx.groups,
                        consumed=[m.id for m in inbox] if inbox else (), run=rec,
                        lease_ttl=self.settings.lease_ttl,
                    ))
                except (LeaseLost, StoreError):
                    raise
                except Exception as exc:  # a duplicate effect key or a failed transactional effect
                    failures += 1
                    await self._failed(agent, node_name, lease, failures, exc, obs, step,
                                       attempt, started)
                    return
                self.steps_committed += 1
                if status == "queued":  # finished within the shutdown's grace: given back
                    self.given_back += 1
                if obs is not None:
                    obs.step(step, node_name, attempt, started, ended, status, len(inbox),
                             len(ctx.messages))
                if hub.watched(thread_id):
                    _step_events(hub, thread_id, step, node_name, next_node, status,
                                 received=bool(inbox), sent=len(ctx.messages))
                if status != "running":
                    self._forget(lease)
                    if status == "completed":
                        hub.notify_finished(rec.thread_id, step, state, finished)
                    return
                node_name, attempt, failures, journal, inbox = next_node, 1, 0, [], []
        except asyncio.CancelledError:
            if lease in self._abandoned or self._leases.get(thread_id) is not lease:
                if obs is not None:  # cancelled, lease lost, or superseded by our own re-claim
                    obs.released(self._abandoned.get(lease, "superseded"))
                return
            self._orphans[thread_id] = lease
            if obs is not None:
                obs.released("shutdown")
            raise
        except LeaseLost as exc:
            log.info("%s", exc)
            if obs is not None:
                obs.released(FailureCategory.LEASE_LOST.value)
        except Exception as exc:
            # A store outage or an internal error: give the run back rather than hold it.
            outage = isinstance(exc, StoreUnavailable)  # (said in one line, no traceback)
            log.log(logging.WARNING if outage else logging.ERROR, "run %s: step aborted (%s); "
                    "the run is released for retry", thread_id, exc, exc_info=not outage)
            self._orphans[thread_id] = lease
            if obs is not None:
                obs.released(categorize(exc).value)
        finally:
            # Only clear the entries if they are still ours (a re-claim may have replaced them).
            self._abandoned.pop(lease, None)
            if self._leases.get(thread_id, lease) is lease:
                self._tasks.pop(thread_id, None)
                self._forget(lease)
            if self._full:  # else the last claim found no more work than it had slots for
                self.store.work_available.set()

    async def _park(self, lease: Lease, step: int, node_name: str, park: Park) -> None:
        """The node suspended (an interrupt or a sleep): park the run and say so."""
        await self.store.park_run(lease, park)
        self._forget(lease)
        if park.kind == "interrupt":
            self.hub.emit(lease.thread_id, {
                "type": "interrupted", "step": step, "node": node_name,
                "interrupt_id": park.interrupt_id,
                "payload": serde.loads(park.payload or b"null")})
        else:
            self.hub.emit(lease.thread_id, {"type": "sleeping", "step": step,
                                                "node": node_name, "seconds": park.seconds})

    def _cpu(self) -> Executor:
        """The worker's process pool for ctx.cpu_call (settings.cpu_workers processes, or one
        per CPU), made when first needed: a worker that never offloads starts no process.
        Forkserver, not fork: a fork of this process would copy its threads' locks (the
        store's writer, the pool's own) in whatever state they are."""
        if self._cpu_pool is None:
            methods = multiprocessing.get_all_start_methods()
            context = multiprocessing.get_context("forkserver" if "forkserver" in methods else None)
            self._cpu_pool = ProcessPoolExecutor(
                max_workers=self.settings.cpu_workers or os.cpu_count() or 1, mp_context=context)
        return self._cpu_pool

    def _forget(self, lease: Lease) -> None:
        """Stop tracking a lease that was released, parked or finished (if still current)."""
        if self._leases.get(lease.thread_id) is lease:
            del self._leases[lease.thread_id]
        self._renewals.forget(lease)

    async def _failed(
        self, agent: Agent, node_name: str | None, lease: Lease, failures: int, exc: Exception,
        obs: RunObserver | None, step: int, attempt: int, started: float,
    ) -> None:
        category = categorize(exc)
        delay: float | None = None
        if category not in FINAL_CATEGORIES:
            node = agent.nodes.get(node_name or "")
            policy = agent.retry_for(node) if node is not None else agent.retry
            # A provider's request error (4xx) is never retried, its rate limits, timeouts
            # and 5xx never sooner than their Retry-After (calls.retry_delay).
            delay = retry_delay(policy, failures, exc)
        error = error_json(category, exc, failures, node_name)
        if obs is not None:
            obs.failed(step, node_name, attempt, started, category, exc, delay is None)
        if delay is None:
            log.warning("run %s failed (%s) at node %s: %r", lease.thread_id, category.value,
                        node_name, exc)
            await self.store.fail_step(lease, failures=failures, wake_at=None, error=error,
                                       final=True, compensate=self.registry.compensable)
            self._forget(lease)
            self.hub.emit(lease.thread_id, {"type": "failed", "category": category.value,
                                                "error": f"{type(exc).__name__}: {exc}"})
            self.hub.notify_finished(lease.thread_id)
            return
        log.info("run %s: attempt %d of node %s failed (%r); retry in %.2fs",
                 lease.thread_id, failures, node_name, exc, delay)
        self.hub.emit(lease.thread_id, {"type": "retrying", "category": category.value,
                                        "failures": failures, "delay": delay,
                                        "error": f"{type(exc).__name__}: {exc}"})
        wake_at = await self.store.now() + delay
        await self.store.fail_step(lease, failures=failures, wake_at=wake_at, error=error,
                                   final=False)
        self._forget(lease)


def _step_events(hub: EventHub, thread_id: str, step: int, node: str, next_node: str | None,
                 status: str, received: bool, sent: int) -> None:
    """The events of a committed step, for the run's subscribers in this process."""
    hub.emit(thread_id, {"type": "step", "step": step, "node": node,
                             "next_node": next_node, "status": status})
    if received or sent:
        hub.emit(thread_id, {"type": "response", "step": step, "sent": sent})
    if status == "waiting":
        hub.emit(thread_id, {"type": "idle", "step": step})
    if status == "completed":
        hub.emit(thread_id, {"type": "completed", "step": step})


def _check_command(agent: Agent, node_name: str | None, cmd: Any) -> str | None:
    """The next node of a valid command (None when the run finishes)."""
    if not isinstance(cmd, Command):
        raise DefinitionError(
            f"node {node_name!r} of agent {agent.name!r} returned {type(cmd).__name__!r}; "
            "a node must return tether.goto(node, update) or tether.finish(update)"
        )
    if cmd.kind == "finish":
        return None
    if cmd.kind == "receive":
        return node_name
    if cmd.kind == "goto" and cmd.node is not None:
        agent.get_node(cmd.node)
        return cmd.node
    raise DefinitionError(f"node {node_name!r} returned an unsupported command {cmd!r}")


def co_resident(store: Store, version: str, agent: str) -> list[Worker]:
    """The workers running in this process, on this event loop, that serve `agent` on
    `version` with the database `store` is on (the same store, or one with the same URL, an
    in-memory database aside): another runtime's, say, of the version a run was routed to.
    A run started here for one of them is handed to it as to the runtime's own workers."""
    loop = asyncio.get_running_loop()
    same_db = ":memory:" not in store.url
    return [w for w in _RUNNING
            if w._loop is loop and w.registry.version == version and agent in w.registry.agents
            and (w.store is store or (same_db and w.store.url == store.url))]
