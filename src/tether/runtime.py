"""Runtime: the user's handle on runs. Owns one Store; `work()` runs a worker in-process."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from . import serde
from .agent import Agent
from .config import Settings
from .context import Message
from .errors import (
    DefinitionError,
    InvalidState,
    ResumeConflict,
    RunNotFound,
    SerializationError,
)
from .outbox import EffectHandler, make_handler
from .retry import RetryPolicy
from .state import replay
from .store import make_store
from .store.base import (
    TERMINAL,
    CheckpointRecord,
    EffectRecord,
    InterruptRecord,
    Lease,
    NewRun,
    RunRecord,
    Store,
)

F = TypeVar("F", bound=Callable[..., Any])
log = logging.getLogger("tether.runtime")


class RunStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    SLEEPING = "sleeping"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value

    @property
    def terminal(self) -> bool:
        return self.value in TERMINAL


@dataclass(frozen=True, slots=True)
class RunError:
    """Why a run failed: a category (see retry.FailureCategory), the exception and traceback."""

    category: str
    type: str
    message: str
    traceback: str

    def __str__(self) -> str:
        return f"[{self.category}] {self.type}: {self.message}"


@dataclass(frozen=True, slots=True)
class Run:
    thread_id: str
    agent: str
    status: RunStatus
    state: dict[str, Any]
    step: int
    version: str
    node: str | None
    attempt: int
    error: RunError | None
    created_at: float
    updated_at: float
    idempotency_key: str | None = None
    parent_thread_id: str | None = None
    forked_from: str | None = None
    forked_step: int | None = None
    lease_owner: str | None = None
    wake_at: float | None = None
    waiting_for: str | None = None
    inbox_depth: int | None = None
    """Unconsumed messages (filled in by runtime.get)."""

    @property
    def actor_state(self) -> str | None:
        """The actor state of a run that has mail or parks for it: "idle" (parked, no worker
        held) or "processing" (mail delivered, being claimed or processed). "response" is the
        moment its replies commit: an event of `runtime.subscribe`, not a lasting state."""
        if self.waiting_for == "mail":
            return "idle"
        if self.status in (RunStatus.RUNNING, RunStatus.QUEUED) and self.inbox_depth:
            return "processing"
        return None

    def to_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["status"] = self.status.value
        out["actor_state"] = self.actor_state
        out["error"] = None if self.error is None else {
            "category": self.error.category, "type": self.error.type,
            "message": self.error.message, "traceback": self.error.traceback,
        }
        return out


@dataclass(frozen=True, slots=True)
class Checkpoint:
    thread_id: str
    step: int
    node: str
    next_node: str | None
    state: dict[str, Any]
    kind: str
    worker: str
    attempt: int
    started_at: float
    finished_at: float

    @property
    def duration(self) -> float:
        return self.finished_at - self.started_at

    def to_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["duration"] = self.duration
        return out


def run_error(data: bytes | None) -> RunError | None:
    if data is None:
        return None
    d = serde.loads(data)
    return RunError(d.get("category", "exception"), d.get("type", ""), d.get("message", ""),
                    d.get("traceback", ""))


@dataclass(slots=True)
class _Waiting:
    """The waiters of one run: woken together; `state` is the final state a local worker
    handed over with the step it is after (taken by the first waiter), `record` the run's
    row as that step committed it, if the store returned it."""

    event: asyncio.Event
    count: int = 0
    step: int = -1
    state: dict[str, Any] | None = None
    record: RunRecord | None = None


class Runtime:
    """Durable runs of the given agents on one database.

    >>> runtime = Runtime("sqlite:///tether.db", agents=[agent], version="v1")
    >>> run = await runtime.start(agent, {"topic": "x"})
    >>> await runtime.work(concurrency=100)        # in a worker process
    """

    def __init__(
        self,
        db_url: str | None = None,
        *,
        agents: Sequence[Agent] = (),
        version: str = "v1",
        lease_ttl: float | None = None,
        poll_interval: float | None = None,
        snapshot_every: int | None = None,
        store: Store | None = None,
    ) -> None:
        self.settings = Settings.from_env(
            db=db_url, lease_ttl=lease_ttl, poll_interval=poll_interval,
            snapshot_every=snapshot_every,
        )
        if not isinstance(version, str) or not version:
            raise DefinitionError("version must be a non-empty string")
        self.version = version
        self.agents: dict[str, Agent] = {}
        for a in agents:
            self.add_agent(a)
        self.store: Store = store if store is not None else make_store(self.settings.db)
        self._open_lock = asyncio.Lock()
        self._opened = False
        self._finished: dict[str, _Waiting] = {}
        self._poller: asyncio.Task[None] | None = None
        self._subscribers: dict[str, set[asyncio.Queue[dict[str, Any]]]] = {}
        self.effect_handlers: dict[str, EffectHandler] = {}
        self._workers: list[Any] = []

    def __repr__(self) -> str:
        return f"Runtime({self.store.url!r}, version={self.version!r}, agents={list(self.agents)})"

    @property
    def db_url(self) -> str:
        return self.store.url

    def with_db(self, db_url: str, *, lease_ttl: float | None = None) -> Runtime:
        """The same agents, effect handlers and version on another database (or with another
        lease TTL)."""
        other = Runtime(
            db_url,
            agents=list(self.agents.values()),
            version=self.version,
            lease_ttl=lease_ttl if lease_ttl is not None else self.settings.lease_ttl,
            poll_interval=self.settings.poll_interval,
            snapshot_every=self.settings.snapshot_every,
        )
        for h in self.effect_handlers.values():  # re-checked for the other database's dialect
            other.effect_handlers[h.name] = make_handler(
                h.name, h.fn, retry=h.retry, compensate=h.compensate,
                transactional=h.transactional, dialect=other.store.dialect)
        return other

    def add_agent(self, agent: Agent) -> None:
        if not isinstance(agent, Agent):
            raise DefinitionError(f"agents must be tether.Agent instances, got {agent!r}")
        if agent.name in self.agents and self.agents[agent.name] is not agent:
            raise DefinitionError(f"two agents are named {agent.name!r}")
        self.agents[agent.name] = agent

    def effect(
        self,
        name: str,
        *,
        retry: RetryPolicy | None = None,
        compensate: Callable[[Any, str], Awaitable[Any]] | None = None,
        transactional: bool = False,
    ) -> Callable[[F], F]:
        """Register the handler of effect `name`: `async def handler(payload, key) -> result`,
        idempotent on `key`. `retry` (default 10 attempts with backoff) decides when the
        effect is dead; `compensate(payload, key)` undoes it when the run fails or is cancelled
        (it receives {"payload": original payload, "result": original result}).
        `transactional=True`: the handler runs inside the step's own transaction and takes the
        connection first: `handler(conn, payload, key)` (a plain function on SQLite, async on
        Postgres)."""

        def register(fn: F) -> F:
            if name in self.effect_handlers:
                raise DefinitionError(f"effect {name!r} already has a handler")
            self.effect_handlers[name] = make_handler(
                name, fn, retry=retry, compensate=compensate, transactional=transactional,
                dialect=self.store.dialect)
            return fn

        return register

    @property
    def compensable(self) -> list[str]:
        """Names of effects that have a compensate handler."""
        return [h.name for h in self.effect_handlers.values() if h.compensate is not None]

    async def effects(self, thread_id: str | None = None, *, status: str | None = None,
                      limit: int = 1000) -> list[Effect]:
        """The outbox: effects of a run (or all), in request order."""
        await self.open()
        recs = await self.store.list_effects(thread_id=thread_id, status=status, limit=limit)
        return [_effect(r) for r in recs]

    async def retry_effect(self, key: str, thread_id: str | None = None) -> list[Effect]:
        """Retry dead effects with this key now, with a fresh attempt budget."""
        await self.open()
        return [_effect(r) for r in await self.store.retry_effect(key, thread_id)]

    def agent(self, name: str | Agent) -> Agent:
        key = name.name if isinstance(name, Agent) else name
        try:
            return self.agents[key]
        except KeyError:
            raise DefinitionError(
                f"unknown agent {key!r}; this runtime has: {', '.join(self.agents) or 'none'}"
            ) from None

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self) -> Runtime:
        """Connect and check the schema (SchemaError if behind: run `tether migrate`)."""
        if not self._opened:
            async with self._open_lock:
                if not self._opened:
                    await self.store.open()
                    self._opened = True
        return self

    async def migrate(self) -> list[int]:
        """Apply pending schema migrations (what `tether migrate` does)."""
        await self.store.open(check_schema=False)
        try:
            return await self.store.migrate()
        finally:
            await self.store.close()

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            self._poller = None
        if self._opened:
            self._opened = False
            await self.store.close()

    async def __aenter__(self) -> Runtime:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- runs ------------------------------------------------------------------------------

    async def start(
        self,
        agent: Agent | str,
        input: Mapping[str, Any] | None = None,
        thread_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> Run:
        """Create a queued run (the worker picks it up). The same idempotency key, or the same
        thread_id with the same input, returns the existing run; other input is RunConflict."""
        a = self.agent(agent)
        if input is None:
            input = {}
        if not isinstance(input, Mapping):
            raise SerializationError(f"run input must be a dict, got {type(input).__name__!r}")
        data = serde.dumps(dict(input), "input")
        if thread_id is not None and (not isinstance(thread_id, str) or not thread_id
                                      or len(thread_id) > 200 or "\x00" in thread_id):
            raise DefinitionError("thread_id must be a non-empty string of at most 200 "
                                  "characters, without NUL")
        if idempotency_key is not None and (not isinstance(idempotency_key, str)
                                            or "\x00" in idempotency_key):
            raise DefinitionError("idempotency_key must be a string without NUL")
        await self.open()
        new = NewRun(
            thread_id=thread_id or uuid.uuid4().hex,
            agent=a.name,
            version=self.version,
            node=a.start_node(),
            input=data,
            input_hash=serde.digest(a.name.encode() + b"\0" + data),
            idempotency_key=idempotency_key,
        )
        rec = await self._create(new)
        if rec.step == 0:
            return self._to_run(rec, serde.loads(rec.input))
        return await self._with_state(rec)

    async def _create(self, new: NewRun) -> RunRecord:
        """Insert the run; when a worker of this process has a free slot, insert it leased to
        that worker and hand it over (no claim round trip, no wake-up of other workers)."""
        worker = next((w for w in self._workers if w.reserve()), None)
        if worker is None:
            rec, _ = await self.store.create_run(new)
            return rec
        try:
            rec, created = await self.store.create_run(
                new, lease=(worker.id, self.settings.lease_ttl))
        except BaseException:
            worker.unreserve()
            raise
        if not (created and rec.lease_owner == worker.id):
            worker.unreserve()
        elif not worker.adopt(rec):  # it began stopping meanwhile: let others claim it
            await self.store.release_runs([Lease(rec.thread_id, worker.id, rec.epoch)])
        return rec

    async def get(self, thread_id: str) -> Run:
        """The run with its current state, inbox depth and actor state."""
        await self.open()
        rec = await self.store.get_run(thread_id)
        if rec is None:
            raise RunNotFound(f"no run with thread_id {thread_id!r}")
        run = await self._with_state(rec)
        depth = await self.store.inbox_depth(thread_id)
        return dataclasses.replace(run, inbox_depth=depth)

    async def list_runs(
        self,
        *,
        status: str | None = None,
        agent: str | None = None,
        limit: int = 100,
        before: tuple[float, str] | None = None,
        inbox: bool = False,
    ) -> list[Run]:
        """Runs newest first, without their state (use get() for that). `inbox=True` also
        fills each run's inbox depth (one small query per run)."""
        await self.open()
        recs = await self.store.list_runs(status=status, agent=agent, limit=limit, before=before)
        runs = [self._to_run(r, None) for r in recs]
        if inbox:
            depths = await asyncio.gather(*(self.store.inbox_depth(r.thread_id) for r in runs))
            runs = [dataclasses.replace(r, inbox_depth=d) for r, d in zip(runs, depths, strict=True)]
        return runs

    async def wait(self, thread_id: str, timeout: float | None = None) -> Run:
        """Wait until the run is completed, failed or cancelled; returns it.
        Raises TimeoutError after `timeout` seconds.

        A worker in this process wakes waiters at once and hands over the final state (no
        replay of the log); otherwise one shared poller checks all waited-for runs in one
        query per poll interval, however many waiters there are."""
        await self.open()
        if not self._driving(thread_id):  # a run a worker here drives exists and is not over
            rec = await self.store.get_run(thread_id)
            if rec is None:
                raise RunNotFound(f"no run with thread_id {thread_id!r}")
            if rec.status in TERMINAL:
                return await self._with_state(rec)
        entry = self._finished.get(thread_id)
        if entry is None:
            entry = self._finished[thread_id] = _Waiting(asyncio.Event())
        entry.count += 1
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll_finished())
        try:
            if timeout is None:
                await entry.event.wait()
            else:
                async with asyncio.timeout(timeout):
                    await entry.event.wait()
        finally:
            entry.count -= 1
            if entry.count <= 0 and self._finished.get(thread_id) is entry:
                del self._finished[thread_id]
        handed, entry.state = entry.state, None  # the first waiter takes the worker's state
        if handed is not None and entry.record is not None and entry.record.step == entry.step:
            return self._to_run(entry.record, handed)
        found = await self.store.get_run(thread_id)
        if found is None:
            raise RunNotFound(f"no run with thread_id {thread_id!r}")
        if handed is not None and found.status in TERMINAL and found.step == entry.step:
            return self._to_run(found, handed)
        return await self._with_state(found)  # also: woken by a cancel not finished yet

    def _driving(self, thread_id: str) -> bool:
        """A worker of this process runs this run now (so it exists and will notify)."""
        return any(w.driving(thread_id) for w in self._workers)

    async def _poll_finished(self) -> None:
        """Wake waiters whose runs finished elsewhere (another process's worker)."""
        while self._finished:
            # One query covers every waiter, and its cost grows with their number: with many
            # waiters poll less often, so the poller costs about one 1,000-id lookup per poll
            # interval. Runs driven by a worker in this process wake their waiters at once.
            await asyncio.sleep(self.settings.poll_interval * max(1.0, len(self._finished) / 1000))
            ids = [tid for tid in self._finished if not self._driving(tid)]
            if not ids:
                continue
            try:
                statuses = await self.store.run_statuses(ids)
            except Exception:  # a store outage must not kill the waiters' only poller
                log.warning("checking finished runs failed; retrying", exc_info=True)
                continue
            for tid in ids:
                status = statuses.get(tid)
                if status is None or status in TERMINAL:
                    self.notify_finished(tid)

    async def cancel(self, thread_id: str) -> Run:
        """Cancel a run now: queued/waiting/sleeping at once; a running run's in-flight step
        is abandoned (its commit is refused) and its node task cancelled."""
        await self.open()
        rec = await self.store.cancel_run(thread_id, self.compensable)
        if rec is None:
            raise RunNotFound(f"no run with thread_id {thread_id!r}")
        for w in self._workers:
            w.cancel_local(thread_id)
        if rec.status == "cancelled":
            self.emit(thread_id, {"type": "cancelled", "step": rec.step})
        self.notify_finished(thread_id)
        return await self._with_state(rec)

    async def checkpoints(self, thread_id: str) -> list[Checkpoint]:
        """Every committed step of the run with the state after it."""
        await self.open()
        rec = await self.store.get_run(thread_id)
        if rec is None:
            raise RunNotFound(f"no run with thread_id {thread_id!r}")
        rows = await self.store.checkpoints(thread_id)
        state: dict[str, Any] = dict(serde.loads(rec.input))
        out: list[Checkpoint] = []
        from .state import apply

        for cp in rows:
            state = apply(state, cp.kind, cp.data)
            out.append(_checkpoint(cp, serde.loads(serde.dumps(state))))
        return out

    async def work(self, concurrency: int | None = None, *, stop: asyncio.Event | None = None) -> None:
        """Run a worker in this process until `stop` is set, SIGTERM handling aside (the CLI
        installs it), or the task is cancelled."""
        from .worker import Worker

        await self.open()
        worker = Worker(self, concurrency=concurrency or self.settings.concurrency)
        self._workers.append(worker)
        try:
            await worker.run(stop)
        finally:
            self._workers.remove(worker)

    async def send(self, thread_id: str, message: Any, *, sender: str | None = None) -> int:
        """Put `message` in a run's mailbox from outside (waking it if it waits for mail).
        Raises RunNotFound for an unknown thread_id. Returns the message id."""
        data = serde.dumps(message, "message")
        await self.open()
        return await self.store.send_message(thread_id, data, sender)

    async def inbox(self, thread_id: str) -> list[Message]:
        """The run's unconsumed messages, oldest first."""
        await self.open()
        return [Message(m.id, m.sender, serde.loads(m.message), m.created_at)
                for m in await self.store.load_inbox(thread_id)]

    async def resume(self, thread_id: str, value: Any = None, *,
                     interrupt_id: str | None = None) -> Interrupt:
        """Answer the run's pending interrupt with `value` (JSON). Exactly once: a second or
        concurrent answer to the same interrupt raises ResumeConflict; a run that is not
        waiting for input raises InvalidState."""
        data = serde.dumps(value, "resume value")
        await self.open()
        rec = await self.store.resume_interrupt(thread_id, data, interrupt_id)
        if rec is not None:
            self.emit(thread_id, {"type": "resumed", "interrupt_id": rec.id, "step": rec.step})
            return _interrupt(rec)
        run = await self.store.get_run(thread_id)
        if run is None:
            raise RunNotFound(f"no run with thread_id {thread_id!r}")
        answered = await self.store.get_interrupt(interrupt_id) if interrupt_id else None
        if answered is None and interrupt_id is None:
            done = await self.store.list_interrupts(thread_id=thread_id, status="resolved",
                                                    limit=1_000)
            answered = next((i for i in reversed(done) if i.step == run.step + 1), None)
        if answered is not None and answered.thread_id == thread_id and answered.status == "resolved":
            raise ResumeConflict(
                f"interrupt {answered.id!r} of run {thread_id!r} was already answered")
        if interrupt_id is not None and (answered is None or answered.thread_id != thread_id):
            raise InvalidState(f"run {thread_id!r} has no interrupt {interrupt_id!r}")
        raise InvalidState(f"run {thread_id!r} is {run.status}, not waiting for input")

    async def interrupts(self, *, thread_id: str | None = None, status: str | None = "pending",
                         limit: int = 100) -> list[Interrupt]:
        """Interrupts waiting for a person (oldest first); status=None lists all."""
        await self.open()
        recs = await self.store.list_interrupts(thread_id=thread_id, status=status, limit=limit)
        return [_interrupt(r) for r in recs]

    async def fork(self, thread_id: str, step: int, *, new_thread_id: str | None = None) -> Run:
        """A new run starting from the state after `step` of `thread_id` (time travel); it
        continues with the node that step chose. The new run records where it came from."""
        await self.open()
        rec = await self.store.get_run(thread_id)
        if rec is None:
            raise RunNotFound(f"no run with thread_id {thread_id!r}")
        if not isinstance(step, int) or step < 0 or step > rec.step:
            raise InvalidState(f"run {thread_id!r} has steps 0..{rec.step}; cannot fork at {step!r}")
        agent = self.agent(rec.agent)
        if step == 0:
            node: str | None = agent.start_node()
        else:
            rows = await self.store.load_checkpoints(thread_id, step)
            node = rows[-1].next_node if rows else None
        if node is None:
            raise InvalidState(f"step {step} of run {thread_id!r} finished the run; fork an "
                               "earlier step")
        state = await self.load_state(rec, upto=step) if step else serde.loads(rec.input)
        data = serde.dumps(state, "state")
        new = NewRun(
            thread_id=new_thread_id or uuid.uuid4().hex, agent=rec.agent, version=self.version,
            node=node, input=data, input_hash=serde.digest(rec.agent.encode() + b"\0" + data),
            forked_from=thread_id, forked_step=step,
        )
        created, _ = await self.store.create_run(new)
        return self._to_run(created, state)

    async def subscribe(self, thread_id: str) -> AsyncIterator[dict[str, Any]]:
        """Live events of a run produced in this process: steps committed, interrupted,
        resumed, completed, failed, and `ctx.stream` events. Ends when the run is terminal."""
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=10_000)
        self._subscribers.setdefault(thread_id, set()).add(queue)
        try:
            while True:
                event = await queue.get()
                yield event
                if event["type"] in ("completed", "failed", "cancelled"):
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

    # -- internals -------------------------------------------------------------------------

    def notify_finished(self, thread_id: str, step: int = -1,
                        state: dict[str, Any] | None = None,
                        record: RunRecord | None = None) -> None:
        """Wake the run's waiters. A worker finishing the run hands over its final `state`
        after `step` (exactly what a replay of the log gives) and, when the store returned
        it, the run's `record` as committed: then a waiter reads nothing."""
        entry = self._finished.get(thread_id)
        if entry is not None:
            entry.step, entry.state, entry.record = step, state, record
            entry.event.set()

    async def load_state(self, rec: RunRecord, upto: int | None = None) -> dict[str, Any]:
        rows: list[CheckpointRecord] = []
        if rec.step > 0:
            rows = await self.store.load_checkpoints(rec.thread_id, upto)
        return replay(rec.input, ((cp.kind, cp.data) for cp in rows))

    async def _with_state(self, rec: RunRecord) -> Run:
        return self._to_run(rec, await self.load_state(rec))

    @staticmethod
    def _to_run(rec: RunRecord, state: dict[str, Any] | None) -> Run:
        return Run(
            thread_id=rec.thread_id,
            agent=rec.agent,
            status=RunStatus(rec.status),
            state=state if state is not None else {},
            step=rec.step,
            version=rec.version,
            node=rec.node,
            attempt=rec.attempt,
            error=run_error(rec.error),
            created_at=rec.created_at,
            updated_at=rec.updated_at,
            idempotency_key=rec.idempotency_key,
            parent_thread_id=rec.parent_thread_id,
            forked_from=rec.forked_from,
            forked_step=rec.forked_step,
            lease_owner=rec.lease_owner,
            wake_at=rec.wake_at,
            waiting_for=rec.waiting_for,
        )


