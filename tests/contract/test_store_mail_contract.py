"""The Store contract for mail, groups, spawn/join and cancel cascades, on every store.

Each test pins one sentence of the mailbox part of `tether.store.base` (StepCommit.messages,
.consumed, .groups, send_message, load_inbox, park_run for joins, cancel_run), the way
test_store_contract.py pins the rest. Consumed marks are read straight from the mailbox
table (the store has no API for consumed rows).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import itertools
import uuid
from collections.abc import Sequence

import orjson
import pytest

from apps.mail_app import MailRow, mailbox_rows
from tether.context import ADMIN_CHANNEL
from tether.errors import LeaseLost, RunNotFound
from tether.store import make_store
from tether.store.base import (
    TERMINAL,
    Lease,
    NewRun,
    OutMessage,
    Park,
    RunRecord,
    StepCommit,
    Store,
)

V = "v1"
LONG = 30.0
SHORT = 0.2
WAIT = SHORT + 0.15
_ids = itertools.count()


def new_run(thread_id: str | None = None, *, parent: str | None = None) -> NewRun:
    """A run of its own agent (named after the thread), so a test claims exactly the run it
    means to by naming that agent."""
    tid = thread_id or f"t{next(_ids)}-{uuid.uuid4().hex[:8]}"
    data = orjson.dumps({"q": tid})
    return NewRun(thread_id=tid, agent=f"ag{tid}".replace("-", "_"), version=V, node="start",
                  input=data, input_hash=hashlib.sha256(data).hexdigest(),
                  parent_thread_id=parent)


async def create(store: Store, thread_id: str | None = None, *,
                 parent: str | None = None) -> RunRecord:
    run, created = await store.create_run(new_run(thread_id, parent=parent))
    assert created
    return run


async def claim(store: Store, run: RunRecord | NewRun, worker: str = "w1",
                ttl: float = LONG) -> Lease:
    """Claims `run` (it must be claimable) and returns the lease."""
    got = await store.claim_runs(worker, V, [run.agent], 10, ttl)
    assert [r.thread_id for r in got] == [run.thread_id], got
    assert got[0].lease_owner == worker
    return Lease(run.thread_id, worker, got[0].epoch)


async def is_claimable(store: Store, run: RunRecord | NewRun) -> bool:
    """Whether `run` can be claimed now. Claims it if so (with a lease nobody uses)."""
    return bool(await store.claim_runs("probe", V, [run.agent], 10, LONG))


def commit(lease: Lease, step: int, status: str = "running", *,
           waiting_for: str | None = None, messages: Sequence[OutMessage] = (),
           consumed: Sequence[int] = (), groups: Sequence[tuple[str, str]] = (),
           children: Sequence[NewRun] = ()) -> StepCommit:
    return StepCommit(
        lease=lease, step=step, node="n", next_node=None if status in TERMINAL else "n",
        kind="d", data=orjson.dumps({"step": step}), attempt=1,
        started_at=1_700_000_000.0 + step, finished_at=1_700_000_000.5 + step,
        status=status, waiting_for=waiting_for, children=children, messages=messages,
        consumed=consumed, groups=groups)


def to(recipient: str, body: object) -> OutMessage:
    return OutMessage(orjson.dumps(body), recipient=recipient)


def to_group(group: str, body: object) -> OutMessage:
    return OutMessage(orjson.dumps(body), group=group)


async def inbox(store: Store, thread_id: str) -> list[tuple[str | None, object]]:
    return [(m.sender, orjson.loads(m.message)) for m in await store.load_inbox(thread_id)]


async def status_of(store: Store, thread_id: str) -> tuple[str, str | None]:
    run = await store.get_run(thread_id)
    assert run is not None
    return run.status, run.waiting_for


def rows_of(store: Store, thread_id: str | None = None) -> list[MailRow]:
    return [r for r in mailbox_rows(store.url) if thread_id is None or r.thread_id == thread_id]


async def park_for_mail(store: Store, run: RunRecord, step: int = 1) -> None:
    """Claims `run` and commits a step that parks it as an idle actor."""
    lease = await claim(store, run)
    await store.commit_step(commit(lease, step, "waiting", waiting_for="mail"))
    assert await status_of(store, run.thread_id) == ("waiting", "mail")


# -- messages commit with their step ----------------------------------------------------------


async def test_messages_of_a_step_are_delivered_when_it_commits(store: Store) -> None:
    a, b, c = await create(store), await create(store), await create(store)
    lease = await claim(store, a)
    assert await store.load_inbox(b.thread_id) == []
    await store.commit_step(commit(lease, 1, messages=[
        to(b.thread_id, {"n": 0}), to(c.thread_id, {"n": 0}), to(b.thread_id, {"n": 1}),
        to(b.thread_id, {"n": 2})]))
    assert await inbox(store, b.thread_id) == [(a.thread_id, {"n": n}) for n in range(3)]
    assert await inbox(store, c.thread_id) == [(a.thread_id, {"n": 0})]
    assert await store.inbox_depth(b.thread_id) == 3
    assert await store.inbox_depth(a.thread_id) == 0
    got = await store.load_inbox(b.thread_id)
    assert [m.id for m in got] == sorted(m.id for m in got)
    now = await store.now()
    assert all(abs(m.created_at - now) < 60 for m in got)


async def test_a_stale_epoch_commit_sends_no_message(store: Store) -> None:
    a, b = await create(store), await create(store)
    old = await claim(store, a, "w1", SHORT)
    await store.commit_step(commit(old, 1, groups=[("g", "member")]))
    await store.commit_step(commit(await claim(store, b), 1, "waiting", waiting_for="mail",
                                   groups=[("g", "member")]))
    await asyncio.sleep(WAIT)
    new = await claim(store, a, "w2")
    with pytest.raises(LeaseLost):
        await store.commit_step(commit(old, 2, "completed", messages=[
            to(b.thread_id, "leaked"), to_group("g", "leaked too")]))
    with pytest.raises(LeaseLost):
        await store.commit_step(commit(old, 2, "waiting", waiting_for="mail",
                                       messages=[to(b.thread_id, "leaked")]))
    assert rows_of(store) == []
    assert await store.inbox_depth(b.thread_id) == 0
    assert await status_of(store, b.thread_id) == ("waiting", "mail")  # nobody woke it
    assert [c.step for c in await store.checkpoints(a.thread_id)] == [1]
    # The holder's commit of the same step sends them.
    await store.commit_step(commit(new, 2, messages=[to(b.thread_id, "sent")]))
    assert await inbox(store, b.thread_id) == [(a.thread_id, "sent")]


async def test_a_cancelled_holder_sends_no_message(store: Store) -> None:
    a, b = await create(store), await create(store)
    lease = await claim(store, a)
    await store.cancel_run(a.thread_id)
    with pytest.raises(LeaseLost):
        await store.commit_step(commit(lease, 1, messages=[to(b.thread_id, "x")]))
    assert rows_of(store) == []


async def test_a_stale_epoch_commit_consumes_nothing(store: Store) -> None:
    a = await create(store)
    ids = [await store.send_message(a.thread_id, orjson.dumps(i)) for i in range(2)]
    old = await claim(store, a, "w1", SHORT)
    await asyncio.sleep(WAIT)
    new = await claim(store, a, "w2")
    with pytest.raises(LeaseLost):
        await store.commit_step(commit(old, 1, "waiting", waiting_for="mail", consumed=ids))
    assert [r.consumed_step for r in rows_of(store, a.thread_id)] == [None, None]
    assert [m.id for m in await store.load_inbox(a.thread_id)] == ids
    await store.commit_step(commit(new, 1, "waiting", waiting_for="mail", consumed=ids))
    assert [r.consumed_step for r in rows_of(store, a.thread_id)] == [1, 1]


async def test_a_message_to_an_unknown_thread_fails_the_whole_commit(store: Store) -> None:
    a, b = await create(store), await create(store)
    lease = await claim(store, a)
    mid = await store.send_message(a.thread_id, b'"in"')
    with pytest.raises(RunNotFound, match="nope"):
        await store.commit_step(commit(lease, 1, messages=[
            to(b.thread_id, "ok"), to("nope", "lost")], consumed=[mid],
            groups=[("g", "member")], children=[new_run(parent=a.thread_id)]))
    assert [r.id for r in rows_of(store)] == [mid]
    assert rows_of(store)[0].consumed_step is None
    assert await store.checkpoints(a.thread_id) == []
    assert await store.group_members("g") == []
    assert {r.thread_id for r in await store.list_runs(limit=10)} == {a.thread_id, b.thread_id}
    # Nothing moved: the holder still holds the run and can commit the step.
    run = await store.get_run(a.thread_id)
    assert run is not None and run.status == "running" and run.epoch == lease.epoch
    await store.commit_step(commit(lease, 1, messages=[to(b.thread_id, "ok")]))
    assert await inbox(store, b.thread_id) == [(a.thread_id, "ok")]


# -- waking idle actors -----------------------------------------------------------------------


async def test_a_message_wakes_a_recipient_parked_for_mail(store: Store) -> None:
    a, b, bystander = await create(store), await create(store), await create(store)
    await park_for_mail(store, b)
    await park_for_mail(store, bystander)
    assert not await is_claimable(store, b)
    lease = await claim(store, a)
    store.work_available.clear()
    await store.commit_step(commit(lease, 1, messages=[to(b.thread_id, "hi")]))
    # Queued by the commit itself: no later write was needed.
    assert await status_of(store, b.thread_id) == ("queued", None)
    assert await status_of(store, bystander.thread_id) == ("waiting", "mail")
    await asyncio.wait_for(store.work_available.wait(), 5)
    assert await is_claimable(store, b)


async def test_a_message_does_not_wake_a_run_waiting_for_something_else(store: Store) -> None:
    a, b = await create(store), await create(store)
    lease_b = await claim(store, b)
    await store.commit_step(commit(lease_b, 1, "waiting", waiting_for="interrupt"))
    await store.send_message(b.thread_id, b"1")
    lease = await claim(store, a)
    await store.commit_step(commit(lease, 1, messages=[to(b.thread_id, 2)]))
    assert await status_of(store, b.thread_id) == ("waiting", "interrupt")
    assert await store.inbox_depth(b.thread_id) == 2


async def test_send_message_delivers_and_wakes(store: Store) -> None:
    b = await create(store)
    await park_for_mail(store, b)
    store.work_available.clear()
    first = await store.send_message(b.thread_id, orjson.dumps({"n": 1}), sender="outside")
    second = await store.send_message(b.thread_id, orjson.dumps({"n": 2}))
    assert second > first
    assert await status_of(store, b.thread_id) == ("queued", None)
    await asyncio.wait_for(store.work_available.wait(), 5)
    got = await store.load_inbox(b.thread_id)
    assert [(m.id, m.sender, orjson.loads(m.message)) for m in got] == [
        (first, "outside", {"n": 1}), (second, None, {"n": 2})]


async def test_send_message_to_an_unknown_thread_is_run_not_found(store: Store) -> None:
    await create(store)
    with pytest.raises(RunNotFound, match="nope"):
        await store.send_message("nope", b"1")
    assert rows_of(store) == []


# -- consuming ----------------------------------------------------------------------------


async def test_consumed_messages_are_marked_with_the_step(store: Store) -> None:
    b = await create(store)
    ids = [await store.send_message(b.thread_id, orjson.dumps(i)) for i in range(4)]
    lease = await claim(store, b)
    assert [m.id for m in await store.load_inbox(b.thread_id)] == ids
    await store.commit_step(commit(lease, 1, consumed=ids[:2]))
    await store.commit_step(commit(lease, 2, consumed=[ids[3]]))
    assert {r.id: r.consumed_step for r in rows_of(store, b.thread_id)} == {
        ids[0]: 1, ids[1]: 1, ids[2]: None, ids[3]: 2}
    assert [m.id for m in await store.load_inbox(b.thread_id)] == [ids[2]]
    assert await store.inbox_depth(b.thread_id) == 1
    # Consuming again never moves a message to another step.
    await store.commit_step(commit(lease, 3, consumed=ids))
    assert {r.id: r.consumed_step for r in rows_of(store, b.thread_id)} == {
        ids[0]: 1, ids[1]: 1, ids[2]: 3, ids[3]: 2}
    assert await store.load_inbox(b.thread_id) == []


async def test_a_step_consumes_only_its_own_runs_messages(store: Store) -> None:
    a, b = await create(store), await create(store)
    theirs = await store.send_message(b.thread_id, b"1")
    lease = await claim(store, a)
    await store.commit_step(commit(lease, 1, consumed=[theirs]))
    assert rows_of(store)[0].consumed_step is None
    assert await store.inbox_depth(b.thread_id) == 1


async def test_load_inbox_is_unconsumed_mail_oldest_first_up_to_a_limit(store: Store) -> None:
    s1, s2, b, other = [await create(store) for _ in range(4)]
    l1, l2 = await claim(store, s1), await claim(store, s2)
    sent: list[tuple[str, int]] = []
    for step in range(1, 4):
        await store.commit_step(commit(l1, step, messages=[
            to(b.thread_id, ["s1", step, i]) for i in range(2)] + [to(other.thread_id, "x")]))
        await store.commit_step(commit(l2, step, messages=[to(b.thread_id, ["s2", step, 0])]))
        await store.send_message(b.thread_id, orjson.dumps(["out", step, 0]))
        sent += [("s1", step), ("s1", step), ("s2", step), ("out", step)]
    got = await store.load_inbox(b.thread_id)
    assert [tuple(orjson.loads(m.message)[:2]) for m in got] == sent
    assert [m.id for m in got] == sorted(m.id for m in got)
    assert {m.sender for m in got} == {s1.thread_id, s2.thread_id, None}
    assert [m.id for m in await store.load_inbox(b.thread_id, limit=5)] == [
        m.id for m in got[:5]]
    lease = await claim(store, b)
    await store.commit_step(commit(lease, 1, consumed=[m.id for m in got[:5]]))
    assert [m.id for m in await store.load_inbox(b.thread_id)] == [m.id for m in got[5:]]
    assert await store.inbox_depth(b.thread_id) == len(got) - 5
    assert await store.inbox_depth(other.thread_id) == 3


async def test_load_inbox_of_an_unknown_or_empty_run_is_empty(store: Store) -> None:
    b = await create(store)
    assert await store.load_inbox(b.thread_id) == []
    assert await store.load_inbox("nope") == []
    assert await store.inbox_depth("nope") == 0


async def test_with_mail_names_the_runs_with_unconsumed_mail(store: Store) -> None:
    some, read, none = [await create(store) for _ in range(3)]
    await store.send_message(some.thread_id, b"1")
    mid = await store.send_message(read.thread_id, b"2")
    await store.commit_step(commit(await claim(store, read), 1, consumed=[mid]))
    ids = [some.thread_id, read.thread_id, none.thread_id, "nope"]
    assert await store.with_mail(ids) == {some.thread_id}
    assert await store.with_mail([]) == set()


# -- parking for mail -------------------------------------------------------------------------


async def test_parking_for_mail_while_mail_is_pending_leaves_the_run_queued(
    store: Store,
) -> None:
    b = await create(store)
    first = await store.send_message(b.thread_id, b"1")
    lease = await claim(store, b)
    # Mail that arrived after the batch was loaded: the actor must not sleep on it.
    await store.send_message(b.thread_id, b"2")
    await store.commit_step(commit(lease, 1, "waiting", waiting_for="mail", consumed=[first]))
    run = await store.get_run(b.thread_id)
    assert run is not None and run.status == "queued" and run.waiting_for is None
    assert run.lease_owner is None and run.step == 1
    assert await is_claimable(store, b)


async def test_parking_for_mail_with_everything_consumed_waits(store: Store) -> None:
    b = await create(store)
    ids = [await store.send_message(b.thread_id, b"1") for _ in range(2)]
    lease = await claim(store, b)
    await store.commit_step(commit(lease, 1, "waiting", waiting_for="mail", consumed=ids))
    run = await store.get_run(b.thread_id)
    assert run is not None and (run.status, run.waiting_for) == ("waiting", "mail")
    assert run.lease_owner is None
    assert not await is_claimable(store, b)


async def test_a_message_sent_to_oneself_while_parking_for_mail_wakes_oneself(
    store: Store,
) -> None:
    b = await create(store)
    lease = await claim(store, b)
    await store.commit_step(commit(lease, 1, "waiting", waiting_for="mail",
                                   messages=[to(b.thread_id, "note to self")]))
    assert await status_of(store, b.thread_id) == ("queued", None)
    assert await inbox(store, b.thread_id) == [(b.thread_id, "note to self")]


# -- groups -------------------------------------------------------------------------------


async def test_publish_reaches_every_member_but_the_sender(store: Store) -> None:
    admin, m1, m2, outsider, elsewhere = [await create(store) for _ in range(5)]
    leases = {r.thread_id: await claim(store, r) for r in (admin, m1, m2, elsewhere)}
    await store.commit_step(commit(leases[admin.thread_id], 1,
                                   groups=[("g", "admin"), (ADMIN_CHANNEL, "member")]))
    await store.commit_step(commit(leases[m1.thread_id], 1, groups=[("g", "member")]))
    await store.commit_step(commit(leases[m2.thread_id], 1, "waiting", waiting_for="mail",
                                   groups=[("g", "member")]))
    await store.commit_step(commit(leases[elsewhere.thread_id], 1, groups=[("h", "member")]))
    assert await store.group_members("g") == sorted([admin.thread_id, m1.thread_id,
                                                     m2.thread_id])
    await store.commit_step(commit(leases[admin.thread_id], 2,
                                   messages=[to_group("g", {"task": 1}),
                                             to_group("g", {"task": 2})]))
    for member in (m1, m2):
        assert await inbox(store, member.thread_id) == [
            (admin.thread_id, {"task": 1}), (admin.thread_id, {"task": 2})]
    assert await store.load_inbox(admin.thread_id) == []
    assert await store.load_inbox(outsider.thread_id) == []
    assert await store.load_inbox(elsewhere.thread_id) == []
    # The idle member was woken by the same commit.
    assert await status_of(store, m2.thread_id) == ("queued", None)
    # A member publishes too: the admin and the other member get it, not the sender.
    await store.commit_step(commit(leases[m1.thread_id], 2, messages=[to_group("g", "m1")]))
    assert (await inbox(store, admin.thread_id)) == [(m1.thread_id, "m1")]
    assert (await inbox(store, m2.thread_id))[-1] == (m1.thread_id, "m1")
    assert len(await store.load_inbox(m1.thread_id)) == 2


async def test_publish_to_an_empty_or_unknown_group_sends_nothing(store: Store) -> None:
    a = await create(store)
    lease = await claim(store, a)
    await store.commit_step(commit(lease, 1, groups=[("solo", "admin")]))
    await store.commit_step(commit(lease, 2, messages=[to_group("solo", 1),
                                                       to_group("nobody", 2)]))
    assert rows_of(store) == []
    assert [c.step for c in await store.checkpoints(a.thread_id)] == [1, 2]


async def test_admins_talk_across_groups_on_the_admin_channel(store: Store) -> None:
    a1, a2, a3, w1 = [await create(store) for _ in range(4)]
    leases = {r.thread_id: await claim(store, r) for r in (a1, a2, a3, w1)}
    for i, adm in enumerate((a1, a2, a3)):
        await store.commit_step(commit(leases[adm.thread_id], 1,
                                       groups=[(f"g{i}", "admin"), (ADMIN_CHANNEL, "member")]))
    await store.commit_step(commit(leases[w1.thread_id], 1, groups=[("g0", "member")]))
    assert await store.group_members(ADMIN_CHANNEL) == sorted(
        [a1.thread_id, a2.thread_id, a3.thread_id])
    await store.commit_step(commit(leases[a1.thread_id], 2,
                                   messages=[to_group(ADMIN_CHANNEL, "g0 done")]))
    assert await inbox(store, a2.thread_id) == [(a1.thread_id, "g0 done")]
    assert await inbox(store, a3.thread_id) == [(a1.thread_id, "g0 done")]
    assert await store.load_inbox(a1.thread_id) == []
    assert await store.load_inbox(w1.thread_id) == []


async def test_membership_is_durable_and_taken_once(store: Store) -> None:
    a = await create(store)
    lease = await claim(store, a)
    await store.commit_step(commit(lease, 1, groups=[("g", "member")]))
    await store.commit_step(commit(lease, 2, groups=[("g", "admin")]))
    assert await store.group_members("g") == [a.thread_id]
    # A stale holder joins nothing.
    with pytest.raises(LeaseLost):
        await store.commit_step(commit(Lease(a.thread_id, "w1", lease.epoch - 1), 3,
                                       groups=[("h", "member")]))
    assert await store.group_members("h") == []


# -- spawn / join ---------------------------------------------------------------------------


async def _children_of(store: Store, parent: RunRecord, n: int) -> tuple[Lease, list[NewRun]]:
    lease = await claim(store, parent)
    kids = [new_run(parent=parent.thread_id) for _ in range(n)]
    await store.commit_step(commit(lease, 1, children=kids))
    return lease, kids


async def _finish(store: Store, run: NewRun, how: str = "completed") -> None:
    lease = await claim(store, run)
    if how == "completed":
        await store.commit_step(commit(lease, 1, "completed"))
    else:
        await store.fail_step(lease, failures=1, wake_at=None, error=b'{"e": 1}', final=True)


async def test_park_in_join_with_every_child_finished_leaves_the_parent_queued(
    store: Store,
) -> None:
    parent = await create(store)
    lease, kids = await _children_of(store, parent, 3)
    await _finish(store, kids[0])
    await _finish(store, kids[1], "failed")
    await store.cancel_run(kids[2].thread_id)
    await store.park_run(lease, Park("join", 2, 0, children=[k.thread_id for k in kids]))
    run = await store.get_run(parent.thread_id)
    assert run is not None and run.status == "queued" and run.waiting_for is None
    assert run.lease_owner is None and run.step == 1
    assert await is_claimable(store, parent)


async def test_park_in_join_with_a_child_running_waits(store: Store) -> None:
    parent = await create(store)
    lease, kids = await _children_of(store, parent, 2)
    await _finish(store, kids[0])
    await claim(store, kids[1])
    await store.park_run(lease, Park("join", 2, 0, children=[k.thread_id for k in kids]))
    assert await status_of(store, parent.thread_id) == ("waiting", "join")
    assert not await is_claimable(store, parent)


async def test_park_in_join_spawns_its_children_atomically(store: Store) -> None:
    parent = await create(store)
    lease = await claim(store, parent)
    kids = [new_run(parent=parent.thread_id) for _ in range(2)]
    await store.park_run(lease, Park("join", 1, 0, children=[k.thread_id for k in kids],
                                     spawn=kids))
    assert await status_of(store, parent.thread_id) == ("waiting", "join")
    for kid in kids:
        row = await store.get_run(kid.thread_id)
        assert row is not None and row.status == "queued"
        assert row.parent_thread_id == parent.thread_id
    # A stale park spawns nothing and parks nothing.
    other = await create(store)
    old = await claim(store, other, "w1", SHORT)
    await asyncio.sleep(WAIT)
    await claim(store, other, "w2")
    ghost = new_run(parent=other.thread_id)
    with pytest.raises(LeaseLost):
        await store.park_run(old, Park("join", 1, 0, children=[ghost.thread_id],
                                       spawn=[ghost]))
    assert await store.get_run(ghost.thread_id) is None
    assert await status_of(store, other.thread_id) == ("running", None)


@pytest.mark.parametrize("how", ["completed", "failed", "cancelled"])
async def test_a_finishing_child_wakes_its_parent_parked_in_join(store: Store, how: str) -> None:
    parent = await create(store)
    lease, kids = await _children_of(store, parent, 2)
    await _finish(store, kids[0])
    await store.park_run(lease, Park("join", 2, 0, children=[k.thread_id for k in kids]))
    assert await status_of(store, parent.thread_id) == ("waiting", "join")
    await _end(store, kids[1], how)
    assert await status_of(store, parent.thread_id) == ("queued", None)
    assert await is_claimable(store, parent)


@pytest.mark.parametrize("how", ["completed", "failed", "cancelled"])
async def test_waking_a_parent_in_join_signals_work_available(store: Store, how: str) -> None:
    """The wake-up is a local write that makes a run claimable: this process's workers hear
    of it at once instead of at their next poll."""
    parent = await create(store)
    lease, (kid,) = await _children_of(store, parent, 1)
    kid_lease = await claim(store, kid) if how != "cancelled" else None
    await store.park_run(lease, Park("join", 2, 0, children=[kid.thread_id]))
    store.work_available.clear()
    if kid_lease is None:
        await store.cancel_run(kid.thread_id)
    elif how == "completed":
        await store.commit_step(commit(kid_lease, 1, "completed"))
    else:
        await store.fail_step(kid_lease, failures=1, wake_at=None, error=b"{}", final=True)
    assert await status_of(store, parent.thread_id) == ("queued", None)
    await asyncio.wait_for(store.work_available.wait(), 2)


async def _end(store: Store, run: NewRun, how: str) -> None:
    if how == "cancelled":
        await store.cancel_run(run.thread_id)
    else:
        await _finish(store, run, how)


async def test_a_finishing_child_does_not_wake_a_parent_parked_otherwise(store: Store) -> None:
    parent = await create(store)
    lease, kids = await _children_of(store, parent, 1)
    await store.commit_step(commit(lease, 2, "waiting", waiting_for="mail"))
    await _finish(store, kids[0])
    assert await status_of(store, parent.thread_id) == ("waiting", "mail")


async def test_a_finishing_child_wakes_the_parent_joining_before_the_child_ends(
    store: Store,
) -> None:
    """Park and finish race from two store instances: the parent ends up claimable either
    way (a park that misses the child's finish, and a finish that misses the park, would
    leave it waiting forever)."""
    other = make_store(store.url)
    await other.open()
    try:
        for _ in range(8):
            parent = await create(store)
            lease, (kid,) = await _children_of(store, parent, 1)
            kid_lease = await claim(store, kid)
            await asyncio.gather(
                store.park_run(lease, Park("join", 2, 0, children=[kid.thread_id])),
                other.commit_step(commit(kid_lease, 1, "completed")))
            assert await status_of(store, parent.thread_id) == ("queued", None)
    finally:
        await other.close()


# -- cancel cascades ------------------------------------------------------------------------


async def test_cancel_cascades_to_every_descendant_and_bumps_their_epochs(
    store: Store,
) -> None:
    root = await create(store)
    root_lease, (c1, c2, c3) = await _children_of(store, root, 3)
    c1_lease, (g1,) = await _children_of(store, await _rec(store, c1), 1)  # c1 is running
    await _finish(store, c3)
    g1_lease = await claim(store, g1)
    await store.park_run(root_lease, Park("join", 2, 0, children=[c1.thread_id, c2.thread_id]))
    before = {r.thread_id: r for r in await store.list_runs(limit=100)}
    unrelated = await create(store)
    cancelled = await store.cancel_run(root.thread_id)
    assert cancelled is not None and cancelled.status == "cancelled"
    after = {r.thread_id: r for r in await store.list_runs(limit=100)}
    for run in (root, c1, c2, g1):
        now = after[run.thread_id]
        assert now.status == "cancelled", now
        assert now.epoch > before[run.thread_id].epoch
        assert now.lease_owner is None and now.lease_expires_at is None
    assert after[c3.thread_id] == before[c3.thread_id]  # already finished: unchanged
    assert after[unrelated.thread_id].status == "queued"
    # The holders of the cancelled descendants can commit nothing more.
    for lease in (c1_lease, g1_lease):
        with pytest.raises(LeaseLost):
            await store.commit_step(commit(lease, 2, "completed"))
        with pytest.raises(LeaseLost):
            await store.record_call(lease, 2, 0, "x", b"1")
    assert await store.renew_leases("w1", LONG) == set()
    assert not await is_claimable(store, c2)


async def test_cancelling_a_child_leaves_its_parent_and_siblings(store: Store) -> None:
    root = await create(store)
    root_lease, (c1, c2) = await _children_of(store, root, 2)
    await store.cancel_run(c1.thread_id)
    assert await status_of(store, root.thread_id) == ("running", None)
    assert await status_of(store, c2.thread_id) == ("queued", None)
    await store.commit_step(commit(root_lease, 2))


async def _rec(store: Store, new: NewRun) -> RunRecord:
    run = await store.get_run(new.thread_id)
    assert run is not None
    return run


# -- what a run sent ----------------------------------------------------------------------------


async def test_sent_mail_lists_what_a_run_sent_newest_first(store: Store) -> None:
    a, b, c, d = [await create(store) for _ in range(4)]
    await store.commit_step(commit(await claim(store, b), 1, "waiting", waiting_for="mail",
                                   groups=[("team", "member")]))
    await store.commit_step(commit(await claim(store, c), 1, "waiting", waiting_for="mail",
                                   groups=[("team", "member")]))
    lease = await claim(store, a)
    await store.commit_step(commit(lease, 1, messages=[to(b.thread_id, {"n": 0}),
                                                       to(b.thread_id, {"n": 1})]))
    await store.commit_step(commit(lease, 2, messages=[to_group("team", "all")]))
    await store.send_message(b.thread_id, b'"from outside"', sender="ops")
    # Mail to a, and mail d sent, are not a's.
    await store.commit_step(commit(await claim(store, d), 1, messages=[to(a.thread_id, "hi")]))
    first = [m.id for m in await store.load_inbox(b.thread_id)][:1]
    await store.commit_step(commit(await claim(store, b), 2, "waiting", waiting_for="mail",
                                   consumed=first))
    sent = await store.sent_mail(a.thread_id)
    got = [(m.recipient, orjson.loads(m.message), m.consumed_step) for m in sent]
    # The group's two rows (one per member, in the store's order), then the older ones.
    assert sorted(got[:2]) == sorted([(b.thread_id, "all", None), (c.thread_id, "all", None)])
    assert got[2:] == [(b.thread_id, {"n": 1}, None), (b.thread_id, {"n": 0}, 2)]
    assert [m.id for m in sent] == sorted((m.id for m in sent), reverse=True)
    now = await store.now()
    assert all(abs(m.created_at - now) < 60 for m in sent)
    assert [m.id for m in await store.sent_mail(a.thread_id, limit=2)] == [m.id for m in sent[:2]]
    assert [orjson.loads(m.message) for m in await store.sent_mail("ops")] == ["from outside"]
    assert [m.recipient for m in await store.sent_mail(d.thread_id)] == [a.thread_id]
    assert await store.sent_mail(b.thread_id) == []
    assert await store.sent_mail("nobody") == []


# -- a claim's reads --------------------------------------------------------------------------


async def test_load_claimed_reads_what_each_runs_first_step_would(store: Store) -> None:
    """load_claimed gives each claimed run what load_checkpoints, load_journal of its next
    step and load_inbox give it on their own: a run that never ran (nothing but its mail), a
    run past a snapshot (the snapshot and the deltas after it), a run that journaled calls in
    a step it did not commit (that step's journal), a run with mail beyond the first step's
    limit of 1,000 messages, and a run without mail."""
    fresh, stepped, journaled, full, quiet = [await create(store) for _ in range(5)]
    lease = await claim(store, stepped)
    for step, kind in ((1, "d"), (2, "s"), (3, "d"), (4, "d")):
        await store.commit_step(dataclasses.replace(commit(lease, step), kind=kind))
    await store.release_runs([lease])
    lease = await claim(store, journaled)
    await store.commit_step(commit(lease, 1))
    for idx in range(3):
        await store.record_call(lease, 2, idx, f"f{idx}", orjson.dumps(idx), args=f"[{idx}]")
    await store.release_runs([lease])
    for run, n in ((fresh, 2), (stepped, 1), (full, 1003)):
        for i in range(n):
            await store.send_message(run.thread_id, orjson.dumps([run.thread_id, i]))
    runs = [fresh, stepped, journaled, full, quiet]
    claimed = await store.claim_runs("w2", V, [r.agent for r in runs], 10, LONG)
    assert {r.thread_id for r in claimed} == {r.thread_id for r in runs}
    got = await store.load_claimed(claimed)
    assert set(got) == {r.thread_id for r in runs}
    for rec in claimed:
        tid = rec.thread_id
        reads = got[tid]
        assert reads.checkpoints == (await store.load_checkpoints(tid) if rec.step else [])
        assert reads.journal == ([] if tid == fresh.thread_id
                                 else await store.load_journal(tid, rec.step + 1))
        assert reads.inbox == await store.load_inbox(tid)
    assert [c.step for c in got[stepped.thread_id].checkpoints] == [2, 3, 4]
    assert [j.name for j in got[journaled.thread_id].journal] == ["f0", "f1", "f2"]
    assert len(got[full.thread_id].inbox) == 1000
    assert got[quiet.thread_id].inbox == [] and got[fresh.thread_id].checkpoints == []
    assert len(got[fresh.thread_id].inbox) == 2
    assert await store.load_claimed([]) == {}
