"""The records of rainbow deploys (the worker registry, the weight table) that cross the
Store boundary; the operations are the Deployments part of the Store (store/base.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WorkerBeat:
    """What a worker's heartbeat says about it (one upsert of its registry row)."""

    id: str
    host: str
    pid: int
    version: str
    agents: str  # JSON {agent: [node names, the start node first]}
    concurrency: int
    busy: int
    lease_ttl: float


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    """A worker's registry row: its last heartbeat, and stopped_at once it stopped cleanly."""

    id: str
    host: str
    pid: int
    version: str
    agents: str
    concurrency: int
    busy: int
    lease_ttl: float
    started_at: float
    last_seen: float
    stopped_at: float | None


@dataclass(frozen=True, slots=True)
class DeploymentRecord:
    """A version's routing weight (and when it was retired, if it was)."""

    version: str
    weight: int
    retired_at: float | None
    updated_at: float


@dataclass(frozen=True, slots=True)
class OpenRuns:
    """How many runs of `version` are open with `status`, and when the oldest was created."""

    version: str
    status: str
    count: int
    oldest: float
