"""Leases under arbitrary interleavings: a hypothesis state machine over a real store.

Several workers claim, renew, journal, commit, fail, release and cancel a few runs in any
order, with leases that expire at once (TTL 0) or outlive the test. A model tracks the one
valid epoch of each run; after every step the store must agree with it:

- at most one lease epoch is valid per run: the store's epoch is the model's, and every
  other lease a worker still holds is refused (LeaseLost) and writes nothing;
- checkpoint steps are contiguous 1..n with no duplicates, n == run.step;
- terminal runs are never claimed again and never change.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import orjson
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tether.errors import LeaseLost
from tether.store.base import TERMINAL, Lease, NewRun, RunRecord, StepCommit, Store

V = "v1"
AGENTS = ("a",)
RUNS = ("r0", "r1", "r2")
WORKERS = ("w0", "w1", "w2")
LONG = 60.0
EXPIRED = 0.0  # with a short sleep after the claim, already expired for every later statement
T = TypeVar("T")


@dataclass
class Model:
    """What the store must hold for one run."""

    status: str = "queued"
    epoch: int = 0
    owner: str | None = None
    expired: bool = False  # the current lease may be taken over
    step: int = 0
    calls: int = 0  # journal entries for step + 1, kept across attempts (replayed, not redone)
    wake_far: bool = False  # sleeping or requeued with wake_at far in the future

    def claimable(self) -> bool:
        if self.status in TERMINAL or self.status == "waiting":
            return False
        if self.status in ("queued", "sleeping"):
            return not self.wake_far
        assert self.status == "running"
        return self.expired


@dataclass
class Worker:
    leases: dict[str, Lease] = field(default_factory=dict)


class StoreMachine(RuleBasedStateMachine):
    make_url: Callable[[], str]
    drop_url: Callable[[str], None]
    make_store: Callable[[str], Store]

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.url = self.make_url()
        self.store = self.make_store(self.url)
        try:
            self.run(self.store.open())
        except BaseException:
            self.loop.close()  # hypothesis calls teardown() only on a built machine
            raise
        self.model = {tid: Model() for tid in RUNS}
        self.workers = {w: Worker() for w in WORKERS}

    def run(self, aw: Awaitable[T]) -> T:
        # A store call that hangs fails the example instead of hanging the suite.
        return self.loop.run_until_complete(asyncio.wait_for(aw, 30))

    def teardown(self) -> None:
        try:
            self.run(self.store.close())
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
        finally:
            self.loop.close()
            self.drop_url(self.url)

    # -- helpers ------------------------------------------------------------------------------

    def valid(self, lease: Lease) -> bool:
        m = self.model[lease.thread_id]
        return m.status == "running" and m.epoch == lease.epoch and m.owner == lease.worker

    def pick_lease(self, data: st.DataObject) -> tuple[str, Lease]:
        held = sorted(
            (w, tid) for w, wk in self.workers.items() for tid in wk.leases
        )
        w, tid = data.draw(st.sampled_from(held), label="lease")
        return w, self.workers[w].leases[tid]

    def has_leases(self) -> bool:
        return any(wk.leases for wk in self.workers.values())

    async def snapshot(self, tid: str) -> tuple[RunRecord | None, list[int], int]:
        run = await self.store.get_run(tid)
        steps = [c.step for c in await self.store.checkpoints(tid)]
        journal = len(await self.store.load_journal(tid, self.model[tid].step + 1))
        return run, steps, journal

    # -- rules --------------------------------------------------------------------------------

    @initialize()
    def create_runs(self) -> None:
        for tid in RUNS:
            data = orjson.dumps({"tid": tid})
            new = NewRun(tid, "a", V, "start", data, hashlib.sha256(data).hexdigest())
            run, created = self.run(self.store.create_run(new))
            assert created and run.status == "queued"

    @rule(worker=st.sampled_from(WORKERS), limit=st.integers(1, 3), expire=st.booleans())
    def claim(self, worker: str, limit: int, expire: bool) -> None:
        ttl = EXPIRED if expire else LONG
        before = {tid: m.claimable() for tid, m in self.model.items()}
        got = self.run(self.store.claim_runs(worker, V, AGENTS, limit, ttl))
        if expire:
            self.run(asyncio.sleep(0.003))  # the database clock moves past the expiry
        ids = [r.thread_id for r in got]
        assert len(ids) == len(set(ids)) <= limit
        for run in got:
            m = self.model[run.thread_id]
            event(f"claim: took a {m.status} run")
            assert before[run.thread_id], (run, m)  # never terminal, parked, or leased
            assert run.status == "running" and run.lease_owner == worker
            assert run.epoch == m.epoch + 1, (run, m)
            m.status, m.epoch, m.owner, m.expired = "running", run.epoch, worker, expire
            m.wake_far = False
            self.workers[worker].leases[run.thread_id] = Lease(run.thread_id, worker, run.epoch)
        surely = sum(1 for ok in before.values() if ok)
        assert len(got) >= min(limit, surely), (before, ids)

    @rule(worker=st.sampled_from(WORKERS))
    def renew(self, worker: str) -> None:
        held = self.run(self.store.renew_leases(worker, LONG))
        mine = {t for t, m in self.model.items() if m.status == "running" and m.owner == worker}
        live = {t for t in mine if not self.model[t].expired}
        # An expired lease nobody took yet may or may not be renewed; a live one must be.
        assert live <= held <= mine, (held, mine, live)
        for tid in held:
            self.model[tid].expired = False

    @precondition(has_leases)
    @rule(data=st.data())
    def record_call(self, data: st.DataObject) -> None:
        _, lease = self.pick_lease(data)
        m = self.model[lease.thread_id]
        ok = self.valid(lease)
        before = self.run(self.snapshot(lease.thread_id))
        try:
            self.run(self.store.record_call(lease, m.step + 1, m.calls, "call", b"r"))
        except LeaseLost:
            event("record_call: stale lease refused")
            assert not ok, "the valid lease was refused"
            assert self.run(self.snapshot(lease.thread_id)) == before
        else:
            event("record_call: journaled")
            assert ok, f"stale lease {lease} journaled a call; model {m}"
            m.calls += 1

    @precondition(has_leases)
    @rule(
        data=st.data(),
        status=st.sampled_from(["running", "queued", "completed", "waiting", "sleeping"]),
        far=st.booleans(),
    )
    def commit(self, data: st.DataObject, status: str, far: bool) -> None:
        worker, lease = self.pick_lease(data)
        m = self.model[lease.thread_id]
        ok = self.valid(lease)
        step = m.step + 1
        wake_at = None
        if status == "sleeping":
            wake_at = self.run(self.store.now()) + (3600 if far else -1)
        commit = StepCommit(
            lease=lease,
            step=step,
            node=f"n{step}",
            next_node=None if status == "completed" else f"n{step + 1}",
            kind="s" if step % 3 == 1 else "d",
            data=orjson.dumps({"step": step, "by": worker}),
            attempt=1,
            started_at=float(step),
            finished_at=float(step) + 0.5,
            status=status,
            wake_at=wake_at,
            waiting_for="interrupt" if status == "waiting" else None,
        )
        before = self.run(self.snapshot(lease.thread_id))
        try:
            self.run(self.store.commit_step(commit))
        except LeaseLost:
            event("commit: stale lease refused")
            assert not ok, "the valid lease was refused"
            assert self.run(self.snapshot(lease.thread_id)) == before
            del self.workers[worker].leases[lease.thread_id]
            return
        event(f"commit: {status}")
        assert ok, f"stale lease {lease} committed step {step}; model {m}"
        m.step, m.calls, m.status = step, 0, status
        m.wake_far = status == "sleeping" and far
        if status != "running":
            m.owner, m.expired = None, False
            del self.workers[worker].leases[lease.thread_id]

    @precondition(has_leases)
    @rule(data=st.data(), final=st.booleans(), far=st.booleans())
    def fail(self, data: st.DataObject, final: bool, far: bool) -> None:
        worker, lease = self.pick_lease(data)
        m = self.model[lease.thread_id]
        ok = self.valid(lease)
        wake_at = (self.run(self.store.now()) + 3600) if far else None
        before = self.run(self.snapshot(lease.thread_id))
        try:
            self.run(
                self.store.fail_step(lease, failures=1, wake_at=wake_at, error=b"{}", final=final)
            )
        except LeaseLost:
            event("fail: stale lease refused")
            assert not ok, "the valid lease was refused"
            assert self.run(self.snapshot(lease.thread_id)) == before
        else:
            event(f"fail: final={final}")
            assert ok, f"stale lease {lease} recorded a failure; model {m}"
            m.status = "failed" if final else "queued"
            m.owner, m.expired = None, False
            m.wake_far = not final and far
        del self.workers[worker].leases[lease.thread_id]

    @rule(worker=st.sampled_from(WORKERS))
    def release(self, worker: str) -> None:
        leases = list(self.workers[worker].leases.values())
        befores = {le.thread_id: self.run(self.snapshot(le.thread_id)) for le in leases}
        self.run(self.store.release_runs(leases))
        for lease in leases:
            m = self.model[lease.thread_id]
            if self.valid(lease):
                event("release: released")
                m.status, m.owner, m.expired = "queued", None, False
            else:  # a stale release is a no-op
                event("release: stale lease ignored")
                assert self.run(self.snapshot(lease.thread_id)) == befores[lease.thread_id]
        self.workers[worker].leases.clear()

    @rule(tid=st.sampled_from(RUNS))
    def cancel(self, tid: str) -> None:
        m = self.model[tid]
        before = self.run(self.store.get_run(tid))
        got = self.run(self.store.cancel_run(tid))
        assert got is not None
        if m.status in TERMINAL:
            assert got == before
            return
        assert got.status == "cancelled" and got.epoch > m.epoch
        m.status, m.epoch, m.owner, m.expired = "cancelled", got.epoch, None, False

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def store_matches_model(self) -> None:
        for tid, m in self.model.items():
            run, steps, journal = self.run(self.snapshot(tid))
            assert run is not None
            assert (run.status, run.epoch, run.step) == (m.status, m.epoch, m.step), (run, m)
            assert steps == list(range(1, m.step + 1)), (tid, steps)
            assert journal == m.calls, (tid, journal, m)
            if m.status == "running":
                assert run.lease_owner == m.owner
            else:
                assert run.lease_owner is None and run.lease_expires_at is None, run

    @invariant()
    def at_most_one_valid_lease_per_run(self) -> None:
        for tid, m in self.model.items():
            holders = [
                w for w, wk in self.workers.items()
                if tid in wk.leases and wk.leases[tid].epoch == m.epoch
            ]
            assert len(holders) <= 1
            if m.status != "running":
                assert holders == []
            for wk in self.workers.values():
                if tid in wk.leases:
                    assert wk.leases[tid].epoch <= m.epoch


# Examples per backend: SQLite runs ~60 a second; each Postgres example clones a database.
# TETHER_TEST_EXAMPLES=500 makes a soak run.
EXAMPLES = {"sqlite": 60, "postgres": 12}
SOAK = int(os.environ.get("TETHER_TEST_EXAMPLES", "0"))


def test_store_state_machine(databases, store_for) -> None:
    class Machine(StoreMachine):
        make_url = staticmethod(databases.create)
        drop_url = staticmethod(databases.drop)
        make_store = staticmethod(store_for)

    run_state_machine_as_test(
        Machine,
        settings=settings(
            max_examples=SOAK or EXAMPLES[databases.backend],
            stateful_step_count=25,
            deadline=None,
            database=None,  # no example database written into the project
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )

