"""Effectively-once side effects: the outbox and its dispatcher.

A node requests an effect with `ctx.effect(name, payload, key=None)`; the row is written in
the step's checkpoint transaction, so an uncommitted step leaks nothing. After the commit the
dispatcher of any worker claims the row under a lease (with its own fencing epoch), calls the
handler with the payload and a stable key, and records it done; failures retry with backoff
until the handler's RetryPolicy gives up and the effect is `dead`. Delivery is at least once
with the same key each time, so an idempotent handler makes the effect happen once.

Transactional effects run inside the checkpoint's own transaction with its connection, so
writes to the same database happen exactly once, atomically with the step. When a run fails
for good or is cancelled, the `compensate` handlers of its effects run in reverse order
(saga), each an outbox effect with its own key (`<key>:compensate`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import serde
from .errors import DefinitionError, StoreError
from .retry import RetryPolicy
from .store.base import EffectRecord

if TYPE_CHECKING:
    from .store.base import Store

log = logging.getLogger("tether.outbox")

Handler = Callable[[Any, str], Awaitable[Any]]
DEFAULT_EFFECT_RETRY = RetryPolicy(attempts=10, initial=0.1, factor=2.0, maximum=30.0)


@dataclass(frozen=True, slots=True)
class EffectHandler:
    name: str
    fn: Callable[..., Any]
    retry: RetryPolicy
    compensate: Handler | None
    transactional: bool

    def tx_apply(self, conn: Any, payload: bytes, key: str) -> Any:
        """Run a transactional handler inside the step's transaction."""
        return self.fn(conn, serde.loads(payload), key)


def make_handler(
    name: str,
    fn: Callable[..., Any],
    *,
    retry: RetryPolicy | None,
    compensate: Handler | None,
    transactional: bool,
    dialect: str,
) -> EffectHandler:
    if not isinstance(name, str) or not name:
        raise DefinitionError("an effect name must be a non-empty string")
    is_async = inspect.iscoroutinefunction(fn)
    if transactional:
        if compensate is not None:
            raise DefinitionError(
                f"effect {name!r}: a transactional effect is undone with its step's transaction; "
                "it takes no compensate handler")
        if dialect == "sqlite" and is_async:
            raise DefinitionError(
                f"transactional effect {name!r}: on SQLite the handler is a plain function "
                "(conn: sqlite3.Connection, payload, key) run inside the step's transaction")
        if dialect == "postgres" and not is_async:
            raise DefinitionError(
                f"transactional effect {name!r}: on Postgres the handler is an async function "
                "(conn: psycopg.AsyncConnection, payload, key)")
    elif not is_async:
        raise DefinitionError(f"effect handler {name!r} must be an async function (payload, key)")
    if compensate is not None and not inspect.iscoroutinefunction(compensate):
        raise DefinitionError(f"compensate handler of effect {name!r} must be an async function")
    return EffectHandler(name, fn, retry or DEFAULT_EFFECT_RETRY, compensate, transactional)


