"""What a worker writes about itself and its runs: its id, the agents it serves, a failed run's
error record; and what it says about other versions' stranded runs."""

from __future__ import annotations

import logging
import os
import socket
import traceback
import uuid

from . import deploy, serde
from .errors import StoreError
from .registry import Registry
from .retry import FailureCategory
from .store.base import Store

log = logging.getLogger("tether.worker")


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


async def report_stranded(store: Store, version: str, lease_ttl: float) -> None:
    """Say (a worker of `version`, once per interval) which other versions have runs nobody
    will resume."""
    try:
        found = await deploy.deployments(store, lease_ttl)
    except StoreError as exc:
        log.warning("could not check for stranded runs: %s", exc)
        return
    for d in found:
        if d.stranded and d.version != version:
            log.warning(
                "%d runs of version %s are stranded: no worker of %s has been seen for "
                "more than %.1fs; start one, or move the parked ones with `tether runs "
                "upgrade --from %s --to %s`", d.stranded, d.version, d.version,
                lease_ttl, d.version, version)
