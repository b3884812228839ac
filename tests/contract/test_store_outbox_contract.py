"""The Store contract of the outbox, on every store (SQLite, Postgres).

Pins the outbox sentences of `tether.store.base`: effects are written by `commit_step` in the
step's transaction (transactional ones performed inside it, with its connection), explicit
keys are unique per run, `claim_effects` leases due effects by handler name and strictly in
each run's request order under a fencing epoch, `complete_effect` / `fail_effect` are fenced,
failed effects come back after their delay or are dead, `retry_effect` revives the dead, and
a final failure or a cancel queues compensations in reverse order of the originals.
"""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

import orjson
import psycopg
import pytest

from tether.errors import DuplicateEffectKey, EffectError, LeaseLost
from tether.store.base import (
    EffectRecord,
    EffectRow,
    Lease,
    NewRun,
    StepCommit,
    Store,
)

V = "v1"
AGENTS = ("a",)
LONG = 30.0  # a lease TTL no test outlives
SHORT = 0.2  # an effect lease TTL tests wait out
WAIT = SHORT + 0.15
SOON = 0.6  # a retry delay tests observe both before and after it runs out
LATER = SOON + 0.15
USER_TABLE = "fx_user_rows"


# -- helpers --------------------------------------------------------------------------------


def new_run(thread_id: str | None = None) -> NewRun:
    data = orjson.dumps({"q": "hello"})
    return NewRun(
        thread_id=thread_id or f"t-{uuid.uuid4().hex[:12]}", agent="a", version=V, node="start",
        input=data, input_hash=hashlib.sha256(data).hexdigest())


async def running(store: Store, thread_id: str | None = None) -> Lease:
    """A new run, claimed: the lease to commit its steps with."""
    run, created = await store.create_run(new_run(thread_id))
    assert created
    claimed = await store.claim_runs("w1", V, AGENTS, 10, LONG)
    assert [r.thread_id for r in claimed] == [run.thread_id]
    return Lease(run.thread_id, "w1", claimed[0].epoch)


def fx(key: str, idx: int = 0, name: str = "book", payload: Any = None,
       apply: Callable[..., Any] | None = None) -> EffectRow:
    return EffectRow(key, idx, name, orjson.dumps({"k": key} if payload is None else payload),
                     apply)


def commit(lease: Lease, step: int, effects: Sequence[EffectRow] = (),
           status: str = "running") -> StepCommit:
    return StepCommit(
        lease=lease, step=step, node=f"n{step}", next_node=None if status == "completed" else "n",
        kind="d", data=orjson.dumps({"step": step}), attempt=1, started_at=1_700_000_000.0 + step,
        finished_at=1_700_000_000.5 + step, status=status, effects=tuple(effects))


async def effects_of(store: Store, thread_id: str) -> dict[str, EffectRecord]:
    return {e.key: e for e in await store.list_effects(thread_id=thread_id, limit=1000)}


async def claim(store: Store, names: Sequence[str] = ("book",), *, limit: int = 100,
                ttl: float = LONG, worker: str = "d1") -> list[EffectRecord]:
    return await store.claim_effects(worker, list(names), limit, ttl)


async def claim_keys(store: Store, names: Sequence[str] = ("book",), **kw: Any) -> list[str]:
    return sorted(e.key for e in await claim(store, names, **kw))


async def checkpoint_steps(store: Store, thread_id: str) -> list[int]:
    return [cp.step for cp in await store.checkpoints(thread_id)]


class UserTable:
    """A table of the user's, in the same database as tether's, written by transactional
    effects; read through a connection of its own (so only committed rows are seen)."""

    def __init__(self, db_url: str) -> None:
        self.db_url = db_url
        self.sqlite = db_url.startswith("sqlite:")
        self.execute(f"CREATE TABLE {USER_TABLE} (thread_id TEXT, step INTEGER, key TEXT)")

    def execute(self, sql: str) -> list[tuple[Any, ...]]:
        if self.sqlite:
            conn = sqlite3.connect(urlsplit(self.db_url).path[1:], isolation_level=None)
            try:
                return conn.execute(sql).fetchall()
            finally:
                conn.close()
        with psycopg.connect(self.db_url, autocommit=True) as pg:
            cur = pg.execute(sql.encode())
            return cur.fetchall() if cur.description else []

    def rows(self) -> list[tuple[Any, ...]]:
        return sorted(self.execute(f"SELECT thread_id, step, key FROM {USER_TABLE}"))


