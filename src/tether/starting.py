"""How a run comes to exist (Runtime.start and fork): the checks of the arguments, the
version and start node routing gives a new run, its trace context, and the insert that hands
a new run straight to a worker of this process with a free slot."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from . import deploy, serde
from .agent import Agent
from .deploy import Routes
from .errors import DefinitionError, InvalidState, SerializationError
from .hub import EventHub
from .store.base import Audit, Lease, NewRun, RunRecord, Store
from .worker import Worker, co_resident


def check_args(input: Mapping[str, Any] | None, thread_id: str | None,
               idempotency_key: str | None) -> bytes:
    """start()'s input as journal bytes, once the arguments are checked."""
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
    return data


def new_run(agent: Agent, data: bytes, thread_id: str | None, idempotency_key: str | None,
            version: str | None, routes: Routes, own: str) -> NewRun:
    """The run to insert: its version is `version` if given (a known one), else the weights'
    choice for its thread_id, else `own`; on another version than `own`, its start node is
    the one that version's workers registered."""
    thread_id = thread_id or uuid.uuid4().hex
    node = agent.start_node()
    if version is None:
        version = routes.choose(thread_id, own, agent.name)
    else:
        deploy.known_version(version, routes, own)
    if version in routes.retired:
        raise InvalidState(f"version {version!r} is retired; it takes no new runs")
    if version != own:
        node = routes.start_node(version, agent.name) or node
    return NewRun(thread_id=thread_id, agent=agent.name, version=version, node=node, input=data,
                  input_hash=input_hash(agent.name, data), idempotency_key=idempotency_key)


def input_hash(agent: str, data: bytes) -> str:
    return serde.digest(agent.encode() + b"\0" + data)


def traced(new: NewRun, hub: EventHub, traceparent: str | None) -> NewRun:
    """`new` with the trace context its observers give it (or as it is, without any)."""
    if hub.observers or traceparent is not None:
        trace = hub.run_created(new, None, traceparent, time.time())
        if trace is not None:
            return dataclasses.replace(new, trace_context=trace)
    return new


async def create(store: Store, new: NewRun, workers: Sequence[Worker], own: str,
                 lease_ttl: float, audit: Audit | None = None) -> tuple[RunRecord, bool]:
    """Insert the run (or find it there); when a worker of this process of the run's version
    has a free slot (one of `workers`, the runtime's own, of version `own`; else another
    runtime's on the same database), insert it leased to that worker and hand it over (no
    claim round trip, no wake-up of other workers)."""
    if new.version != own:
        workers = co_resident(store, new.version, new.agent)
    worker = next((w for w in workers if w.reserve()), None)
    if worker is None:
        return await store.create_run(new, audit=audit)
    since = time.monotonic()  # the run's lease runs from (at the latest) now
    try:
        rec, created = await store.create_run(new, lease=(worker.id, lease_ttl), audit=audit)
    except BaseException:
        worker.unreserve()
        raise
    if not (created and rec.lease_owner == worker.id):
        worker.unreserve()
    elif not worker.adopt(rec, since):  # it began stopping meanwhile: let others claim it
        await store.release_runs([Lease(rec.thread_id, worker.id, rec.epoch)])
    return rec, created
