"""What a worker writes about itself and its runs: its id, the agents it serves, a failed run's
error record."""

from __future__ import annotations

import os
import socket
import traceback
import uuid

from . import serde
from .registry import Registry
from .retry import FailureCategory


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def agents_json(registry: Registry) -> str:
    """The registry's agents and their node names, the start node first (as registered)."""
    out = {}
    for name, agent in registry.agents.items():
        start = agent.start
        out[name] = ([start] if start else []) + [n for n in agent.nodes if n != start]
    return serde.dumps(out).decode()


def error_json(category: FailureCategory, exc: BaseException, attempts: int = 1,
               node: str | None = None) -> bytes:
    """A run's error as stored in its record; `node` names the node whose step failed."""
    return serde.dumps({
        "node": node,
        "category": category.value,
        "attempts": attempts,
        "type": type(exc).__qualname__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
    })