def transactional(dialect: str, seen: list[dict[str, Any]], *, fail: bool = False
                  ) -> Callable[..., Any]:
    """apply(conn, payload, key) for this dialect: notes what it saw of the connection and
    the step's transaction, inserts a row into the user table, then raises if `fail`."""
    insert = f"INSERT INTO {USER_TABLE} VALUES (?, ?, ?)"

    if dialect == "sqlite":
        def apply_sqlite(conn: Any, payload: bytes, key: str) -> None:
            data = orjson.loads(payload)
            step = conn.execute("SELECT step FROM runs WHERE thread_id = ?",
                                (data["thread_id"],)).fetchone()[0]
            seen.append({"conn": conn, "in_tx": conn.in_transaction, "run_step": step,
                         "payload": data, "key": key})
            conn.execute(insert, (data["thread_id"], data["step"], key))
            if fail:
                raise RuntimeError("the user's write failed")

        return apply_sqlite

    async def apply_pg(conn: Any, payload: bytes, key: str) -> None:
        data = orjson.loads(payload)
        cur = await conn.execute("SELECT step FROM runs WHERE thread_id = %s",
                                 (data["thread_id"],))
        step = (await cur.fetchone())[0]
        seen.append({"conn": conn, "in_tx": conn.info.transaction_status
                     == psycopg.pq.TransactionStatus.INTRANS, "run_step": step,
                     "payload": data, "key": key})
        await conn.execute(insert.replace("?", "%s"), (data["thread_id"], data["step"], key))
        if fail:
            raise RuntimeError("the user's write failed")

    return apply_pg


@pytest.fixture
def user_table(db_url: str) -> Iterator[UserTable]:
    yield UserTable(db_url)


# -- commit_step writes effects ---------------------------------------------------------------


async def test_effects_of_a_committed_step_land_pending(store: Store) -> None:
    lease = await running(store)
    before = await store.now()
    await store.commit_step(commit(lease, 1, [fx("k1", 0, payload={"what": "flight"}),
                                              fx("k2", 1, name="mail", payload=[1, 2])]))
    got = await effects_of(store, lease.thread_id)
    assert set(got) == {"k1", "k2"}
    k1, k2 = got["k1"], got["k2"]
    assert (k1.thread_id, k1.step, k1.idx, k1.name, orjson.loads(k1.payload)) == (
        lease.thread_id, 1, 0, "book", {"what": "flight"})
    assert (k2.step, k2.idx, k2.name, orjson.loads(k2.payload)) == (1, 1, "mail", [1, 2])
    for e in (k1, k2):
        assert e.status == "pending"
        assert e.attempts == 0
        assert e.result is None and e.error is None and e.compensates is None
        assert e.done_at is None
        assert before - 1 <= e.created_at <= await store.now() + 1
        assert e.next_attempt_at <= await store.now()  # due at once
        assert await store.get_effect(lease.thread_id, e.key) == e
    # list_effects filters by status too, in request order.
    assert [e.key for e in await store.list_effects(thread_id=lease.thread_id,
                                                    status="pending")] == ["k1", "k2"]
    assert await store.list_effects(thread_id=lease.thread_id, status="done") == []


async def test_an_uncommitted_step_writes_no_effect(store: Store) -> None:
    lease = await running(store)
    stale = Lease(lease.thread_id, lease.worker, lease.epoch - 1)
    with pytest.raises(LeaseLost):
        await store.commit_step(commit(stale, 1, [fx("k1")]))
    assert await store.list_effects(thread_id=lease.thread_id) == []
    assert await store.get_effect(lease.thread_id, "k1") is None
    assert await claim(store) == []


async def test_effects_of_a_final_step_are_written(store: Store) -> None:
    lease = await running(store)
    await store.commit_step(commit(lease, 1, [fx("last")], status="completed"))
    assert (await store.get_run(lease.thread_id)).status == "completed"  # type: ignore[union-attr]
    assert [e.status for e in (await effects_of(store, lease.thread_id)).values()] == ["pending"]
    assert await claim_keys(store) == ["last"]


