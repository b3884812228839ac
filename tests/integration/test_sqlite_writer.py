"""The SQLite store's group commit, where it differs from Postgres: the fenced writes of a
batch run as one JSON-fed statement per kind on the commit thread."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import sqlite3
import threading
import time
from pathlib import Path

import orjson

from tether.errors import LeaseLost
from tether.store.base import JournalRecord, Lease, NewRun, StepCommit
from tether.store.sqlite import SQLiteStore


def _new(thread_id: str) -> NewRun:
    data = orjson.dumps({"q": thread_id})
    return NewRun(thread_id, "a", "v1", "start", data, hashlib.sha256(data).hexdigest())


async def _store(tmp_path: Path) -> SQLiteStore:
    store = SQLiteStore(f"sqlite:///{tmp_path / 't.db'}")
    await store.open(check_schema=False)
    await store.migrate()
    return store


def _commit(lease: Lease, step: int) -> StepCommit:
    return StepCommit(lease=lease, step=step, node="start", next_node="start", kind="d",
                      data=orjson.dumps({"s": {"n": step}}), attempt=1, started_at=1.5,
                      finished_at=2.5, status="running")


async def test_names_with_a_nul_character_are_kept_whole(tmp_path: Path) -> None:
    """SQLite's JSON functions cut strings at a NUL: rows holding one take the
    statement-per-row path, in the same group commit as the others."""
    store = await _store(tmp_path)
    try:
        ids = ["plain", "with\x00nul", "tail\x00"]
        made = await asyncio.gather(*(store.create_run(_new(t), lease=("w\x001", 30.0))
                                      for t in ids))
        leases = [Lease(r.thread_id, "w\x001", r.epoch) for r, _ in made]
        await asyncio.gather(*(store.record_call(le, 1, 0, "f\x00n", b'"ok"') for le in leases))
        await asyncio.gather(*(store.commit_step(_commit(le, 1)) for le in leases))
        for t, (run, created) in zip(ids, made, strict=True):
            assert created and run.thread_id == t
            row = await store.get_run(t)
            assert row is not None and (row.thread_id, row.step, row.lease_owner) == (t, 1, "w\x001")
            assert await store.load_journal(t, 1) == [JournalRecord(0, "f\x00n", b'"ok"')]
            (cp,) = await store.checkpoints(t)
            assert (cp.thread_id, cp.worker) == (t, "w\x001")
    finally:
        await store.close()


async def test_close_commits_the_writes_in_flight_and_queued(tmp_path: Path) -> None:
    """close() waits for the group commit on the commit thread, then commits what queued
    behind it: every write's caller gets its outcome and the rows are there on reopening."""
    store = await _store(tmp_path)
    made = await asyncio.gather(*(store.create_run(_new(f"r{i}"), lease=("w1", 30.0))
                                  for i in range(50)))
    leases = [Lease(r.thread_id, "w1", r.epoch) for r, _ in made]
    first = [asyncio.ensure_future(store.record_call(le, 1, 0, "f", b"1")) for le in leases]
    await asyncio.sleep(0)  # the first group commit is handed to the commit thread
    second = [asyncio.ensure_future(store.commit_step(_commit(le, 1))) for le in leases]
    await store.close()
    await asyncio.gather(*first, *second)
    again = await _store(tmp_path)
    try:
        for le in leases:
            assert len(await again.load_journal(le.thread_id, 1)) == 1
            assert [cp.step for cp in await again.checkpoints(le.thread_id)] == [1]
    finally:
        await again.close()


async def _tick(ticks: list[float]) -> None:
    while True:
        ticks.append(time.perf_counter())
        await asyncio.sleep(0.005)


async def test_another_connections_write_lock_does_not_stall_the_event_loop(
        tmp_path: Path) -> None:
    """While another connection (another process, say) holds the write lock, writes wait
    for it on the commit thread: the event loop keeps running, and the writes (one alone,
    then a group commit's worth) commit once the lock is released."""
    store = await _store(tmp_path)
    other = sqlite3.connect(tmp_path / "t.db", isolation_level=None, check_same_thread=False)
    try:
        for writes in (1, 64):
            other.execute("BEGIN IMMEDIATE")
            threading.Timer(0.5, other.execute, ("COMMIT",)).start()
            ticks: list[float] = []
            ticker = asyncio.create_task(_tick(ticks))
            made = await asyncio.wait_for(asyncio.gather(*(
                store.create_run(_new(f"w{writes}-{i}")) for i in range(writes))), 10)
            ticker.cancel()
            assert all(created for _, created in made)
            assert ticks[-1] - ticks[0] >= 0.4  # the writes waited for the lock...
            gaps = [b - a for a, b in itertools.pairwise(ticks)]
            assert max(gaps) < 0.2, max(gaps)  # ...and the loop ran meanwhile
        assert len(await store.list_runs(limit=100)) == 65
    finally:
        other.close()
        await store.close()


