"""SQLite's part of retention: the Retention operations over the store's connections.

Reads run on a reader connection; each write is one job of the store's group commit, so a
prune batch shares a transaction (and its fsync) with the steps committed meanwhile and is
all or nothing with them.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import orjson

from .audit import Audit
from .retention_types import PRUNE_TABLES, Candidates, Cutoffs, Pruned, Space, Tombstone

Job = Callable[[sqlite3.Connection], Any]
_INCREMENTAL = 2  # PRAGMA auto_vacuum's value for incremental mode


class SQLiteRetention:
    def __init__(self, queries: Mapping[str, str], read: Callable[[Job], Awaitable[Any]],
                 write: Callable[[Job], Awaitable[Any]]) -> None:
        self._q = queries
        self._read = read
        self._write = write

    async def _rows(self, name: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        q = self._q[name]
        return [tuple(r) for r in await self._read(lambda c: c.execute(q, params).fetchall())]

    async def take_lock(self, name: str, owner: str, ttl: float) -> bool:
        q = self._q["take_lock"]

        def job(c: sqlite3.Connection) -> bool:
            return c.execute(q, {"name": name, "owner": owner, "ttl": ttl}).fetchone() is not None

        return bool(await self._write(job))

    async def drop_lock(self, name: str, owner: str) -> None:
        q = self._q["drop_lock"]
        await self._write(lambda c: c.execute(q, {"name": name, "owner": owner}).close())

    async def prune_candidates(self, cutoffs: Cutoffs, after: Any, limit: int) -> Candidates:
        # In thread_id order: checkpoints and journal are WITHOUT ROWID tables, stored in
        # their primary key's order, so a batch's deletes fall on adjacent pages.
        rows = await self._rows("prune_candidates",
                                {**cutoffs.params(), "after": after or "", "limit": limit})
        ids = [r[0] for r in rows]
        return Candidates(ids, ids[-1] if ids else after)

    async def running_now(self) -> bool:
        return bool((await self._rows("running_now", {}))[0][0])

    async def prune_estimate(self, cutoffs: Cutoffs) -> list[tuple[str, str, int, int]]:
        return [(str(s), str(a), int(n), int(b))
                for s, a, n, b in await self._rows("prune_estimate", cutoffs.params())]

    async def prune_runs(self, thread_ids: Sequence[str], cutoffs: Cutoffs,
                         audit: Audit | None = None) -> Pruned:
        q = self._q
        params = {**cutoffs.params(), "ids": orjson.dumps(list(thread_ids)).decode()}

        def job(c: sqlite3.Connection) -> Pruned:
            marked = [r[0] for r in c.execute(q["prune_mark"], params).fetchall()]
            rows = 0
            if marked:
                ids = {"ids": orjson.dumps(marked).decode()}
                for table in PRUNE_TABLES:
                    rows += c.execute(q[f"prune_{table}"], ids).rowcount
                if audit is not None:
                    c.execute(q["insert_audit"], audit.counted(len(marked)).params())
            return Pruned(marked, rows)

        result: Pruned = await self._write(job)
        return result

    async def get_tombstone(self, thread_id: str) -> Tombstone | None:
        rows = await self._rows("get_tombstone", {"thread_id": thread_id})
        return Tombstone(*rows[0]) if rows else None

    async def reclaim(self, pages: int) -> Space:
        q = self._q

        def job(c: sqlite3.Connection) -> Space:
            free, size, mode = c.execute(q["free_pages"]).fetchone()
            if mode != _INCREMENTAL or not free:
                return Space(0, free * size, mode == _INCREMENTAL)
            # One page per statement: the sqlite3 module steps a statement without result
            # columns once, and incremental_vacuum(N) gives one page back per step.
            for _ in range(min(pages, free)):
                c.execute(q["incremental_vacuum"]).fetchall()
            left = c.execute(q["free_pages"]).fetchone()[0]
            return Space((free - left) * size, left * size, True)

        space: Space = await self._write(job)
        return space

    async def long_logs(self, keep: int, after: str, limit: int) -> list[str]:
        rows = await self._rows("long_logs", {"keep": keep, "after": after, "limit": limit})
        return [r[0] for r in rows]

    async def interrupt_steps(self, thread_id: str, before: int) -> list[int]:
        rows = await self._rows("interrupt_steps", {"thread_id": thread_id, "before": before})
        return sorted(int(r[0]) for r in rows if int(r[0]) > 0)

    async def compact_log(self, thread_id: str, snapshots: dict[int, bytes], before: int,
                          keep: Sequence[int]) -> int:
        q = self._q
        keep_json = orjson.dumps(list(keep)).decode()

        def job(c: sqlite3.Connection) -> int:
            for step, data in snapshots.items():
                c.execute(q["snapshot_checkpoint"],
                          {"thread_id": thread_id, "step": step, "data": data})
            params = {"thread_id": thread_id, "before": before, "keep": keep_json}
            removed = c.execute(q["compact_checkpoints"], params).rowcount
            return removed + c.execute(q["compact_journal"],
                                       {"thread_id": thread_id, "before": before}).rowcount

        removed: int = await self._write(job)
        return removed

    async def compact_estimate(self, thread_id: str, before: int, keep: Sequence[int],
                               cutoffs: Cutoffs) -> int:
        rows = await self._rows("compact_estimate", {
            "thread_id": thread_id, "before": before, "keep": orjson.dumps(list(keep)).decode(),
            **cutoffs.params()})
        return int(rows[0][0]) if rows else 0