@dataclass(frozen=True, slots=True)
class Effect:
    """One outbox row: a side effect requested by a step (or a compensation)."""

    thread_id: str
    key: str
    name: str
    step: int
    payload: Any
    status: str
    attempts: int
    result: Any
    error: str | None
    compensates: str | None
    created_at: float
    done_at: float | None

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def _effect(rec: EffectRecord) -> Effect:
    return Effect(rec.thread_id, rec.key, rec.name, rec.step, serde.loads(rec.payload),
                  rec.status, rec.attempts,
                  None if rec.result is None else serde.loads(rec.result), rec.error,
                  rec.compensates, rec.created_at, rec.done_at)


@dataclass(frozen=True, slots=True)
class Interrupt:
    """A question a run asked a person (ctx.interrupt) and, once answered, the answer."""

    id: str
    thread_id: str
    step: int
    payload: Any
    status: str
    value: Any
    created_at: float
    resolved_at: float | None

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def _interrupt(rec: InterruptRecord) -> Interrupt:
    return Interrupt(rec.id, rec.thread_id, rec.step, serde.loads(rec.payload), rec.status,
                     None if rec.value is None else serde.loads(rec.value), rec.created_at,
                     rec.resolved_at)


def _checkpoint(cp: CheckpointRecord, state: dict[str, Any]) -> Checkpoint:
    return Checkpoint(cp.thread_id, cp.step, cp.node, cp.next_node, state, cp.kind, cp.worker,
                      cp.attempt, cp.started_at, cp.finished_at)