async def test_single_writes_on_the_commit_thread_go_as_plain_statements(tmp_path: Path) -> None:
    """On a disk whose COMMIT is slow, even a group commit of one write goes to the commit
    thread; a kind with one write there runs its plain statement (no JSON rows). Its fence
    holds as the batched form's: a stale epoch gets LeaseLost and writes nothing, a start
    whose thread_id exists is settled on the loop thread, and the others in the batch stand."""
    store = await _store(tmp_path)
    try:
        opened = store._conns._open
        assert opened is not None
        statements: list[str] = []
        opened.write.set_trace_callback(statements.append)
        opened.commit_s = 1.0  # as measured on a slow disk: every group commit to the thread
        (run, created), = [await store.create_run(_new("one"), lease=("w1", 30.0))]
        assert created
        lease = Lease(run.thread_id, "w1", run.epoch)
        opened.commit_s = 1.0
        await store.commit_step(_commit(lease, 1))
        assert [cp.step for cp in await store.checkpoints("one")] == [1]
        assert not any("json_each" in s for s in statements), statements
        stale = Lease(run.thread_id, "w1", run.epoch + 1)
        opened.commit_s = 1.0
        try:
            await store.commit_step(_commit(stale, 2))
        except LeaseLost:
            pass
        else:
            raise AssertionError("a commit under a stale epoch was taken")
        opened.commit_s = 1.0
        again, created_again = await store.create_run(_new("one"), lease=("w1", 30.0))
        assert not created_again and again.thread_id == "one"
        opened.commit_s = 1.0
        await store.commit_step(_commit(lease, 2))
        assert [cp.step for cp in await store.checkpoints("one")] == [1, 2]
        row = await store.get_run("one")
        assert row is not None and row.step == 2
    finally:
        await store.close()


async def test_a_step_commit_writes_the_run_row_once(tmp_path: Path) -> None:
    """A step commit that keeps the run running (one that joins a group: not the hot path's
    advance) leaves status out of its UPDATE; one that queues the run sets status and idle_at
    in the same statement. Either way one UPDATE of runs, no trigger (a trigger's statement
    shows as one more traced UPDATE)."""
    store = await _store(tmp_path)
    try:
        opened = store._conns._open
        assert opened is not None
        (run, _), = [await store.create_run(_new("g1"), lease=("w1", 30.0))]
        lease = Lease(run.thread_id, "w1", run.epoch)
        statements: list[str] = []
        opened.write.set_trace_callback(statements.append)
        await store.commit_step(StepCommit(
            lease=lease, step=1, node="start", next_node="start", kind="d", data=b"{}",
            attempt=1, started_at=1.5, finished_at=2.5, status="running",
            groups=(("g", "member"),)))
        updates = [s for s in statements if "UPDATE runs" in s]
        assert len(updates) == 1 and "status =" not in updates[0].split("WHERE")[0], updates
        statements.clear()
        await store.commit_step(StepCommit(
            lease=lease, step=2, node="start", next_node="start", kind="d", data=b"{}",
            attempt=1, started_at=1.5, finished_at=2.5, status="queued",
            groups=(("g", "member"),)))
        updates = [s for s in statements if "UPDATE runs" in s]
        assert len(updates) == 1 and "idle_at =" in updates[0], updates
        opened.write.set_trace_callback(None)
        row = opened.read.execute("SELECT status, idle_at, updated_at FROM runs "
                                  "WHERE thread_id = 'g1'").fetchone()
        assert row[0] == "queued" and row[1] == row[2]
    finally:
        await store.close()


async def test_queued_starts_are_batched_and_read_back_as_they_were_returned(
        tmp_path: Path) -> None:
    """Runs started with no worker at hand are inserted together, one set-based statement per
    group commit, their records built in Python: each record is what the row holds, a start
    again finds the run, and every run is due at once (created_at on SQLite's own clock)."""
    store = await _store(tmp_path)
    try:
        made = await asyncio.gather(*(store.create_run(_new(f"q{i}")) for i in range(100)))
        for run, created in made:
            assert created and run.status == "queued" and run.epoch == 0
            assert await store.get_run(run.thread_id) == run
        again, created = await store.create_run(_new("q0"))
        assert not created and again == made[0][0]
        claimed = await store.claim_runs("w1", "v1", ["a"], 1000, 30.0)
        assert sorted(r.thread_id for r in claimed) == sorted(r.thread_id for r, _ in made)
    finally:
        await store.close()