async def test_transactional_effect_runs_inside_the_step_transaction(
        store: Store, user_table: UserTable) -> None:
    lease = await running(store)
    seen: list[dict[str, Any]] = []
    apply = transactional(store.dialect, seen)
    payload = {"thread_id": lease.thread_id, "step": 1}
    await store.commit_step(commit(lease, 1, [fx("tx1", 0, "ledger", payload, apply),
                                              fx("plain", 1, "book")]))
    assert len(seen) == 1, "apply is called once, at commit"
    call = seen[0]
    expected = sqlite3.Connection if store.dialect == "sqlite" else psycopg.AsyncConnection
    assert isinstance(call["conn"], expected)
    assert call["in_tx"], "apply must run inside an open transaction"
    # The same transaction as the checkpoint: it already sees the step's own run update.
    assert call["run_step"] == 1
    assert (call["payload"], call["key"]) == (payload, "tx1")
    assert user_table.rows() == [(lease.thread_id, 1, "tx1")]
    got = await effects_of(store, lease.thread_id)
    assert got["tx1"].status == "done", "a transactional effect is done when its step commits"
    assert got["plain"].status == "pending"
    # Only the plain one is left for a dispatcher; the done one is never claimed.
    assert await claim_keys(store, ["ledger", "book"]) == ["plain"]


async def test_a_transactional_effect_is_recorded_done_with_its_time(
        store: Store, user_table: UserTable) -> None:
    lease = await running(store)
    before = await store.now()
    payload = {"thread_id": lease.thread_id, "step": 1}
    await store.commit_step(commit(lease, 1, [fx("tx1", 0, "ledger", payload,
                                                 transactional(store.dialect, []))]))
    done = await store.get_effect(lease.thread_id, "tx1")
    assert done is not None and done.status == "done"
    assert done.done_at is not None, "a done effect records when it was done"
    assert before - 1 <= done.done_at <= await store.now() + 1


async def test_a_failing_transactional_effect_aborts_the_whole_step(
        store: Store, user_table: UserTable) -> None:
    lease = await running(store)
    await store.commit_step(commit(lease, 1, [fx("before")]))
    seen: list[dict[str, Any]] = []
    payload = {"thread_id": lease.thread_id, "step": 2}
    bad = fx("tx2", 0, "ledger", payload, transactional(store.dialect, seen, fail=True))
    with pytest.raises(EffectError) as info:
        await store.commit_step(commit(lease, 2, [fx("plain2", 1), bad]))
    assert "ledger" in str(info.value)
    assert len(seen) == 1  # it was called (and wrote its row) before raising
    # Nothing of step 2: no checkpoint, no run update, no effect rows, not the user's row.
    run = await store.get_run(lease.thread_id)
    assert run is not None and run.step == 1 and run.status == "running"
    assert await checkpoint_steps(store, lease.thread_id) == [1]
    assert set(await effects_of(store, lease.thread_id)) == {"before"}
    assert user_table.rows() == []
    # The lease still holds: the step can commit without the failing effect.
    good = fx("tx2", 0, "ledger", payload, transactional(store.dialect, seen))
    await store.commit_step(commit(lease, 2, [good]))
    assert await checkpoint_steps(store, lease.thread_id) == [1, 2]
    assert user_table.rows() == [(lease.thread_id, 2, "tx2")]


async def test_a_stale_lease_performs_no_transactional_effect(
        store: Store, user_table: UserTable) -> None:
    lease = await running(store)
    stale = Lease(lease.thread_id, lease.worker, lease.epoch - 1)
    seen: list[dict[str, Any]] = []
    payload = {"thread_id": lease.thread_id, "step": 1}
    with pytest.raises(LeaseLost):
        await store.commit_step(commit(stale, 1, [fx("tx", 0, "ledger", payload,
                                                     transactional(store.dialect, seen))]))
    assert user_table.rows() == []
    assert await store.list_effects(thread_id=lease.thread_id) == []


# -- explicit keys ----------------------------------------------------------------------------


async def test_a_key_used_before_in_the_run_is_refused(store: Store) -> None:
    lease = await running(store)
    await store.commit_step(commit(lease, 1, [fx("charge-42")]))
    with pytest.raises(DuplicateEffectKey) as info:
        await store.commit_step(commit(lease, 2, [fx("fresh"), fx("charge-42", 1)]))
    assert "charge-42" in str(info.value)
    run = await store.get_run(lease.thread_id)
    assert run is not None and run.step == 1
    assert await checkpoint_steps(store, lease.thread_id) == [1]
    assert set(await effects_of(store, lease.thread_id)) == {"charge-42"}
    # The original row is untouched.
    assert (await store.get_effect(lease.thread_id, "charge-42")).step == 1  # type: ignore[union-attr]


