"""Context: what a node can do besides computing its update.

`await ctx.call(fn, ...)` is journaled: the result is committed before it is returned, and a
re-execution of the same step (after a crash or retry) gets the recorded result back without
calling again. Calls are matched by index within the step and checked by name.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from . import serde
from .errors import NondeterminismError

if TYPE_CHECKING:
    from .store.base import JournalRecord, Lease, Store

T = TypeVar("T")


def callable_name(fn: Callable[..., Any]) -> str:
    module = getattr(fn, "__module__", None) or ""
    qual = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    return f"{module}.{qual}" if module else str(qual)


class Context:
    """Handed to every node execution. One Context per execution of one step."""

    __slots__ = ("_calls", "_journal", "_lease", "_store", "agent", "attempt", "node", "step",
                 "thread_id", "worker")

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
    ) -> None:
        self._store = store
        self._lease = lease
        self._journal = journal
        self._calls = 0
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

    async def call(self, fn: Callable[..., Awaitable[T] | T], *args: Any, **kwargs: Any) -> T:
        """Call `fn(*args, **kwargs)` (sync or async) once per step, durably.

        The JSON-serializable result is journaled before it is returned; on re-execution of
        this step the recorded result is returned instead of calling `fn` again. A different
        function at the same call index raises NondeterminismError.
        """
        idx = self._calls
        self._calls += 1
        name = callable_name(fn)
        if idx < len(self._journal):
            rec = self._journal[idx]
            if rec.name != name:
                raise NondeterminismError(
                    f"run {self.thread_id!r} step {self.step} node {self.node!r}: call #{idx} is "
                    f"{name!r} but the journal recorded {rec.name!r}; node code must make the "
                    f"same calls in the same order when it is re-executed"
                )
            result: T = serde.loads(rec.result)
            return result
        value = fn(*args, **kwargs)
        if inspect.isawaitable(value):
            value = await value
        data = serde.dumps(value, f"result of call #{idx} to {name}")
        await self._store.record_call(self._lease, self.step, idx, name, data)
        # Return the decoded record so the first execution sees exactly what a replay sees.
        replayed: T = serde.loads(data)
        return replayed
