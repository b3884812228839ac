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
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import nullcontext
from typing import Any, TypeVar

from . import deploy, serde, starting
from .agent import Agent
from .calls import args_of
from .closing import stop_local
from .config import Settings, redact, resolve
from .context import Message
from .deploy import Deployment, Upgrade, WorkerInfo
from .errors import DefinitionError, InvalidState, RunNotFound, SchemaError
from .history import load_state, next_node, not_resumed, record_of, retry_node, states_after, with_state
from .hub import EventHub
from .ids import check_thread_id
from .llm import add_usage
from .outbox import EffectHandler
from .records import checkpoint_of, effect_of, interrupt_of, run_error, sent_by, to_run
from .registry import Registry
from .retention import Age, Policy, Progress, Report, alongside, known_agent, prune, prune_audit, standing
from .retry import RetryPolicy
from .store import make_store
from .store.audit import audit_of, check_audit_query
from .store.base import NewRun, RunRecord, StatusCounts, Store
from .tuning import runtime_tuned, worker_tuned
from .types import AuditEvent, Call, Checkpoint, Effect, Interrupt, Run, RunError, RunStatus, SentMessage
from .waiting import wait_run
from .worker import Worker

F = TypeVar("F", bound=Callable[..., Any])
log = logging.getLogger("tether.runtime")

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
        tune: bool = True,
    ) -> None:
        # The arguments are the code's settings: they win; TETHER_* and [tool.tether] fill
        # what they leave out (a tether command applies its flags and TETHER_* over them).
        self._code: dict[str, object] = {"db": db_url, "lease_ttl": lease_ttl,
                                         "poll_interval": poll_interval,
                                         "snapshot_every": snapshot_every,
                                         "cpu_workers": cpu_workers}
        self._setup(resolve(code=self._code), version, store)
        self.registry = Registry(version, self.store.dialect, agents)
        self.retention = standing(retention)
        """The standing retention policy its workers apply (`Policy.every` seconds apart)."""
        self.tune = tune  # tether.tuning while it is open and its workers run

    def _setup(self, settings: Settings, version: str, store: Store | None = None) -> None:
        self.settings = settings
        self.store: Store = store if store is not None else make_store(settings.db)
        self.hub = EventHub(self.store, settings.poll_interval)
        self._open_lock = asyncio.Lock()
        self._opened = False
        self._tuning = contextlib.ExitStack()
        self._workers: list[Worker] = []
        self._deploys = deploy.Deployer(self.store, version, settings.lease_ttl)

    def __repr__(self) -> str:
        return f"Runtime({redact(self.store.url)!r}, version={self.version!r}, agents={list(self.agents)})"

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

    def configured(self, flags: Mapping[str, object], flag_names: Mapping[str, str] | None = None,
                   *, operator: bool = False) -> Runtime:
        """The same agents, effect handlers and version, settings found again with `flags`
        first (None: not given); `operator`: TETHER_* over the code too (tether.config)."""
        settings = resolve(flags=flags, code=self._code, flag_names=flag_names, operator=operator)
        other = object.__new__(Runtime)
        other._code = self._code
        other._setup(settings, self.version)
        other.registry = self.registry.copy(other.store.dialect)
        other.retention = self.retention
        other.tune = self.tune
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
        audit = audit_of(actor, "effect.retry", thread_id, key, {"key": key})
        return [effect_of(r) for r in await self.store.retry_effect(key, thread_id, audit=audit)]

    async def audit(self, *, thread_id: str | None = None, action: str | None = None,
                    limit: int = 100, before: int | None = None) -> list[AuditEvent]:
        """The audit log of operator actions, newest first, by run and action; `before` is
        the id of the last event seen (the next page)."""
        check_audit_query(action, limit)
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
                    self._tuning.enter_context(runtime_tuned() if self.tune else nullcontext())
                    await self._deploys.current_routes()  # read now, not in a burst of starts
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

    async def status_counts(self, *, cap: int | None = None) -> StatusCounts:
        """Runs by (status, version) and effects not done by status, store-wide: one query
        (a full count; poll it every few seconds, not per request). With `cap`, each count
        goes through an index and stops there (`runs_more`, `effects_more`: "10,000+")."""
        await self.open()
        return await self.store.status_counts(cap)

    async def close(self) -> None:
        """Stop this process's workers of this runtime (`work()`: their leases given back within
        the shutdown grace), then disconnect. Leaving `async with runtime:` closes it."""
        await stop_local(self._workers, self.settings.shutdown_grace)
        self.hub.close()
        self._deploys.close()
        if self._opened:
            self._opened = False
            self._tuning.close()
            await self.store.close()

    async def __aenter__(self) -> Runtime:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- runs ------------------------------------------------------------------------------

    async def start(self, agent: Agent | str, input: Mapping[str, Any] | None = None,
                    thread_id: str | None = None, idempotency_key: str | None = None,
                    version: str | None = None, *, actor: str | None = None,
                    traceparent: str | None = None) -> Run:
        """Create a queued run (a worker picks it up); the same idempotency key, or thread_id
        and input, returns the existing run (other input: RunConflict). Its version: `version`,
        else the weights' choice for its thread_id, else this runtime's own. With `actor` (who
        asked), the start is audited in its transaction, as every operator action below.
        `traceparent` (W3C trace context) makes the run's trace a child of that span."""
        a = self.agent(agent)
        data = starting.check_args(input, thread_id, idempotency_key)
        await self.open()
        routes = await self._routes((version,))
        new, audit = starting.plan_one(a, data, thread_id, idempotency_key, version, routes,
                                       self.version, self.hub, actor, traceparent)
        rec, created = await starting.create(self.store, new, self._workers, self.version,
                                             self.settings.lease_ttl, audit)
        return await self._started(rec, created)

    async def _routes(self, versions: Iterable[str | None]) -> deploy.Routes:
        routes = await self._deploys.current_routes()
        if any(v not in (None, self.version, *routes.known) for v in versions):
            routes = await self._deploys.read_routes()  # one may have registered just now
        return routes

    async def _started(self, rec: RunRecord, created: bool) -> Run:
        # A new run has no mail yet; an existing one is read as get() reads it.
        depth = 0 if created else await self.store.inbox_depth(rec.thread_id)
        state = serde.loads(rec.input) if rec.step == 0 else (await load_state(self.store, rec))[0]
        return to_run(rec, state, created=created, inbox_depth=depth)  # (replace() costs 28 us)

    async def start_many(self, requests: Sequence[Mapping[str, Any]], *,
                         actor: str | None = None) -> list[Run]:
        """Start a burst: each request a mapping of start()'s arguments (`agent`, `input`,
        `thread_id`, `idempotency_key`, `version`); the runs in order. All are checked before
        any is written; they share group commits; a conflict raises after the rest is written."""
        checked = starting.check_batch(starting.batch_items(requests), self.agent)
        await self.open()
        routes = await self._routes(c[4] for c in checked)
        news = starting.plan_batch(checked, routes, self.version, self.hub, actor)
        made = await starting.create_batch(self.store, news, self._workers, self.version,
                                           self.settings.lease_ttl)
        return [await self._started(rec, created) for rec, created in made]

    async def get(self, thread_id: str) -> Run:
        """The run with its current state, inbox depth and actor state."""
        rec = await self._record(thread_id)
        run = await with_state(self.store, rec)
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
        return await record_of(self.store, thread_id)

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
        query per poll interval, however many waiters there are. A wait on a run no worker
        here drives first reads its status (ended already?), in one query with every other
        wait begun in the same event-loop iteration (10,000 waits gathered: one read)."""
        await self.open()
        return await wait_run(self.store, self.hub, thread_id, timeout, until)

    async def retry(self, thread_id: str, *, actor: str | None = None) -> Run:
        """Run a failed run again from its failed step (after a fix to its code, say): the
        same thread_id, queued for any worker, with a new attempt and a fresh retry budget.
        Its committed steps stay; the failed step's journaled calls return their recorded
        results (a step whose calls changed fails with NondeterminismError: fork an earlier
        step instead). Raises InvalidState unless the run is failed."""
        rec = await self._record(thread_id)
        node = await retry_node(self.store, rec, lambda: self.agent(rec.agent).start_node())
        moved = await self.store.retry_run(
            thread_id, node, audit=audit_of(actor, "retry", thread_id, thread_id, {"node": node}))
        if moved is None:
            raise InvalidState(f"run {thread_id!r} changed while being retried; look again")
        return await with_state(self.store, moved)

    async def release_worker(self, worker_id: str, *, actor: str | None = None) -> list[str]:
        """Give back every run and effect `worker_id` leases now, instead of waiting out its
        lease TTL (for a worker known dead or stuck); any worker resumes them from their last
        checkpoint. A worker still alive is fenced out: it commits nothing more for them.
        Returns the thread_ids released."""
        if not isinstance(worker_id, str) or not worker_id:
            raise DefinitionError("worker_id must be a non-empty string")
        await self.open()
        return await self.store.release_worker(
            worker_id, audit=audit_of(actor, "release", None, worker_id))

    async def cancel(self, thread_id: str, *, actor: str | None = None) -> Run:
        """Cancel a run now: queued/waiting/sleeping at once; a running run's in-flight step
        is abandoned (its commit is refused) and its node task cancelled."""
        await self.open()
        rec = await self.store.cancel_run(thread_id, self.compensable,
                                          audit=audit_of(actor, "cancel", thread_id, thread_id))
        if rec is None:
            raise RunNotFound(f"no run with thread_id {thread_id!r}")
        for w in self._workers:
            w.cancel_local(thread_id)
        if rec.status == "cancelled":
            self.hub.emit(thread_id, {"type": "cancelled", "step": rec.step})
        self.hub.notify_finished(thread_id)
        return await with_state(self.store, rec)

    async def checkpoints(self, thread_id: str) -> list[Checkpoint]:
        """Every committed step of the run with the state after it."""
        rec = await self._record(thread_id)
        return [checkpoint_of(cp, state) for cp, state in await states_after(self.store, rec)]

    async def calls(self, thread_id: str, step: int) -> list[Call]:
        """The results step `step` of the run journaled, in call order, each with what its
        call was given."""
        await self._record(thread_id)
        return [Call(thread_id, step, r.idx, r.name, serde.loads(r.result), args_of(r.args))
                for r in await self.store.load_journal(thread_id, step)]

    async def work(self, concurrency: int | None = None, *, stop: asyncio.Event | None = None,
                   tune: bool | None = None, cpu_workers: int | None = None) -> None:
        """Run a worker in this process until `stop` is set, SIGTERM handling aside (the CLI
        installs it), or the task is cancelled. While it runs, the interpreter is set up for
        thousands of steps in flight (the collector's thresholds and the GIL's switch interval,
        each only if still at Python's default, restored when the process's last worker stops;
        see tether.tuning); `tune=False` leaves the interpreter as it is (default: Runtime's).
        `cpu_workers`: processes of the pool that runs ctx.cpu_call (default: the runtime's
        setting, else one per CPU)."""
        await self.open()
        n = concurrency or self.settings.concurrency
        settings = self.settings if cpu_workers is None else dataclasses.replace(
            self.settings, cpu_workers=cpu_workers)
        worker = Worker(self.store, self.registry, self.hub, settings, concurrency=n)
        self._workers.append(worker)
        try:
            with worker_tuned(n) if (self.tune if tune is None else tune) else nullcontext():
                await alongside(worker.run(stop), self.store, self.retention,
                                self.settings.lease_ttl)
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
        stop: asyncio.Event | None = None,
    ) -> Report:
        """Remove terminal runs finished longer ago than their status's age (30d, 12h, 0s, or
        seconds), with everything of theirs, leaving tombstones; `keep_steps` also compacts
        long logs to their last N checkpoints. `dry_run`: count what would go, change
        nothing. One pruner at a time per database (PrunerBusy otherwise). `stop` set: end
        after the batch under way (`Report.stopped`; the next prune finishes the job)."""
        policy = Policy.of(completed=completed, failed=failed, cancelled=cancelled, agent=agent,
                           keep_steps=keep_steps, keep_interrupts=keep_interrupts)
        await self.open()
        await known_agent(self.store, agent, self.agents)
        audit = prune_audit(actor, completed=completed, failed=failed, cancelled=cancelled,
                            agent=agent, keep_steps=keep_steps)
        return await prune(self.store, policy, lock_ttl=self.settings.lease_ttl,
                           dry_run=dry_run, progress=progress, audit=audit, stop=stop)

    async def send(self, thread_id: str, message: Any, *, sender: str | None = None,
                   actor: str | None = None) -> int:
        """Put `message` in a run's mailbox from outside (waking it if it waits for mail).
        Raises RunNotFound for an unknown thread_id. Returns the message id."""
        data = serde.dumps(message, "message")
        await self.open()
        return await self.store.send_message(
            thread_id, data, sender,
            audit=audit_of(actor, "send", thread_id, thread_id, {"sender": sender,
                                                              "bytes": len(data)}))

    async def inbox(self, thread_id: str) -> list[Message]:
        """The run's unconsumed messages, oldest first."""
        await self.open()
        return [Message(m.id, m.sender, serde.loads(m.message), m.created_at)
                for m in await self.store.load_inbox(thread_id)]

    async def sent(self, thread_id: str, *, limit: int = 100) -> list[SentMessage]:
        """The messages the run's steps sent, newest first (at most `limit`, 1..1000): to
        whom, when, and the recipient's step that read each (None: not read yet)."""
        await self.open()
        return await sent_by(self.store, thread_id, limit)

    async def resume(self, thread_id: str, value: Any = None, *,
                     interrupt_id: str | None = None, actor: str | None = None) -> Interrupt:
        """Answer the run's pending interrupt with `value` (JSON). Exactly once: a second or
        concurrent answer to the same interrupt raises ResumeConflict; a run that is not
        waiting for input raises InvalidState."""
        data = serde.dumps(value, "resume value")
        await self.open()
        rec = await self.store.resume_interrupt(
            thread_id, data, interrupt_id,
            audit=audit_of(actor, "resume", thread_id, interrupt_id or thread_id,
                         {"interrupt_id": interrupt_id}))
        if rec is not None:
            self.hub.emit(thread_id, {"type": "resumed", "interrupt_id": rec.id, "step": rec.step})
            return interrupt_of(rec)
        raise await not_resumed(self.store, await self._record(thread_id), interrupt_id)

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
        if new_thread_id is not None:
            check_thread_id(new_thread_id, "new_thread_id")
        rec = await self._record(thread_id)
        if not isinstance(step, int) or step < 0 or step > rec.step:
            raise InvalidState(f"run {thread_id!r} has steps 0..{rec.step}; cannot fork at {step!r}")
        node = await next_node(self.store, rec, step, lambda: self.agent(rec.agent).start_node())
        if node is None:
            raise InvalidState(f"step {step} of run {thread_id!r} finished the run; fork an "
                               "earlier step")
        state = (await load_state(self.store, rec, upto=step))[0] if step else serde.loads(rec.input)
        data = serde.dumps(state, "state", typed=self.agent(rec.agent).typed_state)
        new = starting.traced(NewRun(
            thread_id=new_thread_id or uuid.uuid4().hex, agent=rec.agent, version=self.version,
            node=node, input=data, input_hash=starting.input_hash(rec.agent, data),
            forked_from=thread_id, forked_step=step), self.hub, None)
        created, _ = await self.store.create_run(
            new, audit=audit_of(actor, "fork", thread_id, new.thread_id, {"step": step}))
        return to_run(created, state)

    def subscribe(self, thread_id: str) -> AsyncIterator[dict[str, Any]]:
        """Live events of a run produced in this process: steps committed, interrupted,
        resumed, completed, failed, and `ctx.stream` events. Ends when the run is terminal."""
        return self.hub.subscribe(thread_id)

    # -- rainbow deploys (tether.deploy.Deployer holds the logic) ---------------------------

    async def workers(self) -> list[WorkerInfo]:
        """The registered workers (those that stopped cleanly deregistered); `alive` is
        False for one without a heartbeat for longer than its lease TTL."""
        await self.open()
        return await self._deploys.workers()

    async def deployments(self, *, cap: int | None = deploy.COUNT_CAP) -> list[Deployment]:
        """Every version with a weight, open runs or a live worker: its weight, state, live
        workers, open runs by status, oldest open run and stranded runs, each count stopping
        at `cap` (`Deployment.capped`; None: exact, a count of every open run)."""
        await self.open()
        return await self._deploys.deployments(cap)

    async def route(self, weights: Mapping[str, int], *, actor: str | None = None
                    ) -> list[Deployment]:
        """Set the whole weight table ({"v1": 90, "v2": 10}): a version not named gets 0.
        Weights are integers >= 0 summing to more than 0, of versions a worker registered
        (or this runtime's own). New runs only: a run stays on the version it started on."""
        await self.open()
        return await self._deploys.route(weights, actor)

    async def drain(self, version: str, *, actor: str | None = None) -> Deployment:
        """Weight 0 for `version`: no new run goes to it; its open runs finish on it."""
        await self.open()
        return await self._deploys.drain(version, actor)

    async def retire(self, version: str, *, actor: str | None = None) -> Deployment:
        """Retire a drained version (no open run left): it never takes a run again.
        Refused, naming its open runs, while it has any."""
        await self.open()
        return await self._deploys.retire(version, actor)

    async def upgrade(self, from_version: str, to_version: str, *,
                      thread_ids: Sequence[str] | None = None, dry_run: bool = False,
                      skip_refused: bool = False, actor: str | None = None) -> Upgrade:
        """Move parked runs (queued, waiting, sleeping: never a leased running run) of
        `from_version` (or only `thread_ids`) to `to_version` without waking them, each
        checked first: its agent and next node must exist in what `to_version`'s live
        workers registered. All or nothing: if any is refused (listed with the reason),
        nothing moves, unless `skip_refused`; `dry_run` only plans."""
        await self.open()
        return await self._deploys.upgrade(from_version, to_version, thread_ids=thread_ids,
                                           dry_run=dry_run, skip_refused=skip_refused, actor=actor)