async def test_a_key_used_twice_in_one_step_is_refused(store: Store) -> None:
    lease = await running(store)
    with pytest.raises(DuplicateEffectKey):
        await store.commit_step(commit(lease, 1, [fx("same", 0), fx("same", 1)]))
    assert await checkpoint_steps(store, lease.thread_id) == []
    assert await store.list_effects(thread_id=lease.thread_id) == []


async def test_the_same_key_in_two_runs_is_fine(store: Store) -> None:
    for thread_id in ("run-a", "run-b"):
        lease = await running(store, thread_id)
        await store.commit_step(commit(lease, 1, [fx("shared")]))
    assert {(e.thread_id, e.key) for e in await claim(store)} == {
        ("run-a", "shared"), ("run-b", "shared")}


# -- claim_effects ----------------------------------------------------------------------------


async def test_claim_takes_only_the_named_handlers(store: Store) -> None:
    await store.commit_step(commit(await running(store, "ra"), 1, [fx("mail-1", 0, "mail")]))
    await store.commit_step(commit(await running(store, "rb"), 1, [fx("book-1", 0, "book")]))
    assert await claim(store, ["other"]) == []
    assert await claim_keys(store, ["book"]) == ["book-1"]
    assert await claim_keys(store, ["book", "mail"]) == ["mail-1"]
    assert await claim(store, ["book", "mail"]) == []


async def test_claim_bumps_epoch_and_attempts_and_leases(store: Store) -> None:
    lease = await running(store)
    await store.commit_step(commit(lease, 1, [fx("k")]))
    pending = await store.get_effect(lease.thread_id, "k")
    assert pending is not None
    (got,) = await claim(store)
    assert got.key == "k" and got.status == "running"
    assert got.epoch == pending.epoch + 1
    assert got.attempts == 1
    assert await store.get_effect(lease.thread_id, "k") == got
    assert await claim(store) == [], "a running effect under a live lease is not claimable"


async def test_claim_respects_limit(store: Store) -> None:
    for i in range(5):
        lease = await running(store, f"r{i}")
        await store.commit_step(commit(lease, 1, [fx(f"k{i}")]))
    first = await claim(store, limit=2)
    assert len(first) == 2
    rest = await claim(store, limit=10)
    assert len(rest) == 3
    assert not {e.thread_id for e in first} & {e.thread_id for e in rest}


async def test_effects_of_a_run_are_claimed_in_request_order(store: Store) -> None:
    lease = await running(store, "ordered")
    await store.commit_step(commit(lease, 1, [fx("s1-a", 0), fx("s1-b", 1), fx("s1-c", 2)]))
    await store.commit_step(commit(lease, 2, [fx("s2-a", 0, "mail")]))
    other = await running(store, "other")
    await store.commit_step(commit(other, 1, [fx("o-a", 0), fx("o-b", 1)]))
    names = ["book", "mail"]
    order: list[str] = []
    for _ in range(10):
        batch = await claim(store, names)
        # At most one effect per run at a time.
        assert len({e.thread_id for e in batch}) == len(batch), batch
        # Nothing else of a run is claimable while its earlier effect runs.
        assert await claim(store, names) == []
        for e in batch:
            if e.thread_id == "ordered":
                order.append(e.key)
            assert await store.complete_effect(e, orjson.dumps(None))
        if not batch:
            break
    assert order == ["s1-a", "s1-b", "s1-c", "s2-a"]
    assert all(e.status == "done" for e in await store.list_effects(limit=1000))


async def test_a_later_effect_waits_for_an_earlier_retrying_one(store: Store) -> None:
    lease = await running(store)
    await store.commit_step(commit(lease, 1, [fx("first")]))
    await store.commit_step(commit(lease, 2, [fx("second")]))
    (first,) = await claim(store)
    assert first.key == "first"
    assert await store.fail_effect(first, "boom", SOON)
    # "first" is pending but not due: "second" must still wait for it.
    assert await claim(store) == []
    await asyncio.sleep(LATER)
    assert await claim_keys(store) == ["first"]


