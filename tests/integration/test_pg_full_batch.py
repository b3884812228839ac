"""The Postgres store's group commit of FULL steps (store/pg_full.py, real Postgres): steps
that send, consume or park for mail, committed together, share one transaction; each still
gets its own outcome (a lost lease, an unknown recipient, an effect key used before fail that
step alone, and write nothing), and a run that parks for mail in the same batch as a step
that mails it is woken, whichever comes first in the batch."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Sequence

import orjson
import psycopg
import pytest

import tether
from tether.errors import DuplicateEffectKey, LeaseLost, RunNotFound, StoreUnavailable
from tether.store.base import EffectRow, Lease, NewRun, OutMessage, StepCommit
from tether.store.postgres import PostgresStore

WORKER = "w1"


def _new(thread_id: str) -> NewRun:
    data = orjson.dumps({"q": thread_id})
    return NewRun(thread_id, "a", "v1", "start", data, hashlib.sha256(data).hexdigest())


def _step(lease: Lease, step: int = 1, status: str = "running", *,
          waiting_for: str | None = None, messages: Sequence[OutMessage] = (),
          consumed: Sequence[int] = (), effects: Sequence[EffectRow] = (),
          children: Sequence[NewRun] = (), groups: Sequence[tuple[str, str]] = ()
          ) -> StepCommit:
    return StepCommit(
        lease=lease, step=step, node="n", next_node=None if status == "completed" else "n",
        kind="d", data=orjson.dumps({"step": step}), attempt=1, started_at=time.time(),
        finished_at=time.time(), status=status, waiting_for=waiting_for, messages=messages,
        consumed=consumed, effects=effects, children=children, groups=groups)


# In each test the first two FULL steps go alone (nothing in flight yet) and the ones after
# them queue and share a transaction (FLUSHERS = 2).


def _to(recipient: str, n: int) -> OutMessage:
    return OutMessage(orjson.dumps({"n": n}), recipient=recipient)


@pytest.fixture
async def store(pg_url: str) -> AsyncIterator[PostgresStore]:
    s = PostgresStore(pg_url)
    await s.open()
    try:
        yield s
    finally:
        await s.close()


async def _leased(store: PostgresStore, ids: list[str]) -> list[Lease]:
    made = await asyncio.gather(*(store.create_run(_new(t), lease=(WORKER, 60.0)) for t in ids))
    return [Lease(run.thread_id, WORKER, run.epoch) for run, _ in made]


async def _status(store: PostgresStore, thread_id: str) -> tuple[str, str | None]:
    run = await store.get_run(thread_id)
    assert run is not None
    return run.status, run.waiting_for


async def test_many_mail_steps_share_transactions_and_each_lands(store: PostgresStore) -> None:
    n = 60
    target, busy, *senders = await _leased(store, [f"t{i:03d}" for i in range(n + 4)])
    first, senders = senders[:2], senders[2:]
    await store.commit_step(_step(target, 1, "waiting", waiting_for="mail"))
    before = store._full.batches
    # The first two go alone (nothing in flight), the rest queue behind them and share
    # transactions: only those mail the parked target, so a batch must wake it.
    await asyncio.gather(*(store.commit_step(_step(le, 1, messages=[_to(busy.thread_id, 0)]))
                           for le in first),
                         *(store.commit_step(_step(le, 1, messages=[_to(target.thread_id, i)]))
                           for i, le in enumerate(senders)))
    assert store._full.batches > before
    got = await store.load_inbox(target.thread_id)
    assert sorted(orjson.loads(m.message)["n"] for m in got) == list(range(n))
    assert {m.sender for m in got} == {le.thread_id for le in senders}
    assert await _status(store, target.thread_id) == ("queued", None)
    for le in first + senders:
        run = await store.get_run(le.thread_id)
        assert run is not None and (run.step, run.status) == (1, "running")
    # The target reads its mail and parks again, with others doing the same in one batch.
    [again] = await store.claim_runs("w2", "v1", ["a"], 10, 60.0)
    lease = Lease(again.thread_id, "w2", again.epoch)
    await asyncio.gather(
        store.commit_step(_step(lease, 2, "waiting", waiting_for="mail",
                                consumed=[m.id for m in got])),
        *(store.commit_step(_step(le, 2, "waiting", waiting_for="mail")) for le in senders))
    assert await store.load_inbox(target.thread_id) == []
    assert await _status(store, target.thread_id) == ("waiting", "mail")


async def test_a_failing_step_fails_alone_and_writes_nothing(store: PostgresStore) -> None:
    stale, unknown, dup, busy, *good = await _leased(store, [f"r{i}" for i in range(13)])
    rcpt = good.pop()
    effect = EffectRow(key="k1", idx=0, name="e", payload=b'"x"')
    await store.commit_step(_step(dup, 1, effects=[effect]))
    # Take the stale run's lease away: its epoch moves on.
    async with await psycopg.AsyncConnection.connect(store.url, autocommit=True) as conn:
        await conn.execute("UPDATE runs SET epoch = epoch + 1 WHERE thread_id = %s",
                           (stale.thread_id,))
    blocker = asyncio.gather(*(store.commit_step(_step(le, 1, messages=[_to(busy.thread_id, 0)]))
                               for le in good[:2]))
    outcomes = await asyncio.gather(
        blocker,
        store.commit_step(_step(stale, 1, messages=[_to(rcpt.thread_id, 0)])),
        store.commit_step(_step(unknown, 1, messages=[_to("nobody", 1)])),
        store.commit_step(_step(dup, 2, effects=[effect], messages=[_to(rcpt.thread_id, 2)])),
        *(store.commit_step(_step(le, 1, messages=[_to(rcpt.thread_id, 10 + i)]))
          for i, le in enumerate(good[2:])),
        return_exceptions=True)
    assert isinstance(outcomes[1], LeaseLost)
    assert isinstance(outcomes[2], RunNotFound)
    assert isinstance(outcomes[3], DuplicateEffectKey)
    assert all(o is None for o in outcomes[4:]), outcomes
    assert store._full.batches >= 1
    got = sorted(orjson.loads(m.message)["n"] for m in await store.load_inbox(rcpt.thread_id))
    assert got == [10 + i for i in range(len(good) - 2)]  # none from the three that failed
    for le, step in ((stale, 0), (unknown, 0), (dup, 1)):
        run = await store.get_run(le.thread_id)
        assert run is not None and run.step == step


@pytest.mark.parametrize("parker_first", [True, False])
async def test_a_run_parking_in_the_batch_that_mails_it_is_woken(
        store: PostgresStore, parker_first: bool) -> None:
    busy, parker, sender, *rest = await _leased(store, [f"p{i}" for i in range(8)])
    # Two steps in flight, so the next ones queue and share one transaction.
    first = asyncio.gather(*(store.commit_step(_step(le, 1, messages=[_to(busy.thread_id, 0)]))
                             for le in rest[:2]))
    park = store.commit_step(_step(parker, 1, "waiting", waiting_for="mail"))
    send = store.commit_step(_step(sender, 1, messages=[_to(parker.thread_id, 1)]))
    pair = (park, send) if parker_first else (send, park)
    before = store._full.batches
    await asyncio.gather(first, *pair,
                         *(store.commit_step(_step(le, 1)) for le in rest[2:]))
    assert store._full.batches > before
    assert await _status(store, parker.thread_id) == ("queued", None)
    [msg] = await store.load_inbox(parker.thread_id)
    assert msg.sender == sender.thread_id


async def test_children_groups_and_effects_commit_in_a_batch(store: PostgresStore) -> None:
    leases = await _leased(store, [f"c{i}" for i in range(10)])
    await asyncio.gather(*(store.commit_step(_step(
        le, 1, children=[_new(f"{le.thread_id}-kid")], groups=[("g", "member")],
        effects=[EffectRow(key=f"{le.thread_id}-e", idx=0, name="e", payload=b'"p"')]))
        for le in leases))
    assert store._full.batches >= 1
    assert sorted(await store.group_members("g")) == sorted(le.thread_id for le in leases)
    for le in leases:
        kid = await store.get_run(f"{le.thread_id}-kid")
        assert kid is not None and kid.status == "queued"
    effects = await store.claim_effects("d", ["e"], 100, 60.0)
    assert sorted(e.key for e in effects) == sorted(f"{le.thread_id}-e" for le in leases)


actor = tether.Agent("batch_actor")


@actor.node(start=True)
async def listen(state: dict[str, int], ctx: tether.Context) -> tether.Command:
    return tether.receive({"got": state.get("got", 0) + len(ctx.inbox)})


async def test_actors_woken_by_mail_commit_in_few_transactions(pg_url: str) -> None:
    """A regression check of the group commit: 300 parked actors woken by mail read it and
    park again in far fewer transactions than actors (one each before)."""
    n = 300
    rt = tether.Runtime(pg_url, agents=[actor], version="v1", poll_interval=0.05)
    try:
        runs = await rt.start_many([{"agent": actor.name, "input": {}, "thread_id": f"a{i:03d}"}
                                    for i in range(n)])
        work = asyncio.create_task(rt.work(concurrency=n))
        try:
            async def all_at(got: int) -> None:
                while True:
                    states = [await rt.get(r.thread_id) for r in runs]
                    if all(s.status == "waiting" and s.state.get("got") == got for s in states):
                        return
                    await asyncio.sleep(0.05)

            await asyncio.wait_for(all_at(0), 60)
            full = rt.store._full  # type: ignore[attr-defined]
            before = full.transactions
            await asyncio.gather(*(rt.send(r.thread_id, {"ping": 1}) for r in runs))
            await asyncio.wait_for(all_at(1), 60)
            spent = full.transactions - before
        finally:
            work.cancel()
            with pytest.raises(asyncio.CancelledError):
                await work
    finally:
        await rt.close()
    # One transaction per actor before; claimed a few hundred at a time, they share them.
    assert spent <= n // 10, spent


async def test_sends_made_together_share_transactions(store: PostgresStore) -> None:
    """runtime.send's path (pg_send.py): sends made at once share transactions; each gets
    its message id, in the order sent to each run; a send to an unknown or finished run
    fails alone and writes nothing; parked recipients are woken."""
    parked, done, busy, *others = await _leased(store, [f"s{i:02d}" for i in range(23)])
    await store.commit_step(_step(parked, 1, "waiting", waiting_for="mail"))
    await store.commit_step(_step(done, 1, "completed"))
    before = store._sends.transactions
    # The first two go alone; the rest queue behind them and share transactions.
    sends = [(busy.thread_id, -1), (busy.thread_id, -2), (parked.thread_id, 0), ("nobody", 1),
             (done.thread_id, 2), (parked.thread_id, 3)]
    sends += [(le.thread_id, 10 + i) for i, le in enumerate(others)] + [(parked.thread_id, 4)]
    out = await asyncio.gather(*(store.send_message(t, orjson.dumps({"n": n}), "me")
                                 for t, n in sends), return_exceptions=True)
    assert store._sends.transactions - before < len(sends) // 2
    got = out[2:]
    assert isinstance(got[1], RunNotFound)
    assert isinstance(got[2], tether.InvalidState)
    assert all(isinstance(g, int) for i, g in enumerate(out) if i not in (3, 4)), out
    inbox = await store.load_inbox(parked.thread_id)
    assert [orjson.loads(m.message)["n"] for m in inbox] == [0, 3, 4]
    assert [m.id for m in inbox] == [got[0], got[3], got[-1]]
    assert await _status(store, parked.thread_id) == ("queued", None)
    assert await store.load_inbox(done.thread_id) == []
    for i, le in enumerate(others):
        [m] = await store.load_inbox(le.thread_id)
        assert (m.id, m.sender, orjson.loads(m.message)) == (got[4 + i], "me", {"n": 10 + i})


@pytest.mark.parametrize("fails", [False, True], ids=["together", "load_claimed-fails"])
async def test_actors_woken_by_mail_read_what_they_need_with_their_claim(pg_url: str,
                                                                        fails: bool) -> None:
    """300 parked actors woken by mail: each reads its state, journal and inbox with the
    other runs of its claim (Store.load_claimed: a statement per kind for the batch), not in
    three reads of its own one after the other (900 reads before), and each still gets its
    own mail and state. `fails`: load_claimed raises, so each run reads its own, as before,
    with the same outcome."""
    n = 300
    rt = tether.Runtime(pg_url, agents=[actor], version="v1", poll_interval=0.05)
    store = rt.store
    calls: dict[str, int] = {}

    def counted(name: str) -> None:
        real = getattr(store, name)

        async def wrapper(*args: object, **kwargs: object) -> object:
            calls[name] = calls.get(name, 0) + 1
            if fails and name == "load_claimed":
                raise StoreUnavailable("the reads of a claim are lost")
            return await real(*args, **kwargs)

        setattr(store, name, wrapper)

    for name in ("load_checkpoints", "load_journal", "load_inbox", "load_claimed"):
        counted(name)

    async def parked_with(got: int) -> None:  # (read straight from the table: no store reads)
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            while True:
                cur = await conn.execute(
                    b"SELECT count(*) FROM runs WHERE status = 'waiting' AND step = %s", (got + 1,))
                row = await cur.fetchone()
                if row is not None and row[0] == n:
                    return
                await asyncio.sleep(0.05)

    try:
        runs = await rt.start_many([{"agent": actor.name, "input": {}, "thread_id": f"a{i:03d}"}
                                    for i in range(n)])
        work = asyncio.create_task(rt.work(concurrency=n))
        try:
            await asyncio.wait_for(parked_with(0), 60)
            calls.clear()
            await asyncio.gather(*(rt.send(r.thread_id, {"ping": i}) for i, r in enumerate(runs)))
            await asyncio.wait_for(parked_with(1), 60)
            spent = dict(calls)
        finally:
            work.cancel()
            with pytest.raises(asyncio.CancelledError):
                await work
        for run in runs[:20]:
            assert (await rt.get(run.thread_id)).state == {"got": 1}
    finally:
        await rt.close()
    per_run = [spent.get(k, 0) for k in ("load_checkpoints", "load_journal", "load_inbox")]
    assert per_run == ([n, n, n] if fails else [0, 0, 0]), spent
    assert 1 <= spent.get("load_claimed", 0) <= n // 10, spent
