"""An answer given in a process whose worker has a free slot hands the run to that worker:
the answer's own statement leases the run (running, epoch and attempt bumped, as a claim
would), and no claim takes it. A run of another version, or answered while every slot is
taken, is queued for a claim as before. Real databases, real in-process workers; every run
ends with its answer."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from apps import inprocess
from apps.inprocess import asker, eventually
from tether import Agent, Command, Context, Runtime, finish
from tether.store.base import RunRecord, Store

WAIT = 30.0

holder = Agent("holder")
RELEASE: dict[str, asyncio.Event] = {}


@holder.node(start=True)
async def hold(state: dict[str, Any], ctx: Context) -> Command:
    await RELEASE["holder"].wait()  # takes the worker's one slot until the test lets go
    return finish({"held": True})


@pytest.fixture
def claims(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The thread_ids every store's claim_runs took, in order."""
    took: list[str] = []

    def spy(cls: type[Store]) -> None:
        claim = cls.claim_runs

        async def claim_runs(self: Store, *args: Any, **kwargs: Any) -> list[RunRecord]:
            runs = await claim(self, *args, **kwargs)
            took.extend(r.thread_id for r in runs)
            return runs

        monkeypatch.setattr(cls, "claim_runs", claim_runs)

    from tether.store.postgres import PostgresStore
    from tether.store.sqlite import SQLiteStore
    spy(PostgresStore)
    spy(SQLiteStore)
    yield took


async def _waiting(rt: Runtime, *ids: str) -> None:
    async def check() -> bool:
        return [str((await rt.peek(t)).status) for t in ids] == ["waiting"] * len(ids)

    await eventually(check, "the runs wait for input", timeout=WAIT)


async def test_an_answer_hands_the_run_to_the_worker_of_this_process(
        db_url: str, claims: list[str]) -> None:
    rt = inprocess.make_runtime(db_url, asker, poll_interval=0.02)
    async with inprocess.working(rt, concurrency=50):
        ids = [(await rt.start("asker", {"i": i})).thread_id for i in range(20)]
        await _waiting(rt, *ids)
        before = {t: await rt.store.get_run(t) for t in ids}
        claims.clear()
        answered = await asyncio.gather(*(rt.resume(t, {"ok": i}) for i, t in enumerate(ids)))
        assert [a.thread_id for a in answered] == ids
        done = await asyncio.gather(*(rt.wait(t, timeout=WAIT) for t in ids))
        assert [d.state["answer"] for d in done] == [{"ok": i} for i in range(len(ids))]
        (worker,) = rt.local_workers
        for t in ids:
            run, was = await rt.store.get_run(t), before[t]
            assert run is not None and was is not None
            assert run.epoch == was.epoch + 1  # leased once, by the answer
            steps = await rt.store.checkpoints(t)
            assert steps[-1].worker == worker.id
    assert not set(claims) & set(ids), "a claim took a run that was handed over"


async def test_a_run_of_another_version_is_queued_for_its_own_workers(
        db_url: str, claims: list[str]) -> None:
    v1 = inprocess.make_runtime(db_url, asker, poll_interval=0.02)
    async with inprocess.working(v1, close=False):
        tid = (await v1.start("asker", {"i": 1})).thread_id
        await _waiting(v1, tid)
    claims.clear()
    v2 = Runtime(db_url, agents=[asker], version="v2", poll_interval=0.02)
    async with inprocess.working(v2):
        await v2.resume(tid, "from v2")
        await asyncio.sleep(0.2)  # v2's worker would have taken it by now
        run = await v2.store.get_run(tid)
        assert run is not None and (run.status, run.version, run.lease_owner) == (
            "queued", "v1", None)
    async with inprocess.working(v1):
        assert (await v1.wait(tid, timeout=WAIT)).state["answer"] == "from v2"
    assert claims == [tid]  # by v1's worker


async def test_an_answer_with_every_slot_taken_is_queued(
        db_url: str, claims: list[str]) -> None:
    RELEASE["holder"] = asyncio.Event()
    rt = inprocess.make_runtime(db_url, asker, holder, poll_interval=0.02)
    async with inprocess.working(rt, concurrency=1):
        tid = (await rt.start("asker", {"i": 1})).thread_id
        await _waiting(rt, tid)
        held = (await rt.start("holder", {})).thread_id
        await eventually(lambda: _status_is(rt, held, "running"), "the slot is taken",
                         timeout=WAIT)
        claims.clear()
        await rt.resume(tid, "later")
        assert str((await rt.peek(tid)).status) == "queued"
        RELEASE["holder"].set()
        assert (await rt.wait(tid, timeout=WAIT)).state["answer"] == "later"
        assert (await rt.wait(held, timeout=WAIT)).state["held"] is True
    assert claims == [tid]


async def _status_is(rt: Runtime, thread_id: str, status: str) -> bool:
    return str((await rt.peek(thread_id)).status) == status