async def test_an_expired_effect_lease_is_claimed_again(store: Store) -> None:
    lease = await running(store)
    await store.commit_step(commit(lease, 1, [fx("k")]))
    (first,) = await claim(store, ttl=SHORT, worker="d1")
    assert await claim(store, worker="d2") == []
    await asyncio.sleep(WAIT)
    (second,) = await claim(store, ttl=LONG, worker="d2")
    assert second.key == "k" and second.status == "running"
    assert second.epoch == first.epoch + 1
    assert second.attempts == first.attempts + 1 == 2
    # The first holder's outcome is refused and writes nothing ...
    assert not await store.complete_effect(first, orjson.dumps({"by": "d1"}))
    assert not await store.fail_effect(first, "late failure", None)
    now = await store.get_effect(lease.thread_id, "k")
    assert now is not None
    assert (now.status, now.result, now.error, now.epoch) == ("running", None, None, second.epoch)
    # ... the current holder's is recorded, once.
    assert await store.complete_effect(second, orjson.dumps({"by": "d2"}))
    done = await store.get_effect(lease.thread_id, "k")
    assert done is not None and done.status == "done"
    assert orjson.loads(done.result or b"null") == {"by": "d2"}
    assert done.done_at is not None
    assert not await store.complete_effect(second, orjson.dumps({"by": "again"}))
    assert orjson.loads((await store.get_effect(lease.thread_id, "k")).result or b"")  \
        == {"by": "d2"}  # type: ignore[union-attr]
    await asyncio.sleep(WAIT)
    assert await claim(store) == [], "a done effect is never claimed again"


# -- complete / fail --------------------------------------------------------------------------


async def test_complete_records_the_result(store: Store) -> None:
    lease = await running(store)
    await store.commit_step(commit(lease, 1, [fx("k")]))
    (e,) = await claim(store)
    before = await store.now()
    assert await store.complete_effect(e, orjson.dumps({"booking": "F-1"}))
    done = await store.get_effect(lease.thread_id, "k")
    assert done is not None
    assert done.status == "done" and done.error is None
    assert orjson.loads(done.result or b"") == {"booking": "F-1"}
    assert done.done_at is not None and before - 1 <= done.done_at <= await store.now() + 1
    assert done.attempts == 1


async def test_fail_with_delay_retries_after_the_delay(store: Store) -> None:
    lease = await running(store)
    await store.commit_step(commit(lease, 1, [fx("k")]))
    (e,) = await claim(store)
    assert await store.fail_effect(e, "ValueError: boom", SOON)
    got = await store.get_effect(lease.thread_id, "k")
    assert got is not None
    assert got.status == "pending" and got.error == "ValueError: boom"
    assert got.next_attempt_at >= await store.now() + SOON - 0.3
    assert await claim(store) == [], "not before the delay"
    await asyncio.sleep(LATER)
    (again,) = await claim(store)
    assert again.attempts == 2 and again.epoch == e.epoch + 1
    assert not await store.fail_effect(e, "stale", None), "the old epoch is fenced out"
    assert (await store.get_effect(lease.thread_id, "k")).status == "running"  # type: ignore[union-attr]
    assert await store.complete_effect(again, orjson.dumps(1))


async def test_fail_without_delay_is_dead_and_retry_effect_revives_it(store: Store) -> None:
    lease = await running(store)
    await store.commit_step(commit(lease, 1, [fx("k")]))
    (e,) = await claim(store)
    assert await store.fail_effect(e, "ValueError: boom", None)
    dead = await store.get_effect(lease.thread_id, "k")
    assert dead is not None
    assert (dead.status, dead.error, dead.attempts) == ("dead", "ValueError: boom", 1)
    assert [d.key for d in await store.list_effects(status="dead")] == ["k"]
    await asyncio.sleep(WAIT)
    assert await claim(store) == [], "a dead effect is never claimed"
    assert not await store.complete_effect(e, orjson.dumps(1)), "nor completed late"
    # An operator retries it: pending again with a fresh attempt budget, due now.
    assert await store.retry_effect("unknown-key") == []
    revived = await store.retry_effect("k")
    assert [(r.thread_id, r.key, r.status, r.attempts) for r in revived] == [
        (lease.thread_id, "k", "pending", 0)]
    (again,) = await claim(store)
    assert again.key == "k" and again.attempts == 1 and again.epoch > e.epoch
    assert await store.complete_effect(again, orjson.dumps("ok"))
    assert (await store.get_effect(lease.thread_id, "k")).status == "done"  # type: ignore[union-attr]
    assert await store.retry_effect("k") == [], "a done effect is not revived"
    assert (await store.get_effect(lease.thread_id, "k")).status == "done"  # type: ignore[union-attr]


