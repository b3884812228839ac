"""Stores of one process on one SQLite file share its connections (sqlite_io): their writes
make up one group commit instead of taking the write lock in turn, and a run one store queues
wakes the workers of the others at once (two runtime versions in one worker process)."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import orjson

from tether.store.base import NewRun
from tether.store.sqlite import SQLiteStore


class _Commits:
    def __init__(self) -> None:
        self.writes: list[int] = []

    def committed(self, writes: int, seconds: float) -> None:
        self.writes.append(writes)


def _new(thread_id: str, version: str = "v1") -> NewRun:
    data = orjson.dumps({"q": thread_id})
    return NewRun(thread_id, "a", version, "start", data, hashlib.sha256(data).hexdigest())


async def _open(url: str, **kw: str) -> SQLiteStore:
    store = SQLiteStore(url, **kw)  # type: ignore[arg-type]
    await store.open(check_schema=False)
    await store.migrate()
    return store


async def test_stores_on_one_file_commit_together_and_wake_each_other(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    one, two = await _open(url), await _open(url)
    seen = [_Commits(), _Commits()]
    one.observe_commits(seen[0])
    two.observe_commits(seen[1])
    try:
        # Writes of both stores submitted together: one transaction, seen by both observers.
        await asyncio.gather(one.create_run(_new("a1"), lease=("w1", 30.0)),
                             two.create_run(_new("b1", "v2"), lease=("w2", 30.0)))
        assert seen[0].writes == seen[1].writes == [2]
        # A run the first store queues for the second's version wakes the second's workers.
        two.work_available.clear()
        await one.create_run(_new("q1", "v2"))
        assert two.work_available.is_set()
        # The first store's close leaves the second working on the same connections.
        one.work_available.clear()
        await one.close()
        await two.create_run(_new("q2"))
        assert not one.work_available.is_set()  # no longer a peer
        assert {r.thread_id for r in await two.list_runs(limit=10)} == {"a1", "b1", "q1", "q2"}
    finally:
        await one.close()
        await two.close()
    again = await _open(url)
    try:
        assert len(await again.list_runs(limit=10)) == 4
    finally:
        await again.close()


async def test_stores_with_other_settings_or_files_keep_their_own(tmp_path: Path) -> None:
    """Another synchronous mode, or another file, is not shared: each commits on its own."""
    url = f"sqlite:///{tmp_path / 't.db'}"
    full, normal = await _open(url), await _open(url, synchronous="NORMAL")
    other = await _open(f"sqlite:///{tmp_path / 'u.db'}")
    seen = [_Commits(), _Commits(), _Commits()]
    for store, commits in zip((full, normal, other), seen, strict=True):
        store.observe_commits(commits)
    try:
        await asyncio.gather(full.create_run(_new("f1")), normal.create_run(_new("n1")),
                             other.create_run(_new("o1")))
        assert [c.writes for c in seen] == [[1], [1], [1]]
        normal.work_available.clear()
        other.work_available.clear()
        await full.create_run(_new("f2"))
        assert not normal.work_available.is_set() and not other.work_available.is_set()
    finally:
        for store in (full, normal, other):
            await store.close()
