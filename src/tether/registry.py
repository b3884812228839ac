"""Registry: what a process serves — its agents, its effect handlers and its version.

The Runtime fills it (`Runtime(agents=...)`, `@runtime.effect(name)`); a Worker reads it to
know which runs it may claim and which code runs them. It holds definitions only: no
connection, no run, no task.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from .agent import Agent
from .errors import DefinitionError
from .outbox import EffectHandler, make_handler
from .retry import RetryPolicy


class Registry:
    """Agents by name, effect handlers by name, and the code version that serves them."""

    __slots__ = ("agents", "dialect", "effect_handlers", "version")

    def __init__(self, version: str, dialect: str, agents: Iterable[Agent] = ()) -> None:
        if not isinstance(version, str) or not version:
            raise DefinitionError("version must be a non-empty string")
        self.version = version
        self.dialect = dialect
        """The store's dialect: transactional effect handlers are checked against it."""
        self.agents: dict[str, Agent] = {}
        self.effect_handlers: dict[str, EffectHandler] = {}
        for a in agents:
            self.add_agent(a)

    def add_agent(self, agent: Agent) -> None:
        if not isinstance(agent, Agent):
            raise DefinitionError(f"agents must be tether.Agent instances, got {agent!r}")
        if agent.name in self.agents and self.agents[agent.name] is not agent:
            raise DefinitionError(f"two agents are named {agent.name!r}")
        self.agents[agent.name] = agent

    def agent(self, name: str | Agent) -> Agent:
        key = name.name if isinstance(name, Agent) else name
        try:
            return self.agents[key]
        except KeyError:
            raise DefinitionError(
                f"unknown agent {key!r}; this runtime has: {', '.join(self.agents) or 'none'}"
            ) from None

    def add_effect(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        retry: RetryPolicy | None = None,
        compensate: Callable[[Any, str], Awaitable[Any]] | None = None,
        transactional: bool = False,
    ) -> EffectHandler:
        if name in self.effect_handlers:
            raise DefinitionError(f"effect {name!r} already has a handler")
        handler = make_handler(name, fn, retry=retry, compensate=compensate,
                               transactional=transactional, dialect=self.dialect)
        self.effect_handlers[name] = handler
        return handler

    def copy(self, dialect: str) -> Registry:
        """The same agents, handlers and version for a store of `dialect` (handlers are
        checked again: a transactional handler's shape depends on the dialect)."""
        other = Registry(self.version, dialect, self.agents.values())
        for h in self.effect_handlers.values():
            other.add_effect(h.name, h.fn, retry=h.retry, compensate=h.compensate,
                             transactional=h.transactional)
        return other

    @property
    def compensable(self) -> list[str]:
        """Names of effects that have a compensate handler."""
        return [h.name for h in self.effect_handlers.values() if h.compensate is not None]
