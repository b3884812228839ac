"""Agents, nodes and the commands a node returns."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

from . import _declared
from .errors import DefinitionError
from .retry import RetryPolicy
from .state import Append, append

if TYPE_CHECKING:
    from .context import Context

State = dict[str, Any]
__all__ = ["Agent", "Append", "Command", "Node", "append", "finish", "goto", "receive"]
NodeFn = Callable[[State, "Context"], Awaitable["Command"]]


@dataclass(frozen=True, slots=True)
class Command:
    """What a node returns: where the run goes next and the update to merge into state.

    kind: "goto" (run `node` next), "finish" (run completed), or "receive" (an actor parks
    until mail arrives, then this node runs again with the batch in `ctx.inbox`).
    """

    kind: str
    node: str | None = None
    update: Mapping[str, Any] | None = None


def goto(node: str, update: Mapping[str, Any] | None = None) -> Command:
    """Merge `update` into the state and continue with `node`."""
    return Command("goto", node, update)


def finish(update: Mapping[str, Any] | None = None) -> Command:
    """Merge `update` into the state and complete the run."""
    return Command("finish", None, update)


def receive(update: Mapping[str, Any] | None = None) -> Command:
    """Merge `update`, then park the run (Idle: no worker held) until mail arrives; the same
    node then runs again with the messages in `ctx.inbox`."""
    return Command("receive", None, update)


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    fn: NodeFn
    retry: RetryPolicy | None


class Agent:
    """A named state machine of async nodes.

    >>> agent = Agent("researcher")
    >>> @agent.node(start=True)
    ... async def plan(state, ctx): return finish({"done": True})
    """

    def __init__(self, name: str, *, retry: RetryPolicy | None = None,
                 typed_state: bool = False) -> None:
        if not isinstance(name, str) or not name.replace("-", "_").replace(".", "_").isidentifier():
            raise DefinitionError(f"agent name must be an identifier-like string, got {name!r}")
        self.name = name
        self.retry = retry or RetryPolicy()
        self.typed_state = bool(typed_state)
        """State (updates, snapshots) may hold typed values, as journal results do (pydantic
        models, dataclasses, datetimes, UUIDs, Decimals, enums, bytes: tether.serde); off, the
        state takes JSON types only."""
        self.nodes: dict[str, Node] = {}
        self.start: str | None = None
        self._explicit_start = False

    def __repr__(self) -> str:
        return f"Agent({self.name!r}, nodes={list(self.nodes)})"

    @overload
    def node(self, fn: NodeFn, /) -> NodeFn: ...

    @overload
    def node(
        self,
        fn: None = None,
        /,
        *,
        start: bool = False,
        name: str | None = None,
        retry: RetryPolicy | None = None,
    ) -> Callable[[NodeFn], NodeFn]: ...

    def node(
        self,
        fn: NodeFn | None = None,
        /,
        *,
        start: bool = False,
        name: str | None = None,
        retry: RetryPolicy | None = None,
    ) -> NodeFn | Callable[[NodeFn], NodeFn]:
        """Register an async node `(state, ctx) -> Command`. The node marked `start=True`, or
        else the first one registered, is where runs begin."""

        def register(f: NodeFn) -> NodeFn:
            if not inspect.iscoroutinefunction(f):
                raise DefinitionError(f"node {f.__qualname__!r} must be an `async def` function")
            node_name = name or f.__name__
            if node_name in self.nodes:
                raise DefinitionError(f"agent {self.name!r} already has a node {node_name!r}")
            if start and self._explicit_start:
                raise DefinitionError(
                    f"agent {self.name!r} has two start nodes: {self.start!r} and {node_name!r}"
                )
            self.nodes[node_name] = Node(node_name, f, retry)
            _declared.declare_later(f)  # its annotations allow the types its state holds
            if start or self.start is None:
                self.start = node_name
                self._explicit_start = start
            return f

        return register(fn) if fn is not None else register

    def get_node(self, name: str) -> Node:
        try:
            return self.nodes[name]
        except KeyError:
            raise DefinitionError(
                f"agent {self.name!r} has no node {name!r} (nodes: {', '.join(self.nodes) or 'none'})"
            ) from None

    def start_node(self) -> str:
        if self.start is None:
            raise DefinitionError(f"agent {self.name!r} has no nodes")
        return self.start

    def retry_for(self, node: Node) -> RetryPolicy:
        return node.retry or self.retry
