"""What a worker makes of a node's result: the next node of the command it returned, and the
events of the step it committed for the run's subscribers in this process."""

from __future__ import annotations

from typing import Any

from .agent import Agent, Command
from .errors import DefinitionError
from .hub import EventHub


def step_events(hub: EventHub, thread_id: str, step: int, node: str, next_node: str | None,
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


def check_command(agent: Agent, node_name: str | None, cmd: Any) -> str | None:
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
