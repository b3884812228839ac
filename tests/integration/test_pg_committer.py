"""The Postgres writer's commit thread (real Postgres): writes that queue behind a busy writer
are group-committed on a thread with a connection of its own; when that connection dies, the
batch on it fails as unavailable (its outcome is unknown) and the next batch connects again."""

from __future__ import annotations

import asyncio
import hashlib

import orjson
import psycopg

from tether.errors import StoreUnavailable
from tether.store.base import JournalRecord, Lease, NewRun
from tether.store.postgres import PostgresStore


def _new(thread_id: str) -> NewRun:
    data = orjson.dumps({"q": thread_id})
    return NewRun(thread_id, "a", "v1", "start", data, hashlib.sha256(data).hexdigest())


async def _kill_committer(url: str) -> int:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
        cur = await admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = 'tether-committer'")
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])


async def test_a_burst_is_committed_on_the_thread(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    await store.open()
    try:
        made = await asyncio.gather(*(store.create_run(_new(f"r{i}"), lease=("w1", 30.0))
                                      for i in range(200)))
        assert all(created for _, created in made)
        stats = store.statistics()
        assert stats["batches"] >= 1 and stats["batched_writes"] >= 100
        for run, _ in made:
            assert await store.get_run(run.thread_id) == run
    finally:
        await store.close()


async def test_a_lost_commit_connection_fails_its_batch_and_is_replaced(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    await store.open()
    try:
        made = await asyncio.gather(*(store.create_run(_new(f"r{i}"), lease=("w1", 30.0))
                                      for i in range(50)))
        leases = [Lease(r.thread_id, "w1", r.epoch) for r, _ in made]
        assert await _kill_committer(pg_url) == 1

        first = await asyncio.gather(*(store.record_call(le, 1, 0, "f", b"1") for le in leases),
                                     return_exceptions=True)
        failed = [o for o in first if o is not None]
        assert failed and all(isinstance(o, StoreUnavailable) for o in failed), failed
        assert "127.0.0.1" in str(failed[0]) or "localhost" in str(failed[0])

        second = await asyncio.gather(*(store.record_call(le, 1, 1, "g", b"2") for le in leases))
        assert second == [None] * len(leases)
        for le, outcome in zip(leases, first, strict=True):
            journal = await store.load_journal(le.thread_id, 1)
            # A failed write's outcome is unknown to its caller; here the connection died
            # before the batch was sent, so nothing of it was written.
            assert journal == ([JournalRecord(0, "f", b"1")] if outcome is None else []) + [
                JournalRecord(1, "g", b"2")]
    finally:
        await store.close()
