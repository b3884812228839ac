"""Runtime: the user's facade over a process's parts.

A Runtime owns a Store (persistence), a Registry (its agents, effect handlers and version) and
an EventHub (live events and waiters), and builds Workers from those parts (`work()`); a
Worker is never handed the Runtime. Every public method is one operation on runs, turning
store records into the value types of tether.types.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from . import deploy, serde
from .agent import Agent
from .config import Settings, resolve
from .context import Message
from .deploy import Deployment, Routes, Upgrade, WorkerInfo
from .errors import (
    ConfigError,
    DefinitionError,
    InvalidState,
    ResumeConflict,
    RunNotFound,
    RunPruned,
    SchemaError,
    SerializationError,
)
from .history import load_state
from .hub import EventHub
from .llm import add_usage
from .outbox import EffectHandler
from .records import (
    checkpoint_of,
    effect_of,
    interrupt_of,
    iso,
    run_error,
    statuses_of,
    to_run,
)
from .registry import Registry
from .retention import Age, Policy, Progress, Report, prune, prune_periodically, standing
from .retry import RetryPolicy
from .state import apply
from .store import make_store
from .store.base import (
    AUDIT_ACTIONS,
    Audit,
    Lease,
    NewRun,
    RunRecord,
    StatusCounts,
    Store,
)
from .tuning import worker_tuned
from .types import (
    TERMINAL,
    AuditEvent,
    Call,
    Checkpoint,
    Effect,
    Interrupt,
    Run,
    RunError,
    RunStatus,
)
from .worker import Worker

F = TypeVar("F", bound=Callable[..., Any])
log = logging.getLogger("tether.runtime")
ROUTES_TTL = 1.0
"""Seconds a runtime routes new runs by the weight table it read last: a route() made in
another process takes effect here within this time (at once in the process that made it)."""

__all__ = ["Call", "Checkpoint", "Effect", "Interrupt", "Run", "RunError", "RunStatus", "Runtime",
           "run_error"]




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
        cpu_workers: int | None = None,
        store: Store | None = None,
        retention: Policy | Mapping[str, Any] | None = None,
    ) -> None:
        # The arguments are the code's settings: TETHER_* and [tool.tether] win over them
        # (tether.config: one precedence for the CLI and the library).
        self._code: dict[str, object] = {"db": db_url, "lease_ttl": lease_ttl,
                                         "poll_interval": poll_interval,
                                         "snapshot_every": snapshot_every,
                                         "cpu_workers": cpu_workers}
        self._setup(resolve(code=self._code), store)
        self.registry = Registry(version, self.store.dialect, agents)
        self.retention = standing(retention)
        """The standing retention policy its workers apply (`Policy.every` seconds apart)."""

    def _setup(self, settings: Settings, store: Store | None = None) -> None:
        self.settings = settings
        self.store: Store = store if store is not None else make_store(settings.db)
        self.hub = EventHub(self.store, settings.poll_interval)
        self._open_lock = asyncio.Lock()
        self._opened = False
        self._workers: list[Worker] = []
        # The deployment weights read from this database (cached ROUTES_TTL seconds).
        self._routes = Routes()
        self._routes_read = -ROUTES_TTL
        self._routes_lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"Runtime({self.store.url!r}, version={self.version!r}, agents={list(self.agents)})"

    @property
    def db_url(self) -> str:
        return self.store.url

    @property
    def version(self) -> str:
        """The code version this runtime starts runs on and its workers serve."""
        return self.registry.version

    @property
    def agents(self) -> dict[str, Agent]:
        return self.registry.agents

    @property
    def effect_handlers(self) -> dict[str, EffectHandler]:
        return self.registry.effect_handlers

    @property
    def dialect(self) -> str:
        """The database's dialect: "sqlite" or "postgres"."""
        return self.store.dialect

    @property
    def local_workers(self) -> tuple[Worker, ...]:
        """The workers running in this process (`work()`), for introspection."""
        return tuple(self._workers)

    def with_db(self, db_url: str, *, lease_ttl: float | None = None) -> Runtime:
        """The same agents, effect handlers and version on another database (or with another
        lease TTL); these win over every other source of those settings."""
        return self.configured({"db": db_url, "lease_ttl": lease_ttl})

    def configured(self, flags: Mapping[str, object],
                   flag_names: Mapping[str, str] | None = None) -> Runtime:
        """The same agents, effect handlers and version with the settings found again, with
        `flags` first (a command's flags; None values are not given): see tether.config."""
        settings = resolve(flags=flags, code=self._code, flag_names=flag_names)
        other = object.__new__(Runtime)
        other._code = self._code
        other._setup(settings)
        other.registry = self.registry.copy(other.store.dialect)
        other.retention = self.retention
        return other

    def add_agent(self, agent: Agent) -> None:
        self.registry.add_agent(agent)

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
            self.registry.add_effect(name, fn, retry=retry, compensate=compensate,
                                     transactional=transactional)
            return fn

        return register

    @property
    def compensable(self) -> list[str]:
        """Names of effects that have a compensate handler."""
        return self.registry.compensable

    async def effects(self, thread_id: str | None = None, *, status: str | None = None,
                      limit: int = 1000) -> list[Effect]:
        """The outbox: effects of a run (or all), in request order."""
        await self.open()
        recs = await self.store.list_effects(thread_id=thread_id, status=status, limit=limit)
        return [effect_of(r) for r in recs]

    async def retry_effect(self, key: str, thread_id: str | None = None, *,
                           actor: str | None = None) -> list[Effect]:
        """Retry dead effects with this key now, with a fresh attempt budget."""
        await self.open()
        audit = _audit(actor, "effect.retry", thread_id, key, {"key": key})
        return [effect_of(r) for r in await self.store.retry_effect(key, thread_id, audit=audit)]

    async def audit(self, *, thread_id: str | None = None, action: str | None = None,
                    limit: int = 100, before: int | None = None) -> list[AuditEvent]:
        """The audit log of operator actions, newest first, by run and action; `before` is
        the id of the last event seen (the next page)."""
        if action is not None and action not in AUDIT_ACTIONS:
            raise DefinitionError(f"unknown audit action {action!r}; one of: "
                                  f"{', '.join(AUDIT_ACTIONS)}")
        if not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise DefinitionError(f"limit must be within 1..10000, got {limit!r}")
        await self.open()
        recs = await self.store.list_audit(thread_id=thread_id, action=action, limit=limit,
                                           before=before)
        return [AuditEvent(r.id, r.at, r.actor, r.action, r.thread_id, r.target,
                           serde.loads(r.details.encode())) for r in recs]

    def agent(self, name: str | Agent) -> Agent:
        return self.registry.agent(name)

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self) -> Runtime:
        """Connect and check the schema (SchemaError if behind: run `tether migrate`)."""
        if not self._opened:
            async with self._open_lock:
                if not self._opened:
                    try:
                        await self.store.open()
                    except SchemaError as exc:
                        raise SchemaError(f"{exc} (the database URL came from "
                                          f"{self.settings.source('db')})") from None
                    self._opened = True
        return self

    async def migrate(self) -> list[int]:
        """Apply pending schema migrations (what `tether migrate` does). On an open runtime
        the store stays open (and usable) afterwards; otherwise it is closed again."""
        async with self._open_lock:
            if self._opened:
                return await self.store.migrate()
            await self.store.open(check_schema=False)
            try:
                return await self.store.migrate()
            finally:
                await self.store.close()

    async def ping(self) -> float:
        """The database clock (seconds since the epoch): one round trip, for health checks."""
        await self.open()
        return await self.store.now()

    async def status_counts(self) -> StatusCounts:
        """Runs by (status, version) and effects not done by status, store-wide: one query
        (a full count; poll it every few seconds, not per request)."""
        await self.open()
        return await self.store.status_counts()

    async def close(self) -> None:
        self.hub.close()
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
        version: str | None = None,
        *,
        actor: str | None = None,
        traceparent: str | None = None,
    ) -> Run:
        """Create a queued run (the worker picks it up). The same idempotency key, or the same
        thread_id with the same input, returns the existing run; other input is RunConflict.
        The run's version: `version` if given, else the deployment weights' choice for its
        thread_id (the same in every process), else this runtime's own version.
        With `actor` (who asked: a person, a token's name), the start is recorded in the audit
        log in the same transaction; the same goes for every operator action below.
        `traceparent` (a W3C trace context, e.g. an HTTP request's) makes the run's trace a
        child of that span."""
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
        thread_id = thread_id or uuid.uuid4().hex
        routes = await self._current_routes()
        node = a.start_node()
        if version is None:
            version = routes.choose(thread_id, self.version, a.name)
        else:
            deploy.known_version(version, routes, self.version)
        if version in routes.retired:
            raise InvalidState(f"version {version!r} is retired; it takes no new runs")
        if version != self.version:
            node = routes.start_node(version, a.name) or node
        new = NewRun(
            thread_id=thread_id,
            agent=a.name,
            version=version,
            node=node,
            input=data,
            input_hash=serde.digest(a.name.encode() + b"\0" + data),
            idempotency_key=idempotency_key,
        )
        if self.hub.observers or traceparent is not None:
            trace = self.hub.run_created(new, None, traceparent, time.time())
            if trace is not None:
                new = dataclasses.replace(new, trace_context=trace)
        audit = _audit(actor, "start", new.thread_id, new.thread_id,
                       {"agent": a.name, "version": new.version,
                        "idempotency_key": idempotency_key})
        rec, created = await self._create(new, audit)
        if rec.step == 0:
            run = to_run(rec, serde.loads(rec.input))
        else:
            run = await self._with_state(rec)
        # A new run has no mail yet; an existing one is read as get() reads it.
        depth = 0 if created else await self.store.inbox_depth(rec.thread_id)
        return dataclasses.replace(run, created=created, inbox_depth=depth)

    async def _create(self, new: NewRun, audit: Audit | None = None) -> tuple[RunRecord, bool]:
        """Insert the run (or find it there); when a worker of this process has a free slot,
        insert it leased to that worker and hand it over (no claim round trip, no wake-up of
        other workers)."""
        worker = (next((w for w in self._workers if w.reserve()), None)
                  if new.version == self.version else None)
        if worker is None:
            return await self.store.create_run(new, audit=audit)
        try:
            rec, created = await self.store.create_run(
                new, lease=(worker.id, self.settings.lease_ttl), audit=audit)
        except BaseException:
            worker.unreserve()
            raise
        if not (created and rec.lease_owner == worker.id):
            worker.unreserve()
        elif not worker.adopt(rec):  # it began stopping meanwhile: let others claim it
            await self.store.release_runs([Lease(rec.thread_id, worker.id, rec.epoch)])
        return rec, created

    async def get(self, thread_id: str) -> Run:
        """The run with its current state, inbox depth and actor state."""
        rec = await self._record(thread_id)
        run = await self._with_state(rec)
        depth = await self.store.inbox_depth(thread_id)
        return dataclasses.replace(run, inbox_depth=depth, usage=await self.usage(thread_id))

    async def usage(self, thread_id: str) -> dict[str, int]:
        """The LLM token usage of the run's journaled calls, summed (Run.usage)."""
        await self.open()
        total: dict[str, int] = {}
        for record in await self.store.journal_usage(thread_id, serde.USAGE_PREFIX):
            add_usage(total, serde.usage_in(record) or {})
        return total

    async def peek(self, thread_id: str) -> Run:
        """The run's row alone, without its state or inbox depth: one cheap read (for
        polling a run's status)."""
        return to_run(await self._record(thread_id), None)

    async def _record(self, thread_id: str) -> RunRecord:
        await self.open()
        rec = await self.store.get_run(thread_id)
        if rec is None:
            tomb = await self.store.retention.get_tombstone(thread_id)
            if tomb is not None:
                raise RunPruned(f"run {thread_id!r} ({tomb.status}) was pruned by retention at "
                                f"{iso(tomb.pruned_at)}", thread_id=thread_id,
                                pruned_at=tomb.pruned_at)
            raise RunNotFound(f"no run with thread_id {thread_id!r}")
        return rec

    async def list_runs(
        self,
        *,
        status: str | None = None,
        agent: str | None = None,
        limit: int = 100,
        before: tuple[float, str] | None = None,
        inbox: bool = False,
        version: str | None = None,
        parent: str | None = None,
        since: float | None = None,
        until: float | None = None,
        prefix: str | None = None,
        order: str = "newest",
    ) -> list[Run]:
        """Runs without their state (use get() for that), in `order`: newest or oldest
        created first, or updated (latest updated first); filtered by status, agent,
        version, parent run (its children), created in [since, until) and thread_id
        prefix. `before` is the last row's cursor: (created_at, thread_id), or (updated_at,
        thread_id) for order="updated". `inbox=True` also fills each run's inbox depth (one
        small query per run)."""
        await self.open()
        recs = await self.store.list_runs(status=status, agent=agent, limit=limit, before=before,
                                          version=version, parent=parent, since=since,
                                          until=until, prefix=prefix, order=order)
        runs = [to_run(r, None) for r in recs]
        if inbox:
            depths = await asyncio.gather(*(self.store.inbox_depth(r.thread_id) for r in runs))
            runs = [dataclasses.replace(r, inbox_depth=d) for r, d in zip(runs, depths, strict=True)]
        return runs

    async def wait(self, thread_id: str, timeout: float | None = None,
                   until: str | Iterable[str] | None = None) -> Run:
        """Wait until the run is completed, failed or cancelled; returns it.
        Raises TimeoutError after `timeout` seconds.

        With `until` (a status or a collection of them, e.g. "waiting"): return as soon as the
        run is in one of them, or terminal (it can then never reach them); the caller checks
        `.status`. A status that is not terminal is seen by the shared poller, so it is
        noticed within one poll interval (`poll_interval`, 0.25 s by default).

        A worker in this process wakes waiters at once and hands over the final state (no
        replay of the log); otherwise one shared poller checks all waited-for runs in one
        query per poll interval, however many waiters there are."""
        if until is not None:
            wanted = statuses_of(until)
            if not wanted <= TERMINAL:
                return await self._wait_status(thread_id, wanted, timeout)
        await self.open()
        if not self.hub.driving(thread_id):  # a run a worker here drives exists, not over
            rec = await self._record(thread_id)
            if rec.status in TERMINAL:
                return await self._with_state(rec)
        end = await self.hub.wait_finished(thread_id, timeout)
        handed = end.state
        if handed is not None and end.record is not None and end.record.step == end.step:
            return to_run(end.record, handed)
        found = await self._record(thread_id)
        if handed is not None and found.status in TERMINAL and found.step == end.step:
            return to_run(found, handed)
        return await self._with_state(found)  # also: woken by a cancel not finished yet

    async def _wait_status(self, thread_id: str, wanted: frozenset[str],
                           timeout: float | None) -> Run:
        async with asyncio.timeout(timeout):
            while True:
                rec = await self._record(thread_id)
                if rec.status in wanted or rec.status in TERMINAL:
                    return await self._with_state(rec)
                await self.hub.wait_status(thread_id, wanted, None)

    async def retry(self, thread_id: str, *, actor: str | None = None) -> Run:
        """Run a failed run again from its failed step (after a fix to its code, say): the
        same thread_id, queued for any worker, with a new attempt and a fresh retry budget.
        Its committed steps stay; the failed step's journaled calls return their recorded
        results (a step whose calls changed fails with NondeterminismError: fork an earlier
        step instead). Raises InvalidState unless the run is failed."""
        rec = await self._record(thread_id)
        if rec.status != "failed":
            hint = {"completed": "fork it to run steps again (tether runs fork)",
                    "cancelled": "fork it to run steps again (tether runs fork)"}.get(
                rec.status, "wait for it to fail or finish")
            raise InvalidState(f"run {thread_id!r} is {rec.status}, not failed: only a failed "
                               f"run can be retried; {hint}")
        node = await self._next_node(rec, rec.step)
        if node is None:  # a failed run's last committed step never finished it
            raise InvalidState(f"run {thread_id!r} has no step to run again")
        moved = await self.store.retry_run(
            thread_id, node, audit=_audit(actor, "retry", thread_id, thread_id, {"node": node}))
        if moved is None:
            raise InvalidState(f"run {thread_id!r} changed while being retried; look again")
        return await self._with_state(moved)

    async def release_worker(self, worker_id: str, *, actor: str | None = None) -> list[str]:
        """Give back every run and effect `worker_id` leases now, instead of waiting out its
        lease TTL (for a worker known dead or stuck); any worker resumes them from their last
        checkpoint. A worker still alive is fenced out: it commits nothing more for them.
        Returns the thread_ids released."""
        if not isinstance(worker_id, str) or not worker_id:
            raise DefinitionError("worker_id must be a non-empty string")
        await self.open()
        return await self.store.release_worker(
            worker_id, audit=_audit(actor, "release", None, worker_id))

    async def _next_node(self, rec: RunRecord, step: int) -> str | None:
        """The node that runs after `step` of the run (the start node after step 0)."""
        if step == 0:
            return self.agent(rec.agent).start_node()
        rows = await self.store.load_checkpoints(rec.thread_id, step)
        return rows[-1].next_node if rows else None

    async def cancel(self, thread_id: str, *, actor: str | None = None) -> Run:
        """Cancel a run now: queued/waiting/sleeping at once; a running run's in-flight step
        is abandoned (its commit is refused) and its node task cancelled."""
        await self.open()
        rec = await self.store.cancel_run(thread_id, self.compensable,
                                          audit=_audit(actor, "cancel", thread_id, thread_id))
        if rec is None:
            raise RunNotFound(f"no run with thread_id {thread_id!r}")
        for w in self._workers:
            w.cancel_local(thread_id)
        if rec.status == "cancelled":
            self.hub.emit(thread_id, {"type": "cancelled", "step": rec.step})
        self.hub.notify_finished(thread_id)
        return await self._with_state(rec)

    async def checkpoints(self, thread_id: str) -> list[Checkpoint]:
        """Every committed step of the run with the state after it."""
        rec = await self._record(thread_id)
        rows = await self.store.checkpoints(thread_id)
        state: dict[str, Any] = dict(serde.loads(rec.input))
        out: list[Checkpoint] = []
        for cp in rows:
            state = apply(state, cp.kind, cp.data)
            # A copy per checkpoint (typed: it may hold an Agent(typed_state=True)'s values).
            out.append(checkpoint_of(cp, serde.loads(serde.dumps(state, typed=True))))
        return out

    async def calls(self, thread_id: str, step: int) -> list[Call]:
        """The results step `step` of the run journaled, in call order."""
        await self._record(thread_id)
        return [Call(thread_id, step, r.idx, r.name, serde.loads(r.result))
                for r in await self.store.load_journal(thread_id, step)]

    async def work(self, concurrency: int | None = None, *, stop: asyncio.Event | None = None,
                   tune: bool = False, cpu_workers: int | None = None) -> None:
        """Run a worker in this process until `stop` is set, SIGTERM handling aside (the CLI
        installs it), or the task is cancelled. `tune=True` also sets the interpreter up for
        thousands of steps in flight while it runs (the collector and the GIL's switch
        interval, see tether.tuning), as `tether worker` does; off by default, so a library
        user's interpreter stays as they set it. `cpu_workers`: processes of the pool that
        runs ctx.cpu_call (default: the runtime's setting, else one per CPU)."""
        await self.open()
        n = concurrency or self.settings.concurrency
        settings = self.settings if cpu_workers is None else dataclasses.replace(
            self.settings, cpu_workers=cpu_workers)
        worker = Worker(self.store, self.registry, self.hub, settings, concurrency=n)
        self._workers.append(worker)
        policy = self.retention
        try:
            with worker_tuned(n) if tune else contextlib.nullcontext():
                if policy is None or policy.every is None:
                    await worker.run(stop)
                    return
                halt = asyncio.Event()
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(prune_periodically(self.store, policy, self.settings.lease_ttl,
                                                     halt))
                    try:
                        await worker.run(stop)
                    finally:
                        halt.set()
        finally:
            self._workers.remove(worker)

    async def prune(
        self,
        *,
        completed: Age | None = None,
        failed: Age | None = None,
        cancelled: Age | None = None,
        agent: str | None = None,
        keep_steps: int | None = None,
        keep_interrupts: bool = False,
        dry_run: bool = False,
        progress: Progress | None = None,
        actor: str | None = None,
    ) -> Report:
        """Remove terminal runs finished longer ago than their status's age (30d, 12h, 0s, or
        seconds), with everything of theirs, leaving tombstones; `keep_steps` also compacts
        long logs to their last N checkpoints. `dry_run`: count what would go, change
        nothing. One pruner at a time per database (PrunerBusy otherwise)."""
        policy = Policy.of(completed=completed, failed=failed, cancelled=cancelled, agent=agent,
                           keep_steps=keep_steps, keep_interrupts=keep_interrupts)
        await self.open()
        if agent is not None and agent not in self.agents and not await self.store.list_runs(
                agent=agent, limit=1):
            raise ConfigError(f"unknown agent {agent!r}: no run of it in the store and this "
                              f"runtime has {', '.join(self.agents) or 'no agents'}")
        audit = _audit(actor, "prune", None, None, {
            "completed": completed, "failed": failed, "cancelled": cancelled, "agent": agent,
            "keep_steps": keep_steps})
        if audit is not None:  # each batch of runs removed is one row, in its transaction
            audit = Audit(audit.actor, audit.action, None, None,
                          {k: (v if v is None or isinstance(v, (int, float, str)) else str(v))
                           for k, v in audit.details.items()})
        return await prune(self.store, policy, lock_ttl=self.settings.lease_ttl,
                           dry_run=dry_run, progress=progress, audit=audit)

    async def send(self, thread_id: str, message: Any, *, sender: str | None = None,
                   actor: str | None = None) -> int:
        """Put `message` in a run's mailbox from outside (waking it if it waits for mail).
        Raises RunNotFound for an unknown thread_id. Returns the message id."""
        data = serde.dumps(message, "message")
        await self.open()
        return await self.store.send_message(
            thread_id, data, sender,
            audit=_audit(actor, "send", thread_id, thread_id, {"sender": sender,
                                                              "bytes": len(data)}))

    async def inbox(self, thread_id: str) -> list[Message]:
        """The run's unconsumed messages, oldest first."""
        await self.open()
        return [Message(m.id, m.sender, serde.loads(m.message), m.created_at)
                for m in await self.store.load_inbox(thread_id)]

    async def resume(self, thread_id: str, value: Any = None, *,
                     interrupt_id: str | None = None, actor: str | None = None) -> Interrupt:
        """Answer the run's pending interrupt with `value` (JSON). Exactly once: a second or
        concurrent answer to the same interrupt raises ResumeConflict; a run that is not
        waiting for input raises InvalidState."""
        data = serde.dumps(value, "resume value")
        await self.open()
        rec = await self.store.resume_interrupt(
            thread_id, data, interrupt_id,
            audit=_audit(actor, "resume", thread_id, interrupt_id or thread_id,
                         {"interrupt_id": interrupt_id}))
        if rec is not None:
            self.hub.emit(thread_id, {"type": "resumed", "interrupt_id": rec.id, "step": rec.step})
            return interrupt_of(rec)
        run = await self._record(thread_id)
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
        return [interrupt_of(r) for r in recs]

    async def fork(self, thread_id: str, step: int, *, new_thread_id: str | None = None,
                   actor: str | None = None) -> Run:
        """A new run starting from the state after `step` of `thread_id` (time travel); it
        continues with the node that step chose. The new run records where it came from."""
        rec = await self._record(thread_id)
        if not isinstance(step, int) or step < 0 or step > rec.step:
            raise InvalidState(f"run {thread_id!r} has steps 0..{rec.step}; cannot fork at {step!r}")
        node = await self._next_node(rec, step)
        if node is None:
            raise InvalidState(f"step {step} of run {thread_id!r} finished the run; fork an "
                               "earlier step")
        state = (await load_state(self.store, rec, upto=step))[0] if step else serde.loads(rec.input)
        data = serde.dumps(state, "state", typed=self.agent(rec.agent).typed_state)
        new = NewRun(
            thread_id=new_thread_id or uuid.uuid4().hex, agent=rec.agent, version=self.version,
            node=node, input=data, input_hash=serde.digest(rec.agent.encode() + b"\0" + data),
            forked_from=thread_id, forked_step=step,
        )
        if self.hub.observers:
            trace = self.hub.run_created(new, None, None, time.time())
            if trace is not None:
                new = dataclasses.replace(new, trace_context=trace)
        created, _ = await self.store.create_run(
            new, audit=_audit(actor, "fork", thread_id, new.thread_id, {"step": step}))
        return to_run(created, state)

    def subscribe(self, thread_id: str) -> AsyncIterator[dict[str, Any]]:
        """Live events of a run produced in this process: steps committed, interrupted,
        resumed, completed, failed, and `ctx.stream` events. Ends when the run is terminal."""
        return self.hub.subscribe(thread_id)

    # -- rainbow deploys --------------------------------------------------------------------

    async def _current_routes(self) -> Routes:
        """The weight table and the versions' agents, read again once ROUTES_TTL passed
        (one read for all the starts waiting on it)."""
        if time.monotonic() - self._routes_read < ROUTES_TTL:
            return self._routes
        async with self._routes_lock:
            if time.monotonic() - self._routes_read >= ROUTES_TTL:
                await self._read_routes()
        return self._routes

    async def _read_routes(self) -> Routes:
        await self.open()
        self._routes = await deploy.load_routes(self.store)
        self._routes_read = time.monotonic()
        return self._routes

    async def workers(self) -> list[WorkerInfo]:
        """The registered workers (those that stopped cleanly deregistered); `alive` is
        False for one without a heartbeat for longer than its lease TTL."""
        await self.open()
        return await deploy.workers(self.store)

    async def deployments(self) -> list[Deployment]:
        """Every version with a weight, open runs or a live worker: its weight, state, live
        workers, open runs by status, oldest open run and stranded runs."""
        await self.open()
        return await deploy.deployments(self.store, self.settings.lease_ttl)

    async def _deployment(self, version: str) -> Deployment:
        found = [d for d in await self.deployments() if d.version == version]
        return found[0] if found else Deployment(version, 0, "drained", 0)

    async def route(self, weights: Mapping[str, int]) -> list[Deployment]:
        """Set the whole weight table ({"v1": 90, "v2": 10}): a version not named gets 0.
        Weights are integers >= 0 summing to more than 0, of versions a worker registered
        (or this runtime's own). New runs only: a run stays on the version it started on."""
        table = deploy.check_weights(weights, await self._read_routes(), self.version)
        await self.store.set_weights(table, replace=True)
        await self._read_routes()
        return await self.deployments()

    async def drain(self, version: str) -> Deployment:
        """Weight 0 for `version`: no new run goes to it; its open runs finish on it."""
        routes = await self._read_routes()
        deploy.known_version(version, routes, self.version)
        if version in routes.retired:
            raise InvalidState(f"version {version!r} is already retired")
        if not [v for v, _ in routes.weights if v != version]:
            raise InvalidState(
                f"draining {version!r} would leave no version for new runs: route them to "
                f"another first (e.g. `tether deploy route {version}=0 v2=100`)")
        await self.store.set_weights([(version, 0)], replace=False)
        await self._read_routes()
        return await self._deployment(version)

    async def retire(self, version: str) -> Deployment:
        """Retire a drained version (no open run left): it never takes a run again.
        Refused, naming its open runs, while it has any."""
        routes = await self._read_routes()
        deploy.known_version(version, routes, self.version)
        weight = dict(routes.weights).get(version, 0)
        if weight > 0:
            raise InvalidState(f"version {version!r} still has weight {weight}: drain it "
                               f"first (`tether deploy drain {version} --wait`)")
        left = await self.store.retire_version(version)
        if left:
            more = " and more" if len(left) >= 20 else ""
            raise InvalidState(
                f"version {version!r} still has open runs: {', '.join(left)}{more}; wait "
                f"for them (`tether deploy drain {version} --wait`) or move the parked ones "
                "(`tether runs upgrade`)")
        await self._read_routes()
        return await self._deployment(version)

    async def upgrade(self, from_version: str, to_version: str, *,
                      thread_ids: Sequence[str] | None = None, dry_run: bool = False,
                      skip_refused: bool = False) -> Upgrade:
        """Move parked runs (queued, waiting, sleeping: never a leased running run) of
        `from_version` (or only `thread_ids`) to `to_version` without waking them, each
        checked first: its agent and next node must exist in what `to_version`'s live
        workers registered. All or nothing: if any is refused (listed with the reason),
        nothing moves, unless `skip_refused`; `dry_run` only plans."""
        routes = await self._read_routes()
        deploy.known_version(from_version, routes, self.version, "from_version")
        deploy.known_version(to_version, routes, self.version, "to_version")
        ids = deploy.check_thread_ids(thread_ids)
        return await deploy.upgrade(self.store, from_version, to_version, thread_ids=ids,
                                    dry_run=dry_run, skip_refused=skip_refused)

    # -- internals -------------------------------------------------------------------------

    async def _with_state(self, rec: RunRecord) -> Run:
        return to_run(rec, (await load_state(self.store, rec))[0])


def _audit(actor: str | None, action: str, thread_id: str | None, target: str | None,
           details: dict[str, Any] | None = None) -> Audit | None:
    """The audit record of an operator action, when an actor is named."""
    if actor is None:
        return None
    if not isinstance(actor, str) or not actor or len(actor) > 200 or "\x00" in actor:
        raise DefinitionError("actor must be a non-empty string of at most 200 characters")
    return Audit(actor, action, thread_id, target, details or {})
