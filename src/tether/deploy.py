"""Rainbow deploys: several versions at once, routed by weight, drained, retired, upgraded.

A run belongs to one version for its whole life (workers claim only their own version's
runs) unless an operator moves it while it is parked (`upgrade`). A new run without an
explicit version gets one from the weight table: the same thread_id and table give the same
version in every process (`pick`: blake2b of the thread_id, never Python's salted hash()).
With no positive weight set, a run goes to the starting runtime's own version.

A version's state is derived, never stored: `retired` once retired, `active` with a weight
above 0 (or while no weight is set at all and it serves or has open runs), else `draining`
while it has open runs, then `drained`. A run is *stranded* when its version has had no
worker heartbeat for longer than the lease TTL (a clean stop counts as its last heartbeat),
and the run itself was last updated before that: nobody will ever resume it until a worker of
its version starts, or the run is moved.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import serde
from .errors import DefinitionError, InvalidState
from .store.audit import audit_of
from .store.base import PARKED, TERMINAL, DeploymentRecord, RunRecord, Store, WorkerRecord

log = logging.getLogger("tether.deploy")
OPEN = ("queued", "running", "waiting", "sleeping")
STATES = ("active", "draining", "drained", "retired")


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A worker process as its registry row says: `alive` while it beat within its lease
    TTL; `agents` maps each agent it serves to its node names (the start node first)."""

    id: str
    host: str
    pid: int
    version: str
    agents: dict[str, tuple[str, ...]]
    concurrency: int
    busy: int
    lease_ttl: float
    started_at: float
    last_seen: float
    alive: bool

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "host": self.host, "pid": self.pid, "version": self.version,
                "agents": {a: list(n) for a, n in self.agents.items()},
                "concurrency": self.concurrency, "busy": self.busy,
                "lease_ttl": self.lease_ttl, "started_at": self.started_at,
                "last_seen": self.last_seen, "alive": self.alive}


@dataclass(frozen=True, slots=True)
class Deployment:
    """One version: its routing weight and state, live workers, open runs by status (queued,
    running, waiting, sleeping), when its oldest open run was created, and how many of its
    open runs are stranded. Counts read with a cap stop there: `capped` names those that
    did (a status, or "stranded"), each then at least its count (shown "10,000+")."""

    version: str
    weight: int
    state: str
    workers: int
    runs: dict[str, int] = field(default_factory=dict)
    oldest_open: float | None = None
    stranded: int = 0
    retired_at: float | None = None
    capped: frozenset[str] = frozenset()

    @property
    def open(self) -> int:
        """The open runs (at least that many when a count was capped: `open_more`)."""
        return sum(self.runs.values())

    @property
    def open_more(self) -> bool:
        return any(s in self.capped for s in self.runs)

    def as_dict(self) -> dict[str, Any]:
        return {"version": self.version, "weight": self.weight, "state": self.state,
                "workers": self.workers, "runs": dict(self.runs), "open": self.open,
                "oldest_open": self.oldest_open, "stranded": self.stranded,
                "retired_at": self.retired_at, "capped": sorted(self.capped)}


def at_least(n: int, more: bool) -> str:
    """A count as a person reads it: "10,000+" when it stopped at a cap, else the number."""
    return f"{n:,}+" if more else str(n)


@dataclass(frozen=True, slots=True)
class Upgrade:
    """What `upgrade` moved (or, on a dry run or a refusal, would have moved) and what it
    refused, each refused run with the reason. `moved` is empty unless it was applied."""

    from_version: str
    to_version: str
    dry_run: bool
    applied: bool
    planned: tuple[str, ...]
    refused: tuple[tuple[str, str], ...]

    @property
    def moved(self) -> tuple[str, ...]:
        return self.planned if self.applied else ()

    def as_dict(self) -> dict[str, Any]:
        return {"from": self.from_version, "to": self.to_version, "dry_run": self.dry_run,
                "applied": self.applied, "planned": list(self.planned),
                "moved": list(self.moved),
                "refused": [{"thread_id": t, "reason": r} for t, r in self.refused]}


# -- routing (pure) -----------------------------------------------------------------------