async def test_retry_effect_by_thread(store: Store) -> None:
    leases = [await running(store, t) for t in ("ta", "tb")]
    for le in leases:
        await store.commit_step(commit(le, 1, [fx("same-key")]))
    for e in await claim(store):
        assert await store.fail_effect(e, "boom", None)
    revived = await store.retry_effect("same-key", "tb")
    assert [(r.thread_id, r.status) for r in revived] == [("tb", "pending")]
    assert (await store.get_effect("ta", "same-key")).status == "dead"  # type: ignore[union-attr]
    assert [e.thread_id for e in await claim(store)] == ["tb"]


# -- compensations ----------------------------------------------------------------------------


async def _booked(store: Store, thread_id: str) -> tuple[Lease, list[EffectRecord]]:
    """A run that booked a flight (step 1), a hotel and sent a mail (step 2), and a car
    (step 3) whose booking is dead; the flight and hotel are done, the mail is done."""
    lease = await running(store, thread_id)
    await store.commit_step(commit(lease, 1, [fx("flight", 0, "book", {"what": "flight"})]))
    await store.commit_step(commit(lease, 2, [fx("hotel", 0, "book", {"what": "hotel"}),
                                              fx("mail", 1, "mail", {"to": "ada"})]))
    await store.commit_step(commit(lease, 3, [fx("car", 0, "book", {"what": "car"})]))
    done: list[EffectRecord] = []
    for _ in range(4):
        for e in await claim(store, ["book", "mail"]):
            if e.key == "car":
                assert await store.fail_effect(e, "no cars", None)
            else:
                assert await store.complete_effect(e, orjson.dumps({"id": e.key.upper()}))
                done.append(e)
    assert [e.key for e in done] == ["flight", "hotel", "mail"]
    return lease, done


async def _compensated_in_order(store: Store, thread_id: str, originals: list[str]) -> None:
    """The compensations of `originals` (newest first) are claimed one at a time, in that
    order, each carrying its original's name and payload."""
    comps = {e.key: e for e in (await effects_of(store, thread_id)).values()
             if e.compensates is not None}
    assert set(comps) == {f"{k}:compensate" for k in originals}
    for k in originals:
        c = comps[f"{k}:compensate"]
        orig = await store.get_effect(thread_id, k)
        assert orig is not None
        assert (c.compensates, c.name, c.payload, c.status) == (k, orig.name, orig.payload,
                                                                "pending")
    order = []
    for _ in range(len(originals) + 2):
        batch = await claim(store, ["book", "mail"])
        assert len(batch) <= 1, batch
        for e in batch:
            order.append(e.compensates)
            assert await store.complete_effect(e, orjson.dumps(None))
    assert order == originals


async def test_final_failure_queues_compensations_in_reverse_order(store: Store) -> None:
    lease, _ = await _booked(store, "trip")
    await store.fail_step(lease, failures=1, wake_at=None, error=orjson.dumps({"m": "declined"}),
                          final=True, compensate=["book"])
    run = await store.get_run("trip")
    assert run is not None and run.status == "failed"
    # Only "book" has a compensate handler; the dead car booking was never performed.
    await _compensated_in_order(store, "trip", ["hotel", "flight"])


async def test_a_retried_failure_queues_no_compensation(store: Store) -> None:
    lease, _ = await _booked(store, "trip")
    now = await store.now()
    await store.fail_step(lease, failures=1, wake_at=now + 60, error=None, final=False,
                          compensate=["book"])
    assert all(e.compensates is None for e in await store.list_effects(thread_id="trip"))


async def test_cancel_queues_compensations_in_reverse_order(store: Store) -> None:
    await _booked(store, "trip")
    run = await store.cancel_run("trip", compensate=["book", "mail"])
    assert run is not None and run.status == "cancelled"
    await _compensated_in_order(store, "trip", ["mail", "hotel", "flight"])
    # Cancelling again (the run is terminal) queues nothing more.
    await store.cancel_run("trip", compensate=["book", "mail"])
    comps = [e for e in await store.list_effects(thread_id="trip") if e.compensates]
    assert len(comps) == 3 and all(e.status == "done" for e in comps)


async def test_cancel_without_names_queues_no_compensation(store: Store) -> None:
    await _booked(store, "trip")
    await store.cancel_run("trip")
    assert all(e.compensates is None for e in await store.list_effects(thread_id="trip"))


