"""Context: what a node can do besides computing its update.

`await ctx.call(fn, ...)` is journaled: the result is committed before it is returned, and a
re-execution of the same step (after a crash or retry) gets the recorded result back without
calling again. Calls are matched by index within the step and checked by name. So are
`ctx.stream_call` (a stream, forwarded chunk by chunk, journaled once assembled) and
`ctx.cpu_call` (a sync function in the worker's process pool); how they run the first time
is tether.calls. A result that reports token usage (tether.llm) is journaled with it.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from types import CoroutineType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, overload

from . import _declared, calls, llm, serde
from ._typed import UnknownType
from .errors import DefinitionError, DuplicateEffectKey, NondeterminismError, RunNotFound
from .history import load_state
from .ids import check_thread_id
from .retry import RetryPolicy
from .store.base import (
    INTERRUPT_CALL,
    JOIN_CALL,
    SLEEP_CALL,
    EffectRow,
    NewRun,
    OutMessage,
    Park,
)
from .types import TERMINAL

if TYPE_CHECKING:
    from .hub import RunObserver
    from .leases import LeaseClock
    from .outbox import EffectHandler
    from .store.base import JournalRecord, Lease, Store


class AgentLike(Protocol):
    """What ctx.spawn needs of an agent (tether.Agent is one): context sits below agent.py."""

    @property
    def name(self) -> str: ...

    def start_node(self) -> str: ...


StreamSink = Callable[[str, dict[str, Any]], None]
ADMIN_CHANNEL = "tether.admins"
"""The group every group admin joins: the sparse inter-group layer (MegaAgent)."""


@dataclass(frozen=True, slots=True)
class Message:
    """A message in a run's mailbox."""

    id: int
    sender: str | None
    body: Any
    created_at: float


class Suspend(BaseException):
    """Raised by ctx.interrupt / ctx.sleep the first time they are reached: the worker parks
    the run. A BaseException so that `except Exception` in node code does not swallow it."""

    def __init__(self, park: Park) -> None:
        super().__init__(park.kind)
        self.park = park

T = TypeVar("T")
_NO_USAGE = frozenset({str, int, float, bool, type(None), bytes})  # results that report none


def _gen_ai(result: Any, usage: dict[str, int] | None, kwargs: dict[str, Any]
            ) -> dict[str, Any] | None:
    """The gen_ai.* attributes an observer gets with a call made live (the common call, no
    usage and no `model=`, costs one lookup)."""
    if usage is None and "model" not in kwargs:
        return None
    return llm.gen_ai_attributes(result, usage, kwargs.get("model"))


def _replayed(data: bytes, fn: Callable[..., Any]) -> Any:
    """A journaled result read back; a class it names that is not yet known may be one
    `fn`'s annotations declare (a replay in a new process: nothing wrote it here yet)."""
    try:
        return serde.loads(data)
    except UnknownType:
        _declared.declare(fn)
        return serde.loads(data)


def callable_name(fn: Callable[..., Any]) -> str:
    module = getattr(fn, "__module__", None) or ""
    qual = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    return f"{module}.{qual}" if module else str(qual)


