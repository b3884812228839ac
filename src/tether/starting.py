"""How a run comes to exist (Runtime.start and fork): the checks of the arguments, the
version and start node routing gives a new run, its trace context, and the insert that hands
a new run straight to a worker of this process with a free slot."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from . import deploy, serde
from .agent import Agent
from .deploy import Routes
from .errors import DefinitionError, InvalidState, SerializationError, TetherError
from .hub import EventHub
from .ids import check_thread_id
from .store.audit import audit_of
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
    if thread_id is not None:
        check_thread_id(thread_id)
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


MAX_BATCH = 10_000
"""The most runs one start_many (and one POST /runs:batch) takes."""


def batch_items(requests: Sequence[Mapping[str, Any]]) -> list[tuple[str, Mapping[str, Any] | None,
                                                                     str | None, str | None,
                                                                     str | None]]:
    """start_many's requests as (agent, input, thread_id, idempotency_key, version), every one
    checked before anything is written; DefinitionError names the first bad one by index."""
    if isinstance(requests, (str, bytes, Mapping)) or not isinstance(requests, Sequence):
        raise DefinitionError("start_many() takes a list of requests (mappings with agent, "
                              "input and optional thread_id, idempotency_key, version)")
    if len(requests) > MAX_BATCH:
        raise DefinitionError(f"start_many() takes at most {MAX_BATCH} requests at once, got "
                              f"{len(requests)}; split the batch")
    fields = {"agent", "input", "thread_id", "idempotency_key", "version"}
    items = []
    for i, req in enumerate(requests):
        if not isinstance(req, Mapping):
            raise DefinitionError(f"start_many() request {i} must be a mapping, got "
                                  f"{type(req).__name__}")
        extra = set(req) - fields
        if extra or "agent" not in req:
            why = (f"has unknown keys {sorted(map(str, extra))}" if extra
                   else "has no 'agent'")
            raise DefinitionError(f"start_many() request {i} {why}; a request takes "
                                  f"{', '.join(sorted(fields))}")
        items.append((req["agent"], req.get("input"), req.get("thread_id"),
                      req.get("idempotency_key"), req.get("version")))
    return items


Checked = tuple[Agent, bytes, "str | None", "str | None", "str | None"]


def _labelled(i: int, exc: TetherError) -> TetherError:
    labelled = type(exc)(f"request {i}: {exc}")
    labelled.__cause__ = exc
    return labelled


def check_batch(items: Sequence[tuple[Any, Any, Any, Any, Any]],
                agent_of: Callable[[Any], Agent]) -> list[Checked]:
    """Each request's agent and input bytes, as start() checks them; the first bad request
    raises, named by its index."""
    checked = []
    for i, (agent, input, thread_id, key, version) in enumerate(items):
        try:
            checked.append((agent_of(agent), check_args(input, thread_id, key), thread_id, key,
                            version))
        except TetherError as exc:
            raise _labelled(i, exc) from None
    return checked


def plan_one(agent: Agent, data: bytes, thread_id: str | None, key: str | None,
             version: str | None, routes: Routes, own: str, hub: EventHub, actor: str | None,
             traceparent: str | None = None) -> tuple[NewRun, Audit | None]:
    """The run to insert, routed and traced, and its audit row (with `actor`)."""
    new = traced(new_run(agent, data, thread_id, key, version, routes, own), hub, traceparent)
    return new, audit_of(actor, "start", new.thread_id, new.thread_id,
                         {"agent": agent.name, "version": new.version, "idempotency_key": key})


def plan_batch(checked: Sequence[Checked], routes: Routes, own: str, hub: EventHub,
               actor: str | None) -> list[tuple[NewRun, Audit | None]]:
    """plan_one of each checked request; the first refused raises, named by its index."""
    planned = []
    for i, (agent, data, thread_id, key, version) in enumerate(checked):
        try:
            planned.append(plan_one(agent, data, thread_id, key, version, routes, own, hub,
                                    actor))
        except TetherError as exc:
            raise _labelled(i, exc) from None
    return planned


async def create_batch(store: Store, planned: Sequence[tuple[NewRun, Audit | None]],
                       workers: Sequence[Worker], own: str,
                       lease_ttl: float) -> list[tuple[RunRecord, bool]]:
    """Every run inserted at once (the store's writer group-commits them); the first that
    failed raises, named by its index, once all the others are written."""
    made = await asyncio.gather(*(create(store, new, workers, own, lease_ttl, audit)
                                  for new, audit in planned), return_exceptions=True)
    for i, got in enumerate(made):
        if isinstance(got, TetherError):
            raise _labelled(i, got)
        if isinstance(got, BaseException):
            raise got
    return cast(list[tuple[RunRecord, bool]], made)