async def test_a_compensation_waits_for_its_pending_original(store: Store) -> None:
    lease = await running(store, "trip")
    await store.commit_step(commit(lease, 1, [fx("flight", 0, "book")]))
    (inflight,) = await claim(store)  # the booking is being performed right now
    await store.cancel_run("trip", compensate=["book"])
    assert await store.get_effect("trip", "flight:compensate") is not None
    assert await claim(store) == [], "the compensation must wait for its original"
    assert await store.complete_effect(inflight, orjson.dumps({"id": "F"}))
    (comp,) = await claim(store)
    assert comp.key == "flight:compensate" and comp.compensates == "flight"


async def test_compensations_only_for_the_run_that_failed(store: Store) -> None:
    lease, _ = await _booked(store, "trip")
    other = await running(store, "other")
    await store.commit_step(commit(other, 1, [fx("flight", 0, "book")]))
    await store.fail_step(lease, failures=1, wake_at=None, error=None, final=True,
                          compensate=["book"])
    assert all(e.compensates is None for e in await store.list_effects(thread_id="other"))
    assert await store.get_effect("other", "flight:compensate") is None


# -- batched done marks, heads, the claim's walk over runs ----------------------------------


async def test_complete_effects_marks_a_batch_each_row_fenced(store: Store) -> None:
    for t in ("ba", "bb", "bc"):
        await store.commit_step(commit(await running(store, t), 1, [fx("k")]))
    old = {e.thread_id: e for e in await claim(store, ttl=SHORT, worker="d1")}
    assert set(old) == {"ba", "bb", "bc"}
    await asyncio.sleep(WAIT)
    # d2 takes all three over: d1's epochs are stale now. One batch carries d2's current
    # epochs for ba and bc, and d1's stale one for bb.
    cur = {e.thread_id: e for e in await claim(store, worker="d2")}
    assert all(cur[t].epoch == old[t].epoch + 1 for t in old)
    results = {t: orjson.dumps({"t": t}) for t in old}
    batch = [(cur["ba"], results["ba"]), (old["bb"], results["bb"]), (cur["bc"], results["bc"])]
    assert await store.complete_effects(batch) == [True, False, True], \
        "the stale epoch's row is not marked"
    bb = await store.get_effect("bb", "k")
    assert bb is not None
    assert (bb.status, bb.result, bb.epoch) == ("running", None, cur["bb"].epoch)
    for t in ("ba", "bc"):
        e = await store.get_effect(t, "k")
        assert e is not None and e.status == "done" and e.result == results[t]
    # The current holder's mark goes through; a mark for a done row changes nothing.
    again = await store.complete_effects([(cur["bb"], b"2"), (cur["ba"], b"x")])
    assert again == [True, False]
    done = await store.get_effect("ba", "k")
    assert done is not None and done.result == results["ba"]
    assert await store.complete_effects([]) == []


async def test_complete_effects_answers_a_repeated_mark_once(store: Store) -> None:
    await store.commit_step(commit(await running(store, "rep"), 1, [fx("k")]))
    (e,) = await claim(store)
    assert await store.complete_effects([(e, b"1"), (e, b"1")]) == [True, False]


async def test_concurrent_done_marks_each_get_their_answer(store: Store) -> None:
    for i in range(20):
        await store.commit_step(commit(await running(store, f"cc{i:02d}"), 1, [fx("k")]))
    claimed = await claim(store, ttl=SHORT)
    assert len(claimed) == 20
    await asyncio.sleep(WAIT)
    retaken = {e.thread_id: e for e in await claim(store, worker="d2")}
    stale = [e for e in claimed if int(e.thread_id[2:]) % 2]  # d1's, taken over
    fresh = [retaken[e.thread_id] for e in claimed if not int(e.thread_id[2:]) % 2]
    got = await asyncio.gather(*(store.complete_effect(e, orjson.dumps(e.thread_id))
                                 for e in [*stale, *fresh]))
    assert got == [False] * len(stale) + [True] * len(fresh)
    statuses = {e.thread_id: e.status for e in await store.list_effects(limit=1000)}
    assert all(statuses[e.thread_id] == "running" for e in stale)
    assert all(statuses[e.thread_id] == "done" for e in fresh)