class Context:
    """Handed to every node execution. One Context per execution of one step."""

    __slots__ = ("_agents", "_calls", "_clock", "_cpu", "_effect_handlers", "_journal", "_keyed",
                 "_lease", "_obs", "_sink", "_store", "agent", "attempt", "children", "effects",
                 "groups", "inbox",
                 "messages", "node", "step", "thread_id", "version", "worker")

    def __init__(
        self,
        *,
        store: Store,
        lease: Lease,
        agent: str,
        node: str,
        step: int,
        attempt: int,
        journal: list[JournalRecord],
        sink: StreamSink | None = None,
        effect_handlers: Mapping[str, EffectHandler] | None = None,
        inbox: list[Message] | None = None,
        agents: Mapping[str, AgentLike] | None = None,
        version: str = "",
        observer: RunObserver | None = None,
        cpu: Callable[[], Executor] | None = None,
        clock: LeaseClock | None = None,
    ) -> None:
        self._store = store
        self._clock = clock  # a live call is made only on a lease with time left (leases.py)
        self._obs = observer
        self._sink = sink
        self._cpu = cpu
        self._effect_handlers = effect_handlers if effect_handlers is not None else {}
        self.effects: list[EffectRow] = []
        """Effects requested by this execution, committed with its checkpoint."""
        self.inbox: list[Message] = inbox if inbox is not None else []
        """Messages delivered to this step, oldest first; consumed when the step commits."""
        self.messages: list[OutMessage] = []
        self.children: list[NewRun] = []
        self.groups: list[tuple[str, str]] = []
        self._agents = agents or {}
        self.version = version
        self._lease = lease
        self._journal = journal
        self._calls = 0
        self._keyed: dict[str, JournalRecord] | None = None
        self.thread_id = lease.thread_id
        self.worker = lease.worker
        self.agent = agent
        self.node = node
        self.step = step
        """The number of the checkpoint this execution will commit (1 for the first step)."""
        self.attempt = attempt
        """1 for the first execution of this step, 2 after one crash or failed attempt, ..."""

    def __repr__(self) -> str:
        return f"Context(thread_id={self.thread_id!r}, step={self.step}, node={self.node!r})"

    @property
    def db_url(self) -> str:
        """The URL of the database the run lives in (for a node that keeps its own tables
        there, as tether.langgraph's agent does)."""
        return self._store.url

    @overload
    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any, timeout: float | None = None,
                   retry: RetryPolicy | None = None, **kwargs: Any) -> T: ...

    @overload
    async def call(self, fn: Callable[..., T], *args: Any, timeout: float | None = None,
                   retry: RetryPolicy | None = None, **kwargs: Any) -> T: ...

    async def call(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None,
                   retry: RetryPolicy | None = None, **kwargs: Any) -> Any:
        """Call `fn(*args, **kwargs)` (sync or async) once per step, durably.

        The result is journaled before it is returned; on re-execution of this step the
        recorded result is returned instead of calling `fn` again. It may be JSON or a typed
        value (a pydantic model, dataclass, datetime, UUID, Decimal, enum, bytes, or JSON
        containing them: see tether.serde), read back as the same type. A different function
        at the same call index raises NondeterminismError.

        `timeout` (seconds; an async `fn` only) raises CallTimeout when it expires; `retry`
        retries the call in place, within the step, before a failure reaches the node's own
        policy: provider rate limits, timeouts and 5xx are retried (after their Retry-After),
        4xx request errors are not. Both are tether's: to pass `fn` arguments of these names,
        bind them first (functools.partial).
        """
        name = callable_name(fn)
        idx, rec = self._next(name)
        obs = self._obs
        if rec is not None:
            if obs is not None:
                now = time.time()
                obs.call(self.step, name, True, now, now)
            return _replayed(rec.result, fn)
        clock = self._clock  # _lease_left, inline: one coroutine less a call
        if clock is not None and clock.expiring():
            await clock.refresh(self._lease)
        started = time.time() if obs is not None else 0.0
        if timeout is None and retry is None:
            value = fn(*args, **kwargs)
            if type(value) is CoroutineType or inspect.isawaitable(value):
                value = await value
        else:
            value = await calls.attempts(lambda: calls.invoke(fn, args, kwargs), name, timeout,
                                         retry, self._on_retry(idx, name))
        data, decoded, usage = self._encode(idx, name, value)
        await self._store.record_call(self._lease, self.step, idx, name, data,
                                      calls.args_preview(args, kwargs))
        if obs is not None:
            obs.call(self.step, name, False, started, time.time(),
                     _gen_ai(decoded, usage, kwargs))
        # Return the decoded record so the first execution sees exactly what a replay sees.
        return decoded

    async def keyed_call(self, key: str, fn: Callable[..., Any], *args: Any,
                         **kwargs: Any) -> Any:
        """`ctx.call(fn, ...)` journaled under `key` (unique within the step) instead of by
        its order in the step: for calls made concurrently (LangGraph's parallel tasks in one
        super-step), whose order changes from one execution to the next, and some of which a
        re-execution does not make at all. Make them after the step's ordered calls (`call`,
        `interrupt`): an ordered call after a keyed one is not matched on replay."""
        name = f"{callable_name(fn)}#{key}"
        if self._keyed is None:
            self._keyed = {r.name: r for r in self._journal[self._calls:]}
        rec = self._keyed.get(name)
        obs = self._obs
        if rec is not None:
            if obs is not None:
                now = time.time()
                obs.call(self.step, name, True, now, now)
            return _replayed(rec.result, fn)
        # A fresh index past every recorded one (a replay makes its new calls after them).
        idx = self._calls = max(self._calls, len(self._journal))
        self._calls += 1
        started = time.time() if obs is not None else 0.0
        value = fn(*args, **kwargs)
        if inspect.isawaitable(value):
            value = await value
        data, decoded, usage = self._encode(idx, name, value)
        await self._store.record_call(self._lease, self.step, idx, name, data,
                                      calls.args_preview(args, kwargs))
        if obs is not None:
            obs.call(self.step, name, False, started, time.time(),
                     _gen_ai(decoded, usage, kwargs))
        return decoded

    async def replay_keyed(self, step: int) -> list[JournalRecord]:
        """Let this execution's keyed calls replay the ones an earlier `step` of the run
        journaled (keys that step used and this one uses again: a LangGraph node resumed
        after an interrupt runs its task again). Returns that step's journal."""
        records = await self._store.load_journal(self.thread_id, step)
        if self._keyed is None:
            self._keyed = {r.name: r for r in self._journal[self._calls:]}
        for r in records:
            if "#" in r.name:
                self._keyed.setdefault(r.name, r)
        return records

    async def stream_call(self, fn: Callable[..., Any], *args: Any,
                          assemble: Callable[[list[Any]], Any] | None = None,
                          timeout: float | None = None, retry: RetryPolicy | None = None,
                          **kwargs: Any) -> Any:
        """Call `fn(*args, **kwargs)`, which starts a stream (an SDK's `stream=True` call:
        an async iterator of chunks), once per step, durably. Each chunk goes to the run's
        live events as it arrives ({"type": "stream", "call": index, "data": chunk}); the
        chunks assembled into one result (OpenAI chunks into a ChatCompletion, Anthropic
        events into a Message, text joined: tether.llm.assemble, or `assemble(chunks)`) are
        journaled and returned. On re-execution the recorded result is returned with no call
        and no chunks: subscribers get a {"type": "replayed"} event with it instead. A stream
        cut off before it ends is not journaled, so the step calls again when re-executed.
        `timeout` and `retry` as for `call`, over the whole stream."""
        name = callable_name(fn)
        idx, rec = self._next(name)
        obs = self._obs
        if rec is not None:
            value = _replayed(rec.result, fn)
            if obs is not None:
                now = time.time()
                obs.call(self.step, name, True, now, now)
            if self._sink is not None:
                self._sink(self.thread_id, {"type": "replayed", "step": self.step, "call": idx,
                                            "name": name, "data": llm.chunk_json(value)})
            return value
        await self._lease_left()
        started = time.time() if obs is not None else 0.0
        sink, thread_id, step = self._sink, self.thread_id, self.step

        def forward(chunk: Any) -> None:
            if sink is not None:
                sink(thread_id, {"type": "stream", "step": step, "call": idx,
                                 "data": llm.chunk_json(chunk)})

        value = await calls.attempts(lambda: calls.stream(fn, args, kwargs, forward, assemble),
                                     name, timeout, retry, self._on_retry(idx, name))
        data, decoded, usage = self._encode(idx, name, value)
        await self._store.record_call(self._lease, self.step, idx, name, data,
                                      calls.args_preview(args, kwargs))
        if obs is not None:
            obs.call(self.step, name, False, started, time.time(),
                     _gen_ai(decoded, usage, kwargs))
        return decoded

    async def cpu_call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run the sync, picklable `fn(*args, **kwargs)` in the worker's process pool
        (`tether worker --cpu-workers N`), once per step, durably (journaled as `call`), so
        CPU-bound work (tokenizing, embedding, parsing) does not stall the other runs sharing
        the event loop. Arguments and result cross a process boundary (pickled)."""
        name = callable_name(fn)
        idx, rec = self._next(name)
        obs = self._obs
        if rec is not None:
            if obs is not None:
                now = time.time()
                obs.call(self.step, name, True, now, now)
            replayed: T = _replayed(rec.result, fn)
            return replayed
        await self._lease_left()
        started = time.time() if obs is not None else 0.0
        value = await calls.in_process(self._cpu, fn, args, kwargs, name)
        data, decoded, _ = self._encode(idx, name, value)
        await self._store.record_call(self._lease, self.step, idx, name, data,
                                      calls.args_preview(args, kwargs))
        if obs is not None:
            obs.call(self.step, name, False, started, time.time())
        return decoded  # type: ignore[no-any-return]

    def _encode(self, idx: int, name: str, value: Any
                ) -> tuple[bytes, Any, dict[str, int] | None]:
        """(journal bytes with the token usage if any, the result as a replay reads it, that
        usage)."""
        data, decoded = serde.encode(value, f"result of call #{idx} to {name}", typed=True)
        usage = None
        if type(decoded) not in _NO_USAGE:
            usage = llm.usage_of(decoded)
            if usage is not None:
                data = serde.with_usage(data, usage)
        return data, decoded, usage

    def _on_retry(self, idx: int, name: str) -> calls.OnRetry:
        def on_retry(failures: int, delay: float, exc: BaseException) -> None:
            if self._sink is not None:
                failure = llm.provider_failure(exc)
                self._sink(self.thread_id, {
                    "type": "call_retry", "step": self.step, "call": idx, "name": name,
                    "failures": failures, "delay": delay,
                    "category": "llm_provider" if failure is not None else "exception",
                    "error": f"{type(exc).__name__}: {exc}"})
        return on_retry

    def interrupt(self, payload: Any = None) -> Any:
        """Ask a person for input. The first time this is reached the run parks as `waiting`
        with `payload` recorded (nothing after it in this node runs, and no worker is held);
        once `runtime.resume(thread_id, value)` answers it, the node runs again from its top
        and this call returns `value`. Several interrupts in a node are answered in order."""
        idx, rec = self._next(INTERRUPT_CALL)
        if rec is not None:
            return serde.loads(rec.result)
        data = serde.dumps(payload, "interrupt payload")
        iid = f"{self.thread_id}:{self.step}:{idx}"
        raise Suspend(Park("interrupt", self.step, idx, interrupt_id=iid, payload=data))

    def sleep(self, seconds: float) -> None:
        """A durable timer: the first time, the run parks as `sleeping` and is claimable again
        after `seconds` (across worker restarts); the node then runs again from its top and
        this call returns at once."""
        if not isinstance(seconds, (int, float)) or seconds < 0:
            raise ValueError(f"ctx.sleep() takes seconds >= 0, got {seconds!r}")
        _, rec = self._next(SLEEP_CALL)
        if rec is not None:
            return
        raise Suspend(Park("sleep", self.step, self._calls - 1, seconds=float(seconds)))

    def stream(self, event: Any) -> None:
        """Send a live event (for example LLM tokens) to the run's subscribers (SSE clients,
        `runtime.subscribe`). Not persisted; dropped when nobody listens."""
        if self._sink is not None:
            self._sink(self.thread_id, {"type": "stream", "step": self.step,
                                        "data": serde.loads(serde.dumps(event, "stream event"))})

    def effect(self, name: str, payload: Any = None, key: str | None = None) -> str:
        """Request a side effect, performed after this step commits by the handler registered
        with `@runtime.effect(name)`, at least once, always with the same `key`. The default
        key derives from thread_id, step and the effect's index in the step, so it is stable
        across re-executions; an explicit key must be unique within the run. Returns the key."""
        handler = self._effect_handlers.get(name)
        if handler is None:
            known = ", ".join(sorted(self._effect_handlers)) or "none"
            raise DefinitionError(
                f"no effect handler named {name!r} is registered (use @runtime.effect({name!r})); "
                f"registered: {known}")
        idx = len(self.effects)
        data = serde.dumps(payload, f"payload of effect {name!r}")
        if key is None:
            key = f"{self.thread_id}:{self.step}:{idx}"
        elif not isinstance(key, str) or not key or len(key) > 500:
            raise DefinitionError("an effect key must be a non-empty string of <= 500 characters")
        elif any(e.key == key for e in self.effects):
            raise DuplicateEffectKey(f"effect key {key!r} used twice in one step")
        apply = handler.tx_apply if handler.transactional else None
        self.effects.append(EffectRow(key, idx, name, data, apply,
                                      compensable=handler.compensate is not None))
        return key

    def send(self, thread_id: str, message: Any) -> None:
        """Send `message` to another run's mailbox, committed with this step's checkpoint
        (nothing leaks from a step that does not commit). An unknown thread_id fails the step."""
        if not isinstance(thread_id, str) or not thread_id:
            raise DefinitionError("ctx.send() needs the recipient's thread_id")
        self.messages.append(OutMessage(serde.dumps(message, "message"), recipient=thread_id))

    def publish(self, group: str, message: Any) -> None:
        """Send `message` to every member of `group` but this run (intra-group chat). The
        admins of all groups share the group `tether.ADMIN_CHANNEL` (inter-group chat)."""
        if not isinstance(group, str) or not group:
            raise DefinitionError("ctx.publish() needs a group name")
        self.messages.append(OutMessage(serde.dumps(message, "message"), group=group))

    def join_group(self, group: str, *, admin: bool = False) -> None:
        """Make this run a durable member of `group` (committed with the step); an admin also
        joins the admin channel shared by the admins of all groups."""
        if not isinstance(group, str) or not group:
            raise DefinitionError("ctx.join_group() needs a group name")
        self.groups.append((group, "admin" if admin else "member"))
        if admin:
            self.groups.append((ADMIN_CHANNEL, "member"))

    def spawn(self, agent: AgentLike | str, input: Mapping[str, Any] | None = None,
              thread_id: str | None = None) -> str:
        """Create a child run when this step commits; returns its thread_id (stable across
        re-executions of the step). `await ctx.join([...])` waits for children."""
        name = agent if isinstance(agent, str) else agent.name
        target = self._agents.get(name)
        if target is None:
            raise DefinitionError(f"ctx.spawn(): unknown agent {name!r}")
        if thread_id is not None:
            check_thread_id(thread_id, "ctx.spawn()'s thread_id")
        child_id = thread_id or f"{self.thread_id}.{self.step}.{len(self.children)}"
        data = serde.dumps(dict(input or {}), "input")
        self.children.append(NewRun(
            thread_id=child_id, agent=name, version=self.version, node=target.start_node(),
            input=data, input_hash=serde.digest(name.encode() + b"\0" + data),
            parent_thread_id=self.thread_id))
        return child_id

    async def join(self, thread_ids: Sequence[str]) -> list[dict[str, Any]]:
        """Wait until every listed run is completed, failed or cancelled; returns, in order,
        {"thread_id", "status", "state", "error"} for each (errors as values, not raised).
        The first time, the run parks (no worker held) and this node runs again later."""
        ids = list(thread_ids)
        idx, rec = self._next(JOIN_CALL)
        if rec is not None:
            done: list[dict[str, Any]] = serde.loads(rec.result)
            return done
        results = await self._join_results(ids)
        if results is not None:
            data = serde.dumps(results, "join result")
            await self._store.record_call(self._lease, self.step, idx, JOIN_CALL, data)
            return results
        # Children spawned by this execution are created as the run parks.
        raise Suspend(Park("join", self.step, idx, children=ids, spawn=tuple(self.children)))

    async def _join_results(self, ids: list[str]) -> list[dict[str, Any]] | None:
        spawned = {c.thread_id for c in self.children}
        results: list[dict[str, Any]] = []
        for tid in ids:
            run = await self._store.get_run(tid)
            if run is None:
                if tid in spawned:
                    return None
                raise RunNotFound(f"ctx.join(): no run with thread_id {tid!r}")
            if run.status not in TERMINAL:
                return None
            state, _ = await load_state(self._store, run)
            results.append({"thread_id": tid, "status": run.status, "state": state,
                            "error": None if run.error is None else serde.loads(run.error)})
        return results

    async def _lease_left(self) -> None:
        """Before a live call: renew a lease about to expire, or LeaseLost (no call made)."""
        clock = self._clock
        if clock is not None and clock.expiring():
            await clock.refresh(self._lease)

    def _next(self, name: str) -> tuple[int, JournalRecord | None]:
        """The next call index and its journal record, checking the recorded name."""
        idx = self._calls
        self._calls += 1
        if idx >= len(self._journal):
            return idx, None
        rec = self._journal[idx]
        if rec.name != name:
            raise NondeterminismError(
                f"run {self.thread_id!r} step {self.step} node {self.node!r}: call #{idx} is "
                f"{name!r} but the journal recorded {rec.name!r}; node code must make the "
                f"same calls in the same order when it is re-executed"
            )
        return idx, rec