class Dispatcher:
    """Claims due effects and performs them; runs inside a worker's TaskGroup. The worker's
    heartbeat renews the effect leases (a slow handler keeps its effect); on shutdown the
    worker waits for handlers within its grace period, then gives their effects back."""

    def __init__(self, store: Store, handlers: dict[str, EffectHandler], worker: str, *,
                 lease_ttl: float, poll_interval: float, concurrency: int = 1000) -> None:
        self.store = store
        self.handlers = handlers
        self.worker = worker
        self.lease_ttl = lease_ttl
        self.poll_interval = poll_interval
        self.concurrency = concurrency
        # Claims go in batches of a quarter of the slots: with handlers running, the next
        # claim waits until that many are free (finishing effects one by one does not cost a
        # claim each), and several smaller claims in a row let the store write the done marks
        # of one batch while it claims the next.
        self.claim_batch = max(1, concurrency // 4)
        self.names = [h.name for h in handlers.values() if not h.transactional]
        self.performed = 0
        self.tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
        # The latest claim of each effect in flight: a re-claim of our own (our lease expired
        # while the handler ran) bumps the epoch, and the done mark must carry the new one.
        self._current: dict[tuple[str, str], EffectRecord] = {}
        self._stopping = False
        self.observe: Callable[[EffectRecord, str, float, float], None] | None = None
        """Told of each handler call (effect, outcome done|retry|dead|lost, started, finished)."""

    @property
    def active(self) -> bool:
        return bool(self._current)

    def stop(self) -> None:
        self._stopping = True
        self.store.effects_available.set()

    async def run(self, tg: asyncio.TaskGroup) -> None:
        if not self.names:
            return
        wake = self.store.effects_available
        while not self._stopping:
            wake.clear()
            free = self.concurrency - len(self.tasks)
            claimed: list[EffectRecord] = []
            if free >= self.claim_batch or (free > 0 and not self.tasks):
                try:
                    claimed = await self.store.claim_effects(
                        self.worker, self.names, min(free, self.claim_batch), self.lease_ttl)
                except StoreError as exc:
                    log.warning("effect claim failed: %s", exc)
                for effect in claimed:
                    k = (effect.thread_id, effect.key)
                    self._current[k] = effect
                    if k not in self.tasks:
                        self.tasks[k] = tg.create_task(self._perform(k))
                if claimed:
                    continue
            try:
                async with asyncio.timeout(self.poll_interval):
                    await wake.wait()
            except TimeoutError:
                pass

    async def give_back(self, timeout: float) -> int:
        """Shutdown: wait for handlers up to `timeout`, then cancel the rest and return their
        effects to pending so another worker performs them at once; how many went back."""
        if not self.tasks:
            return 0
        _, late = await asyncio.wait(list(self.tasks.values()), timeout=timeout)
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late)
        return len(late)

    async def _perform(self, k: tuple[str, str]) -> None:
        try:
            await self._call(k)
        except asyncio.CancelledError:
            effect = self._current.get(k)
            if effect is not None:
                with contextlib.suppress(StoreError):
                    await self.store.fail_effect(effect, "the worker stopped during the handler",
                                                 0.0)
            raise
        except StoreError as exc:  # the lease expires and another attempt follows
            log.warning("effect %s/%s: could not record the outcome: %s", k[0], k[1], exc)
        finally:
            self.tasks.pop(k, None)
            self._current.pop(k, None)
            self.store.effects_available.set()

    async def _call(self, k: tuple[str, str]) -> None:
        effect = self._current[k]
        handler = self.handlers[effect.name]
        started = time.time()
        try:  # an undecodable payload is a failed attempt too, not a crashed worker
            payload = serde.loads(effect.payload)
            if effect.compensates is None:
                result = await handler.fn(payload, effect.key)
            else:
                result = await self._compensate(handler, effect, payload)
            data = serde.dumps(result, f"result of effect {effect.name!r}")
        except Exception as exc:
            effect = self._current[k]
            delay = handler.retry.next_delay(effect.attempts, exc)
            level = logging.WARNING if delay is None else logging.INFO
            log.log(level, "effect %s/%s attempt %d failed (%r)%s", effect.thread_id, effect.key,
                    effect.attempts, exc, "; dead" if delay is None else f"; retry in {delay:.2f}s")
            await self.store.fail_effect(effect, f"{type(exc).__name__}: {exc}", delay)
            if self.observe is not None:
                self.observe(effect, "retry" if delay is not None else "dead", started, time.time())
            return
        done = await self.store.complete_effect(self._current[k], data)
        if self.observe is not None:
            self.observe(effect, "done" if done else "lost", started, time.time())
        if done:
            self.performed += 1
        else:
            log.info("effect %s/%s: lease lost before done; another attempt will record it",
                     effect.thread_id, effect.key)

    async def _compensate(self, handler: EffectHandler, effect: EffectRecord, payload: Any) -> Any:
        if handler.compensate is None:
            return {"skipped": "no compensate handler"}
        original = await self.store.get_effect(effect.thread_id, effect.compensates or "")
        if original is None or original.status == "dead":
            return {"skipped": "the original effect was never performed"}
        result = None if original.result is None else serde.loads(original.result)
        return await handler.compensate({"payload": payload, "result": result}, effect.key)