async def test_a_batch_holds_one_head_per_run_and_order_holds_across_batches(
        store: Store) -> None:
    """Runs with several effects each, claimed in large batches and marked done a batch at a
    time (with a failure on the way): every run's effects are performed in request order."""
    requested: dict[str, list[str]] = {}
    for i in range(6):
        t = f"many{i}"
        lease = await running(store, t)
        first = [fx(f"{t}-s1-{j}", j) for j in range(4)]
        second = [fx(f"{t}-s2-{j}", j, "mail") for j in range(2)]
        await store.commit_step(commit(lease, 1, first))
        await store.commit_step(commit(lease, 2, second))
        requested[t] = [e.key for e in [*first, *second]]
    performed: dict[str, list[str]] = {t: [] for t in requested}
    failed_once = False
    for _ in range(60):
        batch = await claim(store, ["book", "mail"], limit=1000)
        if not batch:
            if all(len(performed[t]) == len(requested[t]) for t in requested):
                break
            await asyncio.sleep(0.05)  # a retry's delay
            continue
        assert len({e.thread_id for e in batch}) == len(batch), "one head per run"
        marks = []
        for e in batch:
            if not failed_once and e.key == "many2-s1-1":
                failed_once = True
                assert await store.fail_effect(e, "boom", 0.1)
                continue
            performed[e.thread_id].append(e.key)
            marks.append((e, orjson.dumps(None)))
        assert await store.complete_effects(marks) == [True] * len(marks)
    assert failed_once
    assert performed == requested


async def test_claim_comes_back_round_to_runs_it_passed(store: Store) -> None:
    for i in range(10):
        await store.commit_step(commit(await running(store, f"rr{i}"), 1, [fx("k1")]))
    seen: list[str] = []
    for _ in range(4):
        batch = await claim(store, limit=3)
        seen += [e.thread_id for e in batch]
        assert await store.complete_effects([(e, b"null") for e in batch]) == [True] * len(batch)
    assert sorted(seen) == [f"rr{i}" for i in range(10)], "every run once"
    # New effects for runs before and after wherever the walk stopped are all found.
    for i in range(10):
        lease = await running(store, f"rr{i}x")
        await store.commit_step(commit(lease, 1, [fx("k2")]))
    assert len(await claim(store, limit=100)) == 10


async def test_a_due_head_behind_many_busy_runs_is_found(store: Store) -> None:
    for i in range(150):
        await store.commit_step(commit(await running(store, f"busy{i:03d}"), 1, [fx("k")]))
    assert len(await claim(store, limit=1000)) == 150  # all running, under a long lease
    for t in ("aaa-first", "zzz-last"):
        await store.commit_step(commit(await running(store, t), 1, [fx("k")]))
    got = [e.thread_id for e in await claim(store, limit=1)]
    got += [e.thread_id for e in await claim(store, limit=1)]
    assert sorted(got) == ["aaa-first", "zzz-last"]


async def test_the_postgres_claim_plan_reads_heads_by_index_with_or_without_statistics(
        store: Store, db_url: str) -> None:
    """The claim's plan must not depend on statistics (autovacuum may be off): it finds heads
    by outbox_live and locks and updates rows by TID, never scanning the outbox, before and
    after ANALYZE (taken while every effect is pending: stale once they run)."""
    if store.dialect != "postgres":
        pytest.skip("a Postgres plan")
    from tether.store.migrate import queries

    params = {"after": "", "names": ["book"], "visit": 200, "limit": 50, "worker": "d1",
              "ttl": LONG}
    sql = "EXPLAIN (FORMAT JSON) " + queries("postgres")["claim_effects"]
    with psycopg.connect(db_url, autocommit=True) as pg:
        # 5,000 pending effects of 1,000 runs (written directly: only their size matters).
        pg.execute(b"""
            INSERT INTO outbox (thread_id, key, step, idx, name, payload, status,
                                next_attempt_at, created_at)
            SELECT 'pl' || r, 'k' || i, 1, i, 'book', '{}', 'pending', 0, 0
            FROM generate_series(1, 1000) r, generate_series(0, 4) i""")
        for analyzed in (False, True):
            if analyzed:
                pg.execute(b"ANALYZE outbox")
            (plan,), = pg.execute(sql.encode(), params).fetchall()
            scans = _scans(plan[0]["Plan"])
            assert ("Index Scan", "outbox_live") in scans, (analyzed, scans)
            assert ("Tid Scan", "outbox") in scans, (analyzed, scans)
            assert not [s for s in scans if s[0] in ("Seq Scan", "Bitmap Heap Scan")], \
                (analyzed, scans)


def _scans(node: dict[str, Any]) -> list[tuple[str, str]]:
    here = ([(node["Node Type"], node.get("Index Name") or node.get("Relation Name", ""))]
            if "Scan" in node["Node Type"] and "Relation Name" in node else [])
    return here + [s for child in node.get("Plans", []) for s in _scans(child)]
