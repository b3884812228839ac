"""The Postgres store's writers (real Postgres): two connections share the group commit, so a
write stuck behind a row lock held elsewhere does not hold up the other runs' writes; a pool
too small for two keeps one writer and a connection for reads."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib

import orjson
import psycopg

from tether.store import pg_commit
from tether.store.base import JournalRecord, Lease, NewRun
from tether.store.postgres import PostgresStore

WORKER = "w1"


def _new(thread_id: str) -> NewRun:
    data = orjson.dumps({"q": thread_id})
    return NewRun(thread_id, "a", "v1", "start", data, hashlib.sha256(data).hexdigest())


async def _leased(store: PostgresStore, ids: list[str]) -> list[Lease]:
    made = await asyncio.gather(*(store.create_run(_new(t), lease=(WORKER, 60.0)) for t in ids))
    return [Lease(run.thread_id, WORKER, run.epoch) for run, _ in made]


async def _journal(store: PostgresStore, lease: Lease) -> None:
    await store.record_call(lease, 1, 0, "f", b'"ok"')


async def test_a_write_waiting_on_a_row_lock_does_not_hold_up_other_runs(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    await store.open()
    try:
        stuck, *others = await _leased(store, [f"r{i}" for i in range(6)])
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as locker:
            await locker.execute("BEGIN")
            await locker.execute("SELECT 1 FROM runs WHERE thread_id = %s FOR UPDATE",
                                 (stuck.thread_id,))
            blocked = asyncio.create_task(_journal(store, stuck))
            await asyncio.sleep(0.2)  # it holds a writer, waiting for the lock
            assert not blocked.done()
            # One at a time, then together: both go through the other writer.
            await asyncio.wait_for(_journal(store, others[0]), 10)
            await asyncio.wait_for(asyncio.gather(*(_journal(store, le) for le in others[1:])), 10)
            assert not blocked.done()
            await locker.execute("ROLLBACK")
        await asyncio.wait_for(blocked, 10)
        for lease in (stuck, *others):
            assert await store.load_journal(lease.thread_id, 1) == [JournalRecord(0, "f", b'"ok"')]
    finally:
        await store.close()


async def test_a_pool_of_two_keeps_one_writer_and_reads_still_run(pg_url: str) -> None:
    store = PostgresStore(pg_url + "?pool_max=2")
    await store.open()
    try:
        assert len(store._committer.writers) == 1
        stuck, other = await _leased(store, ["r1", "r2"])
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as locker:
            await locker.execute("BEGIN")
            await locker.execute("SELECT 1 FROM runs WHERE thread_id = %s FOR UPDATE",
                                 (stuck.thread_id,))
            blocked = asyncio.create_task(_journal(store, stuck))
            await asyncio.sleep(0.2)
            queued = asyncio.create_task(_journal(store, other))
            # The one writer is taken; reads have the other connection.
            run = await asyncio.wait_for(store.get_run(other.thread_id), 10)
            assert run is not None and run.thread_id == other.thread_id
            assert not blocked.done() and not queued.done()
            await locker.execute("ROLLBACK")
        await asyncio.wait_for(asyncio.gather(blocked, queued), 10)
        assert await store.load_journal(other.thread_id, 1) == [JournalRecord(0, "f", b'"ok"')]
    finally:
        await store.close()


async def test_queued_and_leased_starts_commit_together_and_queued_ones_are_announced(
        pg_url: str) -> None:
    """One group commit of starts mixing runs leased to a local worker, queued runs of two
    versions and a thread_id that exists: each comes back as create_run alone returns it, the
    queued ones are claimable by their version's workers, and each of those versions hears of
    work."""
    store = PostgresStore(pg_url)
    await store.open()
    try:
        await store.create_run(_new("old"))
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as listener:
            await listener.execute("LISTEN tether_work")
            queued = [dataclasses.replace(_new(f"q{i}"), version=f"v{2 + i % 2}")
                      for i in range(20)]
            made = await asyncio.gather(
                *(store.create_run(_new(f"l{i}"), lease=(WORKER, 60.0)) for i in range(20)),
                *(store.create_run(new) for new in queued),
                store.create_run(_new("old"), lease=(WORKER, 60.0)))
            leased, fresh, (again, created_again) = made[:20], made[20:40], made[40]
            assert all(created and run.status == "running" and run.lease_owner == WORKER
                       and run.epoch == 1 for run, created in leased)
            assert all(created and run.status == "queued" and run.lease_owner is None
                       and run.epoch == 0 and run.version == new.version
                       for (run, created), new in zip(fresh, queued, strict=True))
            assert (again.thread_id, again.status, created_again) == ("old", "queued", False)
            heard: set[str] = set()
            async with asyncio.timeout(10):
                async for note in listener.notifies():
                    heard.add(note.payload)
                    if {"v2", "v3"} <= heard:
                        break
        for version in ("v2", "v3"):
            claimed = await store.claim_runs("w2", version, ["a"], 100, 60.0)
            assert sorted(r.thread_id for r in claimed) == sorted(
                n.thread_id for n in queued if n.version == version)
    finally:
        await store.close()


class _Commits:
    """A CommitObserver: the writes of each group commit."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def committed(self, writes: int, seconds: float) -> None:
        self.sizes.append(writes)


async def test_a_burst_is_split_between_the_two_writers(pg_url: str) -> None:
    """A burst that two idle writers find queued goes as two group commits of half of it
    each, at the server together, not as one."""
    store = PostgresStore(pg_url)
    await store.open()
    commits = _Commits()
    store.observe_commits(commits)
    committer = store._committer
    try:
        n = 4 * pg_commit.SPLIT_MIN
        # The burst queues while both writers are taken (as behind two commits in flight),
        # then both are free at once: the first committer to run finds the other idle.
        for writer in committer.writers:
            writer.busy = True
        made = [asyncio.create_task(store.create_run(_new(f"b{i}"))) for i in range(n)]
        await asyncio.sleep(0.1)
        assert not any(t.done() for t in made)
        for writer in committer.writers:
            writer.busy = False
        committer._wake.set()
        assert all(created for _, created in await asyncio.gather(*made))
        assert sorted(commits.sizes) == [n // 2, n // 2], commits.sizes
        assert len(await store.list_runs(limit=n + 1)) == n
    finally:
        await store.close()