def bucket(thread_id: str, total: int) -> int:
    """A stable number in [0, total) for a thread_id: the same in every process and run."""
    digest = hashlib.blake2b(thread_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % total


def pick(thread_id: str, weights: Sequence[tuple[str, int]]) -> str:
    """The version a new run of `thread_id` goes to: versions in name order take consecutive
    ranges of the weight total, each as wide as its weight."""
    total = sum(w for _, w in weights)
    if total <= 0:
        raise ValueError("no positive weight to route by")
    at = bucket(thread_id, total)
    for version, weight in weights:
        if at < weight:
            return version
        at -= weight
    raise AssertionError("unreachable")


def agents_of(rec: WorkerRecord) -> dict[str, tuple[str, ...]]:
    return {a: tuple(nodes) for a, nodes in serde.loads(rec.agents.encode()).items()}


def alive(rec: WorkerRecord, now: float) -> bool:
    return rec.stopped_at is None and rec.last_seen + rec.lease_ttl >= now


def catalog(rows: Sequence[WorkerRecord]) -> dict[str, dict[str, tuple[str, ...]]]:
    """Per version, the agents its workers serve with their node names (newer rows win)."""
    out: dict[str, dict[str, tuple[str, ...]]] = {}
    for rec in sorted(rows, key=lambda r: r.last_seen):
        out.setdefault(rec.version, {}).update(agents_of(rec))
    return out


@dataclass(frozen=True, slots=True)
class Routes:
    """What a runtime routes new runs by: the positive weights in version order, the retired
    versions, and each known version's agents (from its workers' rows)."""

    weights: tuple[tuple[str, int], ...] = ()
    retired: frozenset[str] = frozenset()
    agents: Mapping[str, Mapping[str, tuple[str, ...]]] = field(default_factory=dict)
    known: frozenset[str] = frozenset()

    def choose(self, thread_id: str, default: str, agent: str) -> str:
        """The version for a new run of `agent`: by weight among the versions that serve it
        (as far as their workers registered), `default` when no weight is set."""
        if not self.weights:
            return default
        serving = tuple((v, w) for v, w in self.weights
                        if v == default or v not in self.agents or agent in self.agents[v])
        return pick(thread_id, serving or self.weights)

    def start_node(self, version: str, agent: str) -> str | None:
        """The start node of `agent` in `version` as its workers registered it (None when no
        worker of that version has registered the agent)."""
        nodes = self.agents.get(version, {}).get(agent)
        return nodes[0] if nodes else None


async def load_routes(store: Store) -> Routes:
    table = await store.deploys.list_deployments()
    rows = await store.deploys.list_workers()
    return Routes(
        weights=tuple((d.version, d.weight) for d in table if d.weight > 0),
        retired=frozenset(d.version for d in table if d.retired_at is not None),
        agents=catalog(rows),
        known=frozenset(d.version for d in table) | {r.version for r in rows},
    )


# -- reading the state of every version -----------------------------------------------------


async def workers(store: Store) -> list[WorkerInfo]:
    """Registered workers that have not stopped cleanly (dead ones too: alive=False)."""
    now = await store.now()
    return [_info(r, now) for r in await store.deploys.list_workers() if r.stopped_at is None]


def _info(r: WorkerRecord, now: float) -> WorkerInfo:
    return WorkerInfo(r.id, r.host, r.pid, r.version, agents_of(r), r.concurrency, r.busy,
                      r.lease_ttl, r.started_at, r.last_seen, alive(r, now))


COUNT_CAP = 10_000
"""Deployments count each version's open runs of a status (and its stranded ones) up to
this many: one index range each, however many are parked; above it "10,000+"."""


async def deployments(store: Store, lease_ttl: float,
                      cap: int | None = COUNT_CAP) -> list[Deployment]:
    """Every version that has a weight row, open runs or a live worker, by name. A version's
    runs are stranded by the lease TTL its last worker registered (`lease_ttl` only for a
    version no worker ever registered). Counts stop at `cap` (None: exact, a full count)."""
    now = await store.now()
    table = {d.version: d for d in await store.deploys.list_deployments()}
    rows = await store.deploys.list_workers()
    live: dict[str, int] = {}
    last_beat: dict[str, WorkerRecord] = {}  # each version's worker heard from last
    for r in rows:
        if alive(r, now):
            live[r.version] = live.get(r.version, 0) + 1
        seen = last_beat.get(r.version)
        if seen is None or r.last_seen > seen.last_seen:
            last_beat[r.version] = r
    runs: dict[str, dict[str, int]] = {}
    oldest: dict[str, float] = {}
    capped: dict[str, set[str]] = {}
    for o in await store.deploys.open_runs(cap):
        if cap is not None and o.count > cap:
            capped.setdefault(o.version, set()).add(o.status)
        runs.setdefault(o.version, {})[o.status] = o.count if cap is None else min(o.count, cap)
        oldest[o.version] = min(oldest.get(o.version, o.oldest), o.oldest)
    routed = any(d.weight > 0 for d in table.values())
    out = []
    for version in sorted(set(table) | set(runs) | set(live)):
        d = table.get(version)
        weight = d.weight if d is not None else 0
        counts = runs.get(version, {})
        stranded = 0
        # The lease TTL its workers ran with decides, not the caller's: a run of a version
        # whose workers had a 3 s TTL is stranded 3 s after the last heartbeat.
        last = last_beat.get(version)
        ttl = last.lease_ttl if last is not None else lease_ttl
        if counts and not live.get(version) and (last.last_seen if last else 0.0) < now - ttl:
            stranded = await store.deploys.stranded_runs(version, now - ttl, cap)
            if cap is not None and stranded > cap:
                stranded = cap
                capped.setdefault(version, set()).add("stranded")
        out.append(Deployment(
            version=version, weight=weight,
            state=_state(d, weight, bool(counts), bool(live.get(version)), routed),
            workers=live.get(version, 0), runs=counts, oldest_open=oldest.get(version),
            stranded=stranded, retired_at=d.retired_at if d is not None else None,
            capped=frozenset(capped.get(version, ()))))
    return out


def _state(d: DeploymentRecord | None, weight: int, has_open: bool, serving: bool,
           routed: bool) -> str:
    if d is not None and d.retired_at is not None:
        return "retired"
    if weight > 0 or (not routed and (has_open or serving)):
        return "active"
    return "draining" if has_open else "drained"


# -- checks of operator input --------------------------------------------------------------


def check_weights(weights: Mapping[str, int], routes: Routes, own: str) -> list[tuple[str, int]]:
    """The weight table as (version, weight) in version order, or DefinitionError naming
    what is wrong: not a mapping of version names to integers >= 0, a sum of 0, an unknown
    version (no worker of it ever registered), a weight for a retired version."""
    if not isinstance(weights, Mapping) or not weights:
        raise DefinitionError("weights must map version names to integers, e.g. {'v1': 90, "
                              "'v2': 10}")
    known = routes.known | {own}
    out = []
    for version, weight in sorted(weights.items()):
        if not isinstance(version, str) or not version:
            raise DefinitionError(f"version names must be non-empty strings, got {version!r}")
        if isinstance(weight, bool) or not isinstance(weight, int):
            raise DefinitionError(f"weight of {version!r} must be an integer, got {weight!r}")
        if weight < 0:
            raise DefinitionError(f"weight of {version!r} must be >= 0, got {weight}")
        if version not in known:
            raise DefinitionError(
                f"unknown version {version!r}: no worker of it has registered (known: "
                f"{', '.join(sorted(known))}); start a worker of it first")
        if weight > 0 and version in routes.retired:
            raise InvalidState(f"version {version!r} is retired; it cannot take new runs")
        out.append((version, weight))
    if sum(w for _, w in out) <= 0:
        raise DefinitionError("weights sum to 0: at least one version must take new runs")
    return out


def known_version(version: str, routes: Routes, own: str, what: str = "version") -> str:
    if not isinstance(version, str) or not version:
        raise DefinitionError(f"{what} must be a non-empty string, got {version!r}")
    if version != own and version not in routes.known:
        raise DefinitionError(
            f"unknown {what} {version!r}: no worker of it has registered and it has no "
            f"weight (known: {', '.join(sorted(routes.known | {own}))})")
    return version


def plan_upgrade(
    runs: Sequence[RunRecord], named: Sequence[str] | None, from_version: str, to_version: str,
    agents: Mapping[str, tuple[str, ...]],
) -> tuple[list[str], list[tuple[str, str]]]:
    """Which candidate runs may move to `to_version` (whose workers serve `agents`), and why
    each other one may not: it must be parked (never a leased running run) on
    `from_version`, of an agent `to_version` serves, and its next node must exist there."""
    ok: list[str] = []
    refused: list[tuple[str, str]] = []
    seen = {r.thread_id for r in runs}
    for tid in named or ():
        if tid not in seen:
            refused.append((tid, "no such run"))
    for r in runs:
        if r.version != from_version:
            refused.append((r.thread_id, f"it is on version {r.version!r}, not {from_version!r}"))
        elif r.status not in PARKED:
            why = (f"it is running (leased by {r.lease_owner})" if r.status == "running"
                   else f"it is {r.status}" + (" (terminal)" if r.status in TERMINAL else ""))
            refused.append((r.thread_id, why))
        elif r.agent not in agents:
            refused.append((r.thread_id, f"version {to_version!r} does not serve agent "
                            f"{r.agent!r} (it serves: {', '.join(sorted(agents)) or 'none'})"))
        elif r.node is None or r.node not in agents[r.agent]:
            refused.append((r.thread_id, f"its next node {r.node!r} does not exist in agent "
                            f"{r.agent!r} of version {to_version!r} (nodes: "
                            f"{', '.join(agents[r.agent])})"))
        else:
            ok.append(r.thread_id)
    return ok, refused


async def upgrade(
    store: Store, from_version: str, to_version: str, *, thread_ids: Sequence[str] | None,
    dry_run: bool, skip_refused: bool, actor: str | None = None,
) -> Upgrade:
    """Move parked runs of `from_version` to `to_version` in one transaction (see
    Runtime.upgrade); checks the target's workers first."""
    if from_version == to_version:
        raise DefinitionError(f"--from and --to are both {from_version!r}")
    now = await store.now()
    rows = await store.deploys.list_workers()
    target = [r for r in rows if r.version == to_version and alive(r, now)]
    if not target:
        raise InvalidState(
            f"version {to_version!r} has no live worker: its agents are unknown and nothing "
            f"would run the moved runs; start a worker of {to_version!r} first")
    if to_version in {d.version for d in await store.deploys.list_deployments()
                      if d.retired_at is not None}:
        raise InvalidState(f"version {to_version!r} is retired")
    agents = catalog(target)[to_version]
    plan: list[tuple[list[str], list[tuple[str, str]]]] = []

    def decide(found: list[RunRecord]) -> Sequence[str]:
        plan.clear()
        plan.append(plan_upgrade(found, thread_ids, from_version, to_version, agents))
        ok, refused = plan[0]
        if dry_run or (refused and not skip_refused):
            return ()
        return ok

    audit = audit_of(actor, "upgrade", None, to_version, {
        "from": from_version, "to": to_version, "thread_ids": list(thread_ids or ()) or None,
        "skip_refused": skip_refused})
    await store.deploys.move_runs(from_version, to_version, thread_ids, decide, audit=audit)
    ok, refused = plan[0]
    applied = bool(ok) and not dry_run and (skip_refused or not refused)
    return Upgrade(from_version, to_version, dry_run, applied, tuple(ok), tuple(refused))


def check_thread_ids(thread_ids: Sequence[str] | None) -> list[str] | None:
    if thread_ids is None:
        return None
    if isinstance(thread_ids, str) or not all(isinstance(t, str) and t for t in thread_ids):
        raise DefinitionError("thread_ids must be a list of non-empty strings")
    ids = list(dict.fromkeys(thread_ids))
    if not ids:
        raise DefinitionError("thread_ids is empty: name at least one run, or pass None for "
                              "every parked run")
    return ids



# -- the operations (Runtime's deploy methods are this, on the runtime's store) --------------

ROUTES_TTL = 1.0
"""The oldest weight table a start routes by, in seconds: a route() made in another process
decides every start here that begins more than this long after it (at once in the process
that made it). Past half of it the table is re-read behind the starts; past all of it a start
waits for the re-read, which the whole burst of starts then shares (one read, never a lock
per start)."""


class Deployer:
    """Rainbow deploys on one store, for a runtime of version `own`: the weight table read
    for routing (never older than ROUTES_TTL), and the operator actions, each checked first and
    recorded in the audit log with the change when an actor is named."""

    def __init__(self, store: Store, own: str, lease_ttl: float) -> None:
        self.store = store
        self.own = own
        self.lease_ttl = lease_ttl
        self._routes: Routes | None = None
        self._read_at = 0.0
        self._reading: asyncio.Future[Routes] | None = None

    async def current_routes(self) -> Routes:
        """The weight table and the versions' agents, read at most ROUTES_TTL ago. Every start
        that needs a read awaits the same one and all wake together when it is done (a lock
        would wake them one per loop iteration: a burst of starts would crawl)."""
        routes = self._routes
        age = time.monotonic() - self._read_at
        if routes is not None and age < ROUTES_TTL / 2:
            return routes
        reading = self._reading
        if reading is None or reading.done():
            self._reading = reading = asyncio.ensure_future(self.read_routes())
            reading.add_done_callback(_log_failed_read)
        if routes is not None and age < ROUTES_TTL:
            return routes  # fresh enough: the re-read goes on behind this start
        return await asyncio.shield(reading)

    async def read_routes(self) -> Routes:
        """Read the table now (the operator actions decide by the current one)."""
        began = time.monotonic()
        routes = await load_routes(self.store)
        if began >= self._read_at:  # a slower, older read never replaces a newer one
            self._routes, self._read_at = routes, began
        return self._routes or routes

    def close(self) -> None:
        """Stop a read in flight (the runtime is closing)."""
        if self._reading is not None and not self._reading.done():
            self._reading.cancel()
        self._reading = None


    async def workers(self) -> list[WorkerInfo]:
        return await workers(self.store)

    async def deployments(self, cap: int | None = COUNT_CAP) -> list[Deployment]:
        return await deployments(self.store, self.lease_ttl, cap)

    async def deployment(self, version: str) -> Deployment:
        found = [d for d in await self.deployments() if d.version == version]
        return found[0] if found else Deployment(version, 0, "drained", 0)

    async def route(self, weights: Mapping[str, int], actor: str | None) -> list[Deployment]:
        table = check_weights(weights, await self.read_routes(), self.own)
        audit = audit_of(actor, "route", None, None, {"weights": dict(table)})
        await self.store.deploys.set_weights(table, replace=True, audit=audit)
        await self.read_routes()
        return await self.deployments()

    async def drain(self, version: str, actor: str | None) -> Deployment:
        routes = await self.read_routes()
        known_version(version, routes, self.own)
        if version in routes.retired:
            raise InvalidState(f"version {version!r} is already retired")
        if not [v for v, _ in routes.weights if v != version]:
            raise InvalidState(
                f"draining {version!r} would leave no version for new runs: route them to "
                f"another first (e.g. `tether deploy route {version}=0 v2=100`)")
        audit = audit_of(actor, "drain", None, version, {"version": version})
        await self.store.deploys.set_weights([(version, 0)], replace=False, audit=audit)
        await self.read_routes()
        return await self.deployment(version)

    async def retire(self, version: str, actor: str | None) -> Deployment:
        routes = await self.read_routes()
        known_version(version, routes, self.own)
        weight = dict(routes.weights).get(version, 0)
        if weight > 0:
            raise InvalidState(f"version {version!r} still has weight {weight}: drain it "
                               f"first (`tether deploy drain {version} --wait`)")
        audit = audit_of(actor, "retire", None, version, {"version": version})
        left = await self.store.deploys.retire_version(version, audit=audit)
        if left:
            more = " and more" if len(left) >= 20 else ""
            raise InvalidState(
                f"version {version!r} still has open runs: {', '.join(left)}{more}; wait "
                f"for them (`tether deploy drain {version} --wait`) or move the parked ones "
                "(`tether runs upgrade`)")
        await self.read_routes()
        return await self.deployment(version)

    async def upgrade(self, from_version: str, to_version: str, *,
                      thread_ids: Sequence[str] | None, dry_run: bool, skip_refused: bool,
                      actor: str | None) -> Upgrade:
        routes = await self.read_routes()
        known_version(from_version, routes, self.own, "from_version")
        known_version(to_version, routes, self.own, "to_version")
        return await upgrade(self.store, from_version, to_version,
                             thread_ids=check_thread_ids(thread_ids), dry_run=dry_run,
                             skip_refused=skip_refused, actor=actor)


def _log_failed_read(read: asyncio.Future[Routes]) -> None:
    """A re-read behind the starts that failed: they keep the table they have until it is
    ROUTES_TTL old; then a start waits for a new read and gets its error."""
    if not read.cancelled() and read.exception() is not None:
        log.warning("reading the deployment weights failed (%s)", read.exception())
