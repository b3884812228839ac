"""The Store contract: every test runs against every store (SQLite, Postgres).

Each test pins one sentence of a docstring in `tether.store.base`; a store is done when this
file passes on it unchanged. Lease-expiry tests use TTLs of a few tenths of a second.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import uuid
from collections.abc import Callable, Sequence

import orjson
import pytest

from tether.errors import LeaseLost, RunConflict
from tether.store.base import (
    TERMINAL,
    CheckpointRecord,
    JournalRecord,
    Lease,
    NewRun,
    RunRecord,
    StepCommit,
    Store,
)

V = "v1"
AGENTS = ("a",)
LONG = 30.0  # a lease TTL no test outlives
SHORT = 0.2  # a lease TTL tests wait out (they only look after it ran out)
WAIT = SHORT + 0.15
# A lease TTL or wake_at delay that tests observe both before and after it runs out: long
# enough for a few statements on a loaded machine.
SOON = 0.6
LATER = SOON + 0.15


def new_run(
    thread_id: str | None = None,
    *,
    agent: str = "a",
    version: str = V,
    input: object = None,
    key: str | None = None,
    parent: str | None = None,
) -> NewRun:
    data = orjson.dumps({"q": "hello"} if input is None else input)
    return NewRun(
        thread_id=thread_id or f"t-{uuid.uuid4().hex[:12]}",
        agent=agent,
        version=version,
        node="start",
        input=data,
        input_hash=hashlib.sha256(data).hexdigest(),
        idempotency_key=key,
        parent_thread_id=parent,
    )


def lease_of(run: RunRecord) -> Lease:
    assert run.lease_owner is not None, run
    return Lease(run.thread_id, run.lease_owner, run.epoch)


def step_commit(
    lease: Lease,
    step: int,
    status: str = "running",
    *,
    kind: str = "d",
    data: object = None,
    node: str | None = None,
    next_node: str | None = "next",
    wake_at: float | None = None,
    waiting_for: str | None = None,
    children: Sequence[NewRun] = (),
    attempt: int = 1,
) -> StepCommit:
    return StepCommit(
        lease=lease,
        step=step,
        node=node or f"n{step}",
        next_node=next_node,
        kind=kind,
        data=orjson.dumps({"step": step} if data is None else data),
        attempt=attempt,
        started_at=1_700_000_000.25 + step,
        finished_at=1_700_000_000.75 + step,
        status=status,
        wake_at=wake_at,
        waiting_for=waiting_for,
        children=children,
    )


async def started(store: Store, n: int = 1, **kw: object) -> list[RunRecord]:
    runs = []
    for _ in range(n):
        run, created = await store.create_run(new_run(**kw))  # type: ignore[arg-type]
        assert created
        runs.append(run)
    return runs


async def claim_one(
    store: Store, run: RunRecord, worker: str = "w1", ttl: float = LONG
) -> RunRecord:
    """Claims `run`, which must be the only claimable run."""
    claimed = await store.claim_runs(worker, V, AGENTS, 10, ttl)
    assert [r.thread_id for r in claimed] == [run.thread_id]
    return claimed[0]


async def claimable(store: Store, worker: str = "probe") -> set[str]:
    """Claims every claimable run (with a long lease) and returns their thread_ids."""
    return {r.thread_id for r in await store.claim_runs(worker, V, AGENTS, 1000, LONG)}


def assert_unleased(run: RunRecord | None) -> None:
    assert run is not None
    assert run.lease_owner is None
    assert run.lease_expires_at is None


# -- clock ----------------------------------------------------------------------------------


async def test_now_is_a_moving_database_clock(store: Store) -> None:
    t1 = await store.now()
    await asyncio.sleep(0.05)
    t2 = await store.now()
    assert isinstance(t1, float)
    assert 0.03 < t2 - t1 < 5
    assert t1 > 1_600_000_000  # seconds since the Unix epoch, not days or milliseconds


# -- create_run / get_run -------------------------------------------------------------------


async def test_create_run_inserts_a_queued_run(store: Store) -> None:
    new = new_run("t1", key="k1")
    before = await store.now()
    run, created = await store.create_run(new)
    assert created
    assert run.thread_id == "t1"
    assert (run.agent, run.version, run.node) == ("a", V, "start")
    assert run.status == "queued"
    assert (run.step, run.attempt, run.failures, run.epoch) == (0, 0, 0, 0)
    assert (run.input, run.input_hash, run.idempotency_key) == (new.input, new.input_hash, "k1")
    assert run.lease_owner is None and run.lease_expires_at is None
    assert run.wake_at is None and run.waiting_for is None and run.error is None
    assert run.parent_thread_id is None and run.forked_from is None and run.forked_step is None
    assert before - 1 <= run.created_at <= await store.now() + 1
    assert run.updated_at >= run.created_at
    assert await store.get_run("t1") == run


async def test_create_run_keeps_fork_and_parent_fields(store: Store) -> None:
    new = NewRun(
        "t2", "a", V, "n3", b"{}", "h", parent_thread_id="p", forked_from="t0", forked_step=3
    )
    run, _ = await store.create_run(new)
    assert (run.parent_thread_id, run.forked_from, run.forked_step) == ("p", "t0", 3)
    assert run.node == "n3"


async def test_get_run_unknown_is_none(store: Store) -> None:
    assert await store.get_run("nope") is None


async def test_create_run_same_idempotency_key_returns_existing_run(store: Store) -> None:
    first, created = await store.create_run(new_run("t1", key="k"))
    assert created
    again, created = await store.create_run(new_run("t2", key="k"))
    assert not created
    assert again == first
    assert await store.get_run("t2") is None


async def test_create_run_same_thread_same_agent_and_input_returns_existing(store: Store) -> None:
    first, _ = await store.create_run(new_run("t1"))
    again, created = await store.create_run(new_run("t1"))
    assert not created
    assert again == first


async def test_create_run_returns_existing_run_as_it_is_now(store: Store) -> None:
    await store.create_run(new_run("t1"))
    running = await claim_one(store, (await store.get_run("t1")))  # type: ignore[arg-type]
    again, created = await store.create_run(new_run("t1"))
    assert not created
    assert again == running


async def test_create_run_same_thread_other_input_conflicts(store: Store) -> None:
    first, _ = await store.create_run(new_run("t1", input={"q": 1}))
    with pytest.raises(RunConflict):
        await store.create_run(new_run("t1", input={"q": 2}))
    assert await store.get_run("t1") == first


async def test_create_run_same_thread_other_agent_conflicts(store: Store) -> None:
    await store.create_run(new_run("t1", agent="a"))
    with pytest.raises(RunConflict):
        await store.create_run(new_run("t1", agent="b"))


async def test_create_run_same_key_other_input_conflicts(store: Store) -> None:
    await store.create_run(new_run("t1", key="k", input={"q": 1}))
    with pytest.raises(RunConflict):
        await store.create_run(new_run("t2", key="k", input={"q": 2}))
    assert await store.get_run("t2") is None


async def test_create_run_same_key_other_agent_conflicts(store: Store) -> None:
    await store.create_run(new_run("t1", key="k", agent="a"))
    with pytest.raises(RunConflict):
        await store.create_run(new_run("t2", key="k", agent="b"))
    assert await store.get_run("t2") is None


async def test_create_run_concurrent_same_key_creates_one_run(store: Store) -> None:
    results = await asyncio.gather(
        *(store.create_run(new_run(f"t{i}", key="k")) for i in range(8))
    )
    assert sum(created for _, created in results) == 1
    assert len({run.thread_id for run, _ in results}) == 1
    assert len(await store.list_runs()) == 1


async def test_create_run_same_key_from_two_stores_creates_one_run(
    store: Store, db_url: str, store_for: Callable[[str], Store]
) -> None:
    """Two processes starting the same request race on separate connections."""
    other = store_for(db_url)
    await other.open()
    try:
        for i in range(10):
            results = await asyncio.gather(
                store.create_run(new_run(f"a{i}", key=f"k{i}")),
                other.create_run(new_run(f"b{i}", key=f"k{i}")),
            )
            assert sorted(created for _, created in results) == [False, True]
            assert results[0][0].thread_id == results[1][0].thread_id
            both = await asyncio.gather(
                store.create_run(new_run(f"t{i}")), other.create_run(new_run(f"t{i}"))
            )
            assert sorted(created for _, created in both) == [False, True]
    finally:
        await other.close()


async def test_create_run_signals_work_available(store: Store) -> None:
    store.work_available.clear()
    await store.create_run(new_run())
    await asyncio.wait_for(store.work_available.wait(), 2)


async def test_create_run_with_a_lease_inserts_it_running_leased_at_epoch_1(store: Store) -> None:
    before = await store.now()
    store.work_available.clear()
    run, created = await store.create_run(new_run(), lease=("w1", SOON))
    assert created and run.status == "running" and run.lease_owner == "w1"
    assert run.epoch == 1 and run.attempt == 1 and run.step == 0
    assert run.lease_expires_at is not None
    # SQLite's clock (julianday of the millisecond, a double of days) is exact to 1 ms.
    assert before + SOON - 1e-3 <= run.lease_expires_at <= await store.now() + SOON + 1e-3
    assert not store.work_available.is_set()  # nobody else needs waking for it
    assert run.thread_id not in await claimable(store)
    # It commits like a claimed run; once its lease runs out, anyone may claim it.
    await store.commit_step(step_commit(lease_of(run), 1))
    await asyncio.sleep(SOON + 0.15)
    again = await claim_one(store, run, "w2")
    assert again.epoch == 2 and again.step == 1
    with pytest.raises(LeaseLost):
        await store.commit_step(step_commit(lease_of(run), 2))


async def test_create_run_with_a_lease_returns_an_existing_run_unleased(store: Store) -> None:
    new = new_run()
    first, _ = await store.create_run(new)
    again, created = await store.create_run(new, lease=("w1", LONG))
    assert not created and again.status == "queued"
    assert_unleased(again)
    released, _ = await store.create_run(new_run(), lease=("w1", LONG))
    await store.release_runs([lease_of(released)])
    assert {first.thread_id, released.thread_id} <= await claimable(store)


async def test_runs_created_leased_together_match_their_rows(store: Store) -> None:
    """Leased creates of one group commit (batched on SQLite, the record built without
    reading it back) return exactly the row stored; an existing thread_id among them returns
    that run unleased, or conflicts, without affecting the others."""
    existing, _ = await store.create_run(new_run("exists"))
    fresh = [new_run(f"fresh-{i}") for i in range(5)]
    outcomes = await asyncio.gather(
        *(store.create_run(n, lease=("w1", LONG)) for n in fresh),
        store.create_run(new_run("exists"), lease=("w1", LONG)),
        store.create_run(new_run("exists", input={"other": 1}), lease=("w1", LONG)),
        return_exceptions=True)
    assert isinstance(outcomes[-1], RunConflict)
    again = outcomes[-2]
    assert again == (existing, False)
    for n, got in zip(fresh, outcomes[:5], strict=True):
        assert isinstance(got, tuple)
        run, created = got
        assert created and run == await store.get_run(n.thread_id)
        assert (run.input, run.input_hash, run.lease_owner) == (n.input, n.input_hash, "w1")
    # Each thread_id once (Postgres batches these as one statement too).
    more = [new_run(f"more-{i}", input={"i": i, "text": 'quote " é \n'}) for i in range(6)]
    again_too = await asyncio.gather(*(store.create_run(n, lease=("w2", LONG)) for n in more),
                                     store.create_run(new_run("fresh-0"), lease=("w2", LONG)))
    assert again_too[-1] == (outcomes[0][0], False)  # type: ignore[index]
    for n, (run, created) in zip(more, again_too[:-1], strict=True):
        assert created and run == await store.get_run(n.thread_id)
        assert (run.input, run.lease_owner, run.epoch, run.status) == (n.input, "w2", 1, "running")


async def test_runs_finished_together_return_their_rows(store: Store) -> None:
    """Last steps committed at once (batched on SQLite, the finished record built from the
    run as claimed) return exactly the committed row; a stale lease among them fails alone."""
    held = []
    for i in range(4):
        run, _ = await store.create_run(new_run(f"fin-{i}"), lease=("w1", LONG))
        held.append(run)
    commits = [dataclasses.replace(step_commit(lease_of(r), 1, "completed", next_node=None),
                                   run=r) for r in held]
    stale = Lease(held[1].thread_id, "w1", held[1].epoch + 1)
    commits[1] = dataclasses.replace(commits[1], lease=stale)
    outcomes = await asyncio.gather(*(store.commit_step(c) for c in commits),
                                    return_exceptions=True)
    assert isinstance(outcomes[1], LeaseLost)
    for i, (run, got) in enumerate(zip(held, outcomes, strict=True)):
        row = await store.get_run(run.thread_id)
        assert row is not None
        if i == 1:
            assert row == run and await store.checkpoints(run.thread_id) == []
            continue
        assert got == row and row.status == "completed" and row.step == 1
        assert_unleased(row)
        assert [c.step for c in await store.checkpoints(run.thread_id)] == [1]


# -- list_runs ------------------------------------------------------------------------------


def _order_key(run: RunRecord) -> tuple[float, str]:
    return (run.created_at, run.thread_id)


async def test_list_runs_newest_first(store: Store) -> None:
    old, _ = await store.create_run(new_run("old"))
    await asyncio.sleep(0.02)
    mid, _ = await store.create_run(new_run("mid"))
    await asyncio.sleep(0.02)
    new, _ = await store.create_run(new_run("new"))
    listed = await store.list_runs()
    assert [r.thread_id for r in listed] == ["new", "mid", "old"]
    assert listed == [new, mid, old]


async def test_list_runs_filters_by_status_and_agent(store: Store) -> None:
    (a1,) = await started(store, agent="a")
    await claim_one(store, a1)  # a1 running; a2 and b1 queued
    (b1,) = await started(store, agent="b")
    (a2,) = await started(store, agent="a")
    ids = lambda runs: {r.thread_id for r in runs}  # noqa: E731
    assert ids(await store.list_runs(agent="a")) == {a1.thread_id, a2.thread_id}
    assert ids(await store.list_runs(agent="b")) == {b1.thread_id}
    assert ids(await store.list_runs(status="queued")) == {a2.thread_id, b1.thread_id}
    assert ids(await store.list_runs(status="running")) == {a1.thread_id}
    assert ids(await store.list_runs(status="queued", agent="a")) == {a2.thread_id}
    assert await store.list_runs(status="completed") == []
    assert await store.list_runs(agent="zzz") == []


async def test_list_runs_limit(store: Store) -> None:
    await started(store, 5)
    assert len(await store.list_runs(limit=3)) == 3
    assert len(await store.list_runs(limit=100)) == 5


async def test_list_runs_cursor_pages_without_gaps_or_duplicates(store: Store) -> None:
    await started(store, 4, agent="x")  # not claimable by AGENTS
    # Children committed in one transaction may share created_at: the thread_id breaks ties.
    (parent,) = await started(store)
    running = await claim_one(store, parent)
    kids = [new_run(f"kid-{i}", parent=parent.thread_id) for i in range(5)]
    await store.commit_step(step_commit(lease_of(running), 1, "waiting", children=kids))
    await started(store, 3, agent="x")
    # Runs created together (one group commit on SQLite) may share created_at too.
    await asyncio.gather(*(store.create_run(new_run(f"burst-{i}", agent="x")) for i in range(8)))

    everything = await store.list_runs(limit=1000)
    assert len(everything) == 21
    assert [_order_key(r) for r in everything] == sorted(
        (_order_key(r) for r in everything), reverse=True
    )
    for page_size in (1, 2, 3, 5):
        seen: list[RunRecord] = []
        before: tuple[float, str] | None = None
        while True:
            page = await store.list_runs(limit=page_size, before=before)
            assert len(page) <= page_size
            if not page:
                break
            seen.extend(page)
            before = _order_key(page[-1])
        assert [r.thread_id for r in seen] == [r.thread_id for r in everything], page_size


async def test_list_runs_cursor_combines_with_filters(store: Store) -> None:
    await started(store, 3, agent="a")
    await started(store, 3, agent="b")
    first = await store.list_runs(agent="b", limit=2)
    rest = await store.list_runs(agent="b", limit=10, before=_order_key(first[-1]))
    assert len(first) == 2 and len(rest) == 1
    assert {r.agent for r in first + rest} == {"b"}


# -- claim_runs -----------------------------------------------------------------------------


async def test_claim_leases_a_queued_run_and_bumps_epoch_and_attempt(store: Store) -> None:
    (run,) = await started(store)
    before = await store.now()
    claimed = await claim_one(store, run, "w1", LONG)
    assert claimed.status == "running"
    assert claimed.lease_owner == "w1"
    assert claimed.epoch == run.epoch + 1
    assert claimed.attempt == run.attempt + 1
    assert claimed.lease_expires_at is not None
    assert before + LONG - 1 <= claimed.lease_expires_at <= await store.now() + LONG + 1
    assert await store.get_run(run.thread_id) == claimed


async def test_claim_respects_version(store: Store) -> None:
    (other,) = await started(store, version="v2")
    assert await store.claim_runs("w1", V, AGENTS, 10, LONG) == []
    claimed = await store.claim_runs("w2", "v2", AGENTS, 10, LONG)
    assert [r.thread_id for r in claimed] == [other.thread_id]


async def test_claim_respects_agents(store: Store) -> None:
    (a,) = await started(store, agent="a")
    (b,) = await started(store, agent="b")
    (c,) = await started(store, agent="c")
    assert await store.claim_runs("w1", V, [], 10, LONG) == []
    assert [r.thread_id for r in await store.claim_runs("w1", V, ["b"], 10, LONG)] == [
        b.thread_id
    ]
    got = await store.claim_runs("w1", V, ["a", "c", "zzz"], 10, LONG)
    assert {r.thread_id for r in got} == {a.thread_id, c.thread_id}


async def test_claim_respects_limit(store: Store) -> None:
    runs = await started(store, 5)
    first = await store.claim_runs("w1", V, AGENTS, 2, LONG)
    second = await store.claim_runs("w2", V, AGENTS, 2, LONG)
    third = await store.claim_runs("w3", V, AGENTS, 2, LONG)
    assert (len(first), len(second), len(third)) == (2, 2, 1)
    ids = [r.thread_id for r in first + second + third]
    assert sorted(ids) == sorted(r.thread_id for r in runs)
    assert await store.claim_runs("w4", V, AGENTS, 2, LONG) == []


async def test_claim_skips_a_run_whose_lease_is_live(store: Store) -> None:
    (run,) = await started(store)
    held = await claim_one(store, run, "w1", LONG)
    assert await store.claim_runs("w2", V, AGENTS, 10, LONG) == []
    assert await store.claim_runs("w1", V, AGENTS, 10, LONG) == []
    assert await store.get_run(run.thread_id) == held


async def test_claim_takes_over_a_run_whose_lease_expired(store: Store) -> None:
    (run,) = await started(store)
    first = await claim_one(store, run, "w1", SHORT)
    await asyncio.sleep(WAIT)
    second = await claim_one(store, run, "w2", LONG)
    assert second.lease_owner == "w2"
    assert second.status == "running"
    assert second.epoch == first.epoch + 1
    assert second.attempt == first.attempt + 1


async def test_claim_takes_due_runs_before_expired_leases_within_one_limit(
        store: Store) -> None:
    (expiring,) = await started(store)
    first = await claim_one(store, expiring, "w1", 0)
    await asyncio.sleep(0.01)
    (queued,) = await started(store)  # created after the other's lease expired
    (got,) = await store.claim_runs("w2", V, AGENTS, 1, LONG)
    assert got.thread_id == queued.thread_id  # due runs first, whatever their age
    (got,) = await store.claim_runs("w2", V, AGENTS, 1, LONG)
    assert (got.thread_id, got.epoch) == (expiring.thread_id, first.epoch + 1)
    more = await started(store, 2)
    await store.release_runs([lease_of(got)])
    both = await store.claim_runs("w3", V, AGENTS, 2, LONG)
    assert len(both) == 2  # the limit counts both kinds together
    rest = await store.claim_runs("w3", V, AGENTS, 10, LONG)
    assert {r.thread_id for r in both + rest} == {expiring.thread_id, *(r.thread_id for r in more)}


async def test_claim_with_zero_ttl_is_expired_at_once(store: Store) -> None:
    (run,) = await started(store)
    first = await claim_one(store, run, "w1", 0)
    await asyncio.sleep(0.01)
    second = await claim_one(store, run, "w2", LONG)
    assert second.epoch == first.epoch + 1


async def test_claim_skips_waiting_and_terminal_runs(store: Store) -> None:
    runs = await started(store, 4)
    w, c, f, x = await store.claim_runs("w1", V, AGENTS, 10, LONG)
    await store.commit_step(step_commit(lease_of(w), 1, "waiting", waiting_for="interrupt"))
    await store.commit_step(step_commit(lease_of(c), 1, "completed", next_node=None))
    await store.fail_step(lease_of(f), failures=1, wake_at=None, error=b"{}", final=True)
    await store.cancel_run(x.thread_id)
    assert {(await store.get_run(r.thread_id)).status for r in runs} == {  # type: ignore[union-attr]
        "waiting", "completed", "failed", "cancelled"
    }
    assert await claimable(store) == set()


async def test_claim_respects_wake_at_of_a_sleeping_run(store: Store) -> None:
    (run,) = await started(store)
    held = await claim_one(store, run)
    wake = await store.now() + SOON
    await store.commit_step(step_commit(lease_of(held), 1, "sleeping", wake_at=wake))
    slept = await store.get_run(run.thread_id)
    assert slept is not None and slept.status == "sleeping" and slept.wake_at == wake
    assert_unleased(slept)
    assert await claimable(store) == set()
    await asyncio.sleep(LATER)
    woke = await claim_one(store, run, "w2")
    assert woke.status == "running" and woke.epoch == held.epoch + 1


async def test_concurrent_claims_never_hand_a_run_to_two_workers(
    store: Store, db_url: str, store_for: Callable[[str], Store]
) -> None:
    other = store_for(db_url)  # a second process's store
    await other.open()
    try:
        runs = await started(store, 12)
        batches = await asyncio.gather(
            *((store, other)[i % 2].claim_runs(f"w{i}", V, AGENTS, 3, LONG) for i in range(8))
        )
    finally:
        await other.close()
    for i, batch in enumerate(batches):
        assert len(batch) <= 3
        assert all(r.lease_owner == f"w{i}" and r.epoch == 1 for r in batch)
    ids = [r.thread_id for batch in batches for r in batch]
    assert len(ids) == len(set(ids))
    # A claimer may come back short while rivals hold rows ("up to limit"); none is lost.
    rest = await claimable(store, "sweeper")
    assert rest.isdisjoint(ids)
    assert rest | set(ids) == {r.thread_id for r in runs}


# -- renew_leases ---------------------------------------------------------------------------


async def test_renew_returns_the_runs_held_and_extends_them(store: Store) -> None:
    await started(store, 3)
    ra, rb = await store.claim_runs("w1", V, AGENTS, 2, SOON)
    (rc,) = await store.claim_runs("w2", V, AGENTS, 2, LONG)
    assert await store.renew_leases("w1", LONG) == {ra.thread_id, rb.thread_id}
    now_a = await store.get_run(ra.thread_id)
    assert now_a is not None and now_a.lease_expires_at is not None
    assert ra.lease_expires_at is not None
    assert now_a.lease_expires_at > ra.lease_expires_at + LONG / 2
    assert (now_a.lease_owner, now_a.epoch) == ("w1", ra.epoch)  # renewing is not claiming
    await asyncio.sleep(LATER)  # past the original leases
    assert await claimable(store, "w3") == set()
    assert await store.renew_leases("w2", LONG) == {rc.thread_id}


async def test_renew_without_leases_is_empty(store: Store) -> None:
    await started(store, 2)
    assert await store.renew_leases("nobody", LONG) == set()


async def test_renew_drops_runs_no_longer_held(store: Store) -> None:
    await started(store, 4)
    ha, hb, hc, hd = await store.claim_runs("w1", V, AGENTS, 10, LONG)
    await store.commit_step(step_commit(lease_of(ha), 1, "completed"))
    await store.release_runs([lease_of(hb)])
    await store.cancel_run(hc.thread_id)
    assert await store.renew_leases("w1", LONG) == {hd.thread_id}


async def test_renew_does_not_revive_a_lease_taken_over(store: Store) -> None:
    (run,) = await started(store)
    await claim_one(store, run, "w1", SHORT)
    await asyncio.sleep(WAIT)
    taken = await claim_one(store, run, "w2", LONG)
    assert await store.renew_leases("w1", LONG) == set()
    assert await store.get_run(run.thread_id) == taken


# -- release_runs ---------------------------------------------------------------------------


async def test_release_queues_the_run_for_any_worker(store: Store) -> None:
    a, b = await started(store, 2)
    held = await store.claim_runs("w1", V, AGENTS, 10, LONG)
    await store.release_runs([lease_of(r) for r in held])
    for run in (a, b):
        now = await store.get_run(run.thread_id)
        assert now is not None and now.status == "queued"
        assert_unleased(now)
    again = await store.claim_runs("w2", V, AGENTS, 10, LONG)
    assert {r.thread_id for r in again} == {a.thread_id, b.thread_id}
    assert all(r.epoch == h.epoch + 1 for r, h in zip(
        sorted(again, key=lambda r: r.thread_id), sorted(held, key=lambda r: r.thread_id),
        strict=True,
    ))


async def test_release_nothing_is_a_no_op(store: Store) -> None:
    await store.release_runs([])


async def test_release_with_a_stale_lease_changes_nothing(store: Store) -> None:
    (run,) = await started(store)
    old = await claim_one(store, run, "w1", SHORT)
    await asyncio.sleep(WAIT)
    new = await claim_one(store, run, "w2", LONG)
    await store.release_runs([lease_of(old)])
    assert await store.get_run(run.thread_id) == new


async def test_released_lease_cannot_commit(store: Store) -> None:
    (run,) = await started(store)
    held = await claim_one(store, run)
    await store.release_runs([lease_of(held)])
    with pytest.raises(LeaseLost):
        await store.commit_step(step_commit(lease_of(held), 1))
    assert await store.checkpoints(run.thread_id) == []


# -- record_call / load_journal -------------------------------------------------------------


async def test_journal_records_calls_in_order(store: Store) -> None:
    (run,) = await started(store)
    lease = lease_of(await claim_one(store, run))
    for idx in (0, 1, 2):
        await store.record_call(lease, 1, idx, f"call{idx}", orjson.dumps({"r": idx}))
    await store.commit_step(step_commit(lease, 1))  # (step 2's calls: once past step 1)
    await store.record_call(lease, 2, 0, "other", b"\x00\xff binary")
    assert await store.load_journal(run.thread_id, 1) == [
        JournalRecord(i, f"call{i}", orjson.dumps({"r": i})) for i in (0, 1, 2)
    ]
    assert await store.load_journal(run.thread_id, 2) == [
        JournalRecord(0, "other", b"\x00\xff binary")
    ]
    assert await store.load_journal(run.thread_id, 3) == []
    assert await store.load_journal("nope", 1) == []


async def test_journal_refuses_a_stale_epoch(store: Store) -> None:
    (run,) = await started(store)
    old = lease_of(await claim_one(store, run, "w1", SHORT))
    await store.record_call(old, 1, 0, "first", b"1")
    await asyncio.sleep(WAIT)
    new = lease_of(await claim_one(store, run, "w2"))
    with pytest.raises(LeaseLost):
        await store.record_call(old, 1, 1, "second", b"2")
    assert await store.load_journal(run.thread_id, 1) == [JournalRecord(0, "first", b"1")]
    await store.record_call(new, 1, 1, "second", b"2")
    assert len(await store.load_journal(run.thread_id, 1)) == 2


async def test_journal_refuses_an_unleased_run(store: Store) -> None:
    (run,) = await started(store)
    with pytest.raises(LeaseLost):
        await store.record_call(Lease(run.thread_id, "w1", run.epoch), 1, 0, "x", b"1")
    with pytest.raises(LeaseLost):
        await store.record_call(Lease("nope", "w1", 0), 1, 0, "x", b"1")
    assert await store.load_journal(run.thread_id, 1) == []


async def test_concurrent_journal_writes_fence_each_run_alone(store: Store) -> None:
    """Calls journaled at once share a group commit; the one with a stale lease is refused
    and the others are written."""
    runs = await started(store, 4)
    leases = [lease_of(r) for r in await store.claim_runs("w1", V, AGENTS, 10, LONG)]
    stale = Lease(leases[1].thread_id, "w1", leases[1].epoch - 1)
    outcomes = await asyncio.gather(
        *(store.record_call(le if i != 1 else stale, 1, 0, "f", b"1")
          for i, le in enumerate(leases)),
        return_exceptions=True)
    assert [isinstance(o, LeaseLost) for o in outcomes] == [False, True, False, False]
    for i, le in enumerate(leases):
        expected = [] if i == 1 else [JournalRecord(0, "f", b"1")]
        assert await store.load_journal(le.thread_id, 1) == expected
    assert len(runs) == 4


# -- commit_step ----------------------------------------------------------------------------


async def test_commit_running_keeps_the_lease_and_appends_a_checkpoint(store: Store) -> None:
    (run,) = await started(store)
    held = await claim_one(store, run)
    commit = step_commit(lease_of(held), 1, "running", kind="s", node="start", next_node="n2")
    await store.commit_step(commit)
    now = await store.get_run(run.thread_id)
    assert now is not None
    assert (now.status, now.step, now.node) == ("running", 1, "n2")
    assert (now.lease_owner, now.epoch) == ("w1", held.epoch)
    assert now.lease_expires_at is not None
    assert await store.checkpoints(run.thread_id) == [
        CheckpointRecord(
            thread_id=run.thread_id,
            step=1,
            node="start",
            next_node="n2",
            kind="s",
            data=commit.data,
            worker="w1",
            attempt=commit.attempt,
            started_at=commit.started_at,
            finished_at=commit.finished_at,
        )
    ]
    # The same lease goes on committing; a run that goes on resolves to None.
    assert await store.commit_step(step_commit(lease_of(held), 2, "running", next_node="n3")) is None
    assert [c.step for c in await store.checkpoints(run.thread_id)] == [1, 2]
    assert (await store.get_run(run.thread_id)).step == 2  # type: ignore[union-attr]


async def test_commit_queued_releases_the_run(store: Store) -> None:
    (run,) = await started(store)
    held = await claim_one(store, run)
    await store.commit_step(step_commit(lease_of(held), 1, "queued", next_node="n2"))
    now = await store.get_run(run.thread_id)
    assert now is not None and (now.status, now.step, now.node) == ("queued", 1, "n2")
    assert_unleased(now)
    again = await claim_one(store, run, "w2")
    assert again.epoch == held.epoch + 1
    with pytest.raises(LeaseLost):
        await store.commit_step(step_commit(lease_of(held), 2))


async def test_commit_completed_finishes_the_run(store: Store) -> None:
    (run,) = await started(store)
    held = await claim_one(store, run)
    finished = await store.commit_step(step_commit(lease_of(held), 1, "completed", next_node=None))
    now = await store.get_run(run.thread_id)
    assert now is not None and now.status == "completed" and now.step == 1
    assert finished == now  # the run as committed (both stores have it at hand here)
    assert_unleased(now)
    assert await claimable(store) == set()
    with pytest.raises(LeaseLost):  # the lease ended with the run
        await store.commit_step(step_commit(lease_of(held), 2))
    assert [c.step for c in await store.checkpoints(run.thread_id)] == [1]


async def test_commit_waiting_parks_the_run(store: Store) -> None:
    (run,) = await started(store)
    held = await claim_one(store, run)
    await store.commit_step(step_commit(lease_of(held), 1, "waiting", waiting_for="interrupt"))
    now = await store.get_run(run.thread_id)
    assert now is not None and now.status == "waiting" and now.waiting_for == "interrupt"
    assert_unleased(now)
    assert await claimable(store) == set()


async def test_commit_sleeping_sets_wake_at(store: Store) -> None:
    (run,) = await started(store)
    held = await claim_one(store, run)
    wake = await store.now() + 3600
    await store.commit_step(step_commit(lease_of(held), 1, "sleeping", wake_at=wake))
    now = await store.get_run(run.thread_id)
    assert now is not None and now.status == "sleeping" and now.wake_at == wake
    assert_unleased(now)
    assert await claimable(store) == set()


async def test_commit_with_a_stale_epoch_writes_nothing(store: Store) -> None:
    (run,) = await started(store)
    old = await claim_one(store, run, "w1", SHORT)
    await store.commit_step(step_commit(lease_of(old), 1))
    await asyncio.sleep(WAIT)
    new = await claim_one(store, run, "w2")
    kids = [new_run("kid", parent=run.thread_id)]
    with pytest.raises(LeaseLost):
        await store.commit_step(step_commit(lease_of(old), 2, "completed", children=kids))
    assert [c.step for c in await store.checkpoints(run.thread_id)] == [1]
    assert await store.get_run(run.thread_id) == new
    assert await store.get_run("kid") is None
    # The new holder commits the same step number without a clash.
    await store.commit_step(step_commit(lease_of(new), 2))
    cps = await store.checkpoints(run.thread_id)
    assert [(c.step, c.worker) for c in cps] == [(1, "w1"), (2, "w2")]


async def test_commit_with_a_made_up_epoch_is_refused(store: Store) -> None:
    (run,) = await started(store)
    held = await claim_one(store, run)
    for epoch in (held.epoch - 1, held.epoch + 1):
        with pytest.raises(LeaseLost):
            await store.commit_step(step_commit(Lease(run.thread_id, "w1", epoch), 1))
    with pytest.raises(LeaseLost):
        await store.commit_step(step_commit(Lease("nope", "w1", 1), 1))
    assert await store.checkpoints(run.thread_id) == []
    assert await store.get_run(run.thread_id) == held


async def test_concurrent_commits_fence_each_run_alone(store: Store) -> None:
    """Steps committed at once share a group commit; the one with a stale lease commits
    nothing and the others commit their checkpoint and move on."""
    await started(store, 4)
    held = await store.claim_runs("w1", V, AGENTS, 10, LONG)
    leases = [lease_of(r) for r in held]
    leases[2] = Lease(leases[2].thread_id, "w1", leases[2].epoch + 1)
    outcomes = await asyncio.gather(
        *(store.commit_step(step_commit(le, 1, next_node="n2")) for le in leases),
        return_exceptions=True)
    assert [isinstance(o, LeaseLost) for o in outcomes] == [False, False, True, False]
    for i, le in enumerate(leases):
        now = await store.get_run(le.thread_id)
        assert now is not None
        assert (now.step, now.node) == ((0, held[i].node) if i == 2 else (1, "n2"))
        assert [c.step for c in await store.checkpoints(le.thread_id)] == ([] if i == 2 else [1])


async def test_concurrent_writes_keep_every_byte_of_their_data(store: Store) -> None:
    """Batched journal writes and step commits store their bytes exactly (the batched forms
    carry them differently from the one-by-one statements)."""
    await started(store, 5)
    leases = [lease_of(r) for r in await store.claim_runs("w1", V, AGENTS, 10, LONG)]
    texts = ['quote " back \\ slash', "line\nbreak\ttab \u2028 \u0000 nul escape",
             "unicode é ß 😀 𝄞", "", "a" * 5000]
    datas = [orjson.dumps({"v": t, "n": [1.5, -0.1, 10**18]}) for t in texts]
    await asyncio.gather(*(store.record_call(le, 1, 0, "f", d)
                           for le, d in zip(leases, datas, strict=True)))
    commits = [step_commit(le, 1, data={"v": t}) for le, t in zip(leases, texts, strict=True)]
    await asyncio.gather(*(store.commit_step(c) for c in commits))
    for le, d, c in zip(leases, datas, commits, strict=True):
        assert await store.load_journal(le.thread_id, 1) == [JournalRecord(0, "f", d)]
        (cp,) = await store.checkpoints(le.thread_id)
        assert (cp.data, cp.started_at, cp.finished_at) == (c.data, c.started_at, c.finished_at)


async def test_commit_creates_children_with_their_parent(store: Store) -> None:
    (parent,) = await started(store)
    held = await claim_one(store, parent)
    kids = [new_run(f"kid{i}", agent="a", parent=parent.thread_id) for i in range(3)]
    await store.commit_step(
        step_commit(lease_of(held), 1, "waiting", waiting_for="join", children=kids)
    )
    for kid in kids:
        row = await store.get_run(kid.thread_id)
        assert row is not None
        assert row.status == "queued" and row.parent_thread_id == parent.thread_id
        assert (row.agent, row.input, row.node, row.epoch) == (kid.agent, kid.input, "start", 0)
    assert await claimable(store) == {k.thread_id for k in kids}


async def test_commit_signals_work_when_it_makes_runs_claimable(store: Store) -> None:
    (run,) = await started(store)
    held = await claim_one(store, run)
    store.work_available.clear()
    await store.commit_step(step_commit(lease_of(held), 1, "queued"))
    await asyncio.wait_for(store.work_available.wait(), 2)


# -- fail_step ------------------------------------------------------------------------------


async def test_fail_final_marks_the_run_failed(store: Store) -> None:
    (run,) = await started(store)
    held = await claim_one(store, run)
    error = orjson.dumps({"type": "ValueError", "message": "boom"})
    await store.fail_step(lease_of(held), failures=3, wake_at=None, error=error, final=True)
    now = await store.get_run(run.thread_id)
    assert now is not None
    assert (now.status, now.failures, now.error) == ("failed", 3, error)
    assert_unleased(now)
    assert await claimable(store) == set()
    with pytest.raises(LeaseLost):
        await store.commit_step(step_commit(lease_of(held), 1))


async def test_fail_non_final_requeues_from_wake_at(store: Store) -> None:
    (run,) = await started(store)
    held = await claim_one(store, run)
    wake = await store.now() + SOON
    await store.fail_step(lease_of(held), failures=1, wake_at=wake, error=b"{}", final=False)
    now = await store.get_run(run.thread_id)
    assert now is not None
    assert (now.status, now.failures, now.wake_at, now.step) == ("queued", 1, wake, 0)
    assert_unleased(now)
    assert await claimable(store) == set()
    await asyncio.sleep(LATER)
    retry = await claim_one(store, run, "w2")
    assert retry.epoch == held.epoch + 1 and retry.failures == 1
    with pytest.raises(LeaseLost):
        await store.commit_step(step_commit(lease_of(held), 1))


async def test_fail_non_final_without_wake_at_is_claimable_at_once(store: Store) -> None:
    (run,) = await started(store)
    held = await claim_one(store, run)
    await store.fail_step(lease_of(held), failures=1, wake_at=None, error=None, final=False)
    assert await claimable(store) == {run.thread_id}


async def test_fail_with_a_stale_epoch_writes_nothing(store: Store) -> None:
    (run,) = await started(store)
    old = await claim_one(store, run, "w1", SHORT)
    await asyncio.sleep(WAIT)
    new = await claim_one(store, run, "w2")
    for final in (True, False):
        with pytest.raises(LeaseLost):
            await store.fail_step(lease_of(old), failures=1, wake_at=None, error=b"x", final=final)
    assert await store.get_run(run.thread_id) == new


# -- cancel_run -----------------------------------------------------------------------------


async def test_cancel_a_queued_run(store: Store) -> None:
    (run,) = await started(store)
    cancelled = await store.cancel_run(run.thread_id)
    assert cancelled is not None
    assert cancelled.status == "cancelled"
    assert cancelled.epoch > run.epoch
    assert_unleased(cancelled)
    assert await store.get_run(run.thread_id) == cancelled
    assert await claimable(store) == set()


async def test_cancel_fences_out_the_holder(store: Store) -> None:
    (run,) = await started(store)
    held = await claim_one(store, run)
    lease = lease_of(held)
    await store.record_call(lease, 1, 0, "before", b"1")
    cancelled = await store.cancel_run(run.thread_id)
    assert cancelled is not None and cancelled.status == "cancelled"
    assert cancelled.epoch > held.epoch
    assert_unleased(cancelled)
    with pytest.raises(LeaseLost):
        await store.record_call(lease, 1, 1, "after", b"2")
    with pytest.raises(LeaseLost):
        await store.commit_step(step_commit(lease, 1, "completed"))
    with pytest.raises(LeaseLost):
        await store.fail_step(lease, failures=1, wake_at=None, error=None, final=True)
    await store.release_runs([lease])
    assert await store.checkpoints(run.thread_id) == []
    assert len(await store.load_journal(run.thread_id, 1)) == 1
    assert await store.get_run(run.thread_id) == cancelled
    assert await store.renew_leases("w1", LONG) == set()


@pytest.mark.parametrize("status", ["waiting", "sleeping"])
async def test_cancel_a_parked_run(store: Store, status: str) -> None:
    (run,) = await started(store)
    held = await claim_one(store, run)
    wake = await store.now() + 3600
    await store.commit_step(
        step_commit(lease_of(held), 1, status, wake_at=wake, waiting_for="interrupt")
    )
    cancelled = await store.cancel_run(run.thread_id)
    assert cancelled is not None and cancelled.status == "cancelled"
    assert cancelled.step == 1


async def test_cancel_leaves_terminal_runs_unchanged(store: Store) -> None:
    done, failed, gone = await started(store, 3)
    held = {r.thread_id: r for r in await store.claim_runs("w1", V, AGENTS, 10, LONG)}
    await store.commit_step(step_commit(lease_of(held[done.thread_id]), 1, "completed"))
    await store.fail_step(
        lease_of(held[failed.thread_id]), failures=1, wake_at=None, error=b"e", final=True
    )
    await store.cancel_run(gone.thread_id)
    for run in (done, failed, gone):
        before = await store.get_run(run.thread_id)
        assert before is not None and before.status in TERMINAL
        assert await store.cancel_run(run.thread_id) == before
        assert await store.get_run(run.thread_id) == before


async def test_cancel_unknown_is_none(store: Store) -> None:
    assert await store.cancel_run("nope") is None


# -- load_checkpoints / checkpoints ---------------------------------------------------------


async def _log(store: Store, kinds: str) -> str:
    """Commits one checkpoint per letter of `kinds` ('s' snapshot, 'd' delta); steps 1..n."""
    (run,) = await started(store)
    lease = lease_of(await claim_one(store, run))
    for step, kind in enumerate(kinds, start=1):
        await store.commit_step(step_commit(lease, step, "running", kind=kind))
    return run.thread_id


def _steps(rows: list[CheckpointRecord]) -> list[tuple[int, str]]:
    return [(r.step, r.kind) for r in rows]


async def test_checkpoints_lists_every_row_by_step(store: Store) -> None:
    tid = await _log(store, "sddsd")
    rows = await store.checkpoints(tid)
    assert _steps(rows) == [(1, "s"), (2, "d"), (3, "d"), (4, "s"), (5, "d")]
    assert [orjson.loads(r.data) for r in rows] == [{"step": i} for i in range(1, 6)]
    assert await store.checkpoints("nope") == []


async def test_load_checkpoints_is_the_latest_snapshot_and_later_deltas(store: Store) -> None:
    tid = await _log(store, "sddsdd")
    assert _steps(await store.load_checkpoints(tid)) == [(4, "s"), (5, "d"), (6, "d")]


@pytest.mark.parametrize(
    ("upto", "expected"),
    [
        (0, []),
        (1, [(1, "s")]),
        (2, [(1, "s"), (2, "d")]),
        (3, [(1, "s"), (2, "d"), (3, "d")]),
        (4, [(4, "s")]),
        (5, [(4, "s"), (5, "d")]),
        (6, [(4, "s"), (5, "d"), (6, "d")]),
        (99, [(4, "s"), (5, "d"), (6, "d")]),
    ],
)
async def test_load_checkpoints_upto(
    store: Store, upto: int, expected: list[tuple[int, str]]
) -> None:
    tid = await _log(store, "sddsdd")
    assert _steps(await store.load_checkpoints(tid, upto)) == expected


async def test_load_checkpoints_without_a_snapshot_is_every_delta(store: Store) -> None:
    tid = await _log(store, "ddd")
    assert _steps(await store.load_checkpoints(tid)) == [(1, "d"), (2, "d"), (3, "d")]
    assert _steps(await store.load_checkpoints(tid, 2)) == [(1, "d"), (2, "d")]


async def test_load_checkpoints_of_a_run_without_steps_is_empty(store: Store) -> None:
    (run,) = await started(store)
    assert await store.load_checkpoints(run.thread_id) == []
    assert await store.load_checkpoints("nope") == []
    assert await store.load_checkpoints("nope", 3) == []


async def test_checkpoints_are_per_run(store: Store) -> None:
    a = await _log(store, "sd")
    b = await _log(store, "s")
    assert [r.thread_id for r in await store.checkpoints(a)] == [a, a]
    assert [r.thread_id for r in await store.load_checkpoints(b)] == [b]


# -- lifecycle ------------------------------------------------------------------------------


async def test_close_is_idempotent(db_url: str, store_for: Callable[[str], Store]) -> None:
    store = store_for(db_url)
    await store.open()
    await store.close()
    await store.close()


async def test_data_survives_reopening(db_url: str, store_for: Callable[[str], Store]) -> None:
    first = store_for(db_url)
    await first.open()
    try:
        tid = await _log(first, "sd")
        expected = (await first.get_run(tid), await first.checkpoints(tid))
    finally:
        await first.close()
    second = store_for(db_url)
    await second.open()
    try:
        assert (await second.get_run(tid), await second.checkpoints(tid)) == expected
    finally:
        await second.close()
