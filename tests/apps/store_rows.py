"""Rows for tests that drive a store directly: a new run, a step commit, a claimed lease."""

from __future__ import annotations

import hashlib
import time
import uuid

import orjson

from tether.store.base import Lease, NewRun, StepCommit, Store


def new_run() -> NewRun:
    """A run of agent `a` on v1 at node `start`, of a fresh thread_id."""
    data = orjson.dumps({})
    return NewRun(thread_id=f"r-{uuid.uuid4().hex[:10]}", agent="a", version="v1",
                  node="start", input=data, input_hash=hashlib.sha256(data).hexdigest())


def step_commit(lease: Lease, step: int) -> StepCommit:
    """Step `step` of `lease`'s run committed, the run going on at `start`."""
    now = time.time()
    return StepCommit(lease=lease, step=step, node="start", next_node="start", kind="d",
                      data=b"{}", attempt=1, started_at=now, finished_at=now, status="running")


async def leased(store: Store) -> Lease:
    """A new run, claimed by worker `w`: its lease."""
    run, _ = await store.create_run(new_run())
    (claimed,) = await store.claim_runs("w", "v1", ["a"], 10, 60.0)
    return Lease(run.thread_id, "w", claimed.epoch)
