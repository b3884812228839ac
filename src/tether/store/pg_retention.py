"""Postgres's part of retention: the Retention operations over the store's pool.

A prune batch is one transaction of its own (pipelined: the marking statement, which deletes
the run rows and writes their tombstones, then the other tables' deletes), holding only the
rows of the runs it removes, so workers' commits go on beside it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .audit import Audit
from .pg_conn import BEGIN, Conn, PgConnections
from .retention_types import PRUNE_TABLES, Candidates, Cutoffs, Pruned, Space, Tombstone

TABLES = tuple(t for t in PRUNE_TABLES if t != "runs_rows")
"""What goes with a batch's runs after prune_mark (which deletes the run rows themselves)."""


class PgRetention:
    def __init__(self, conns: PgConnections, queries: Mapping[str, bytes]) -> None:
        self._conns = conns
        self._q = queries

    async def _rows(self, name: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in await self._conns.read(self._q[name], dict(params))]

    async def take_lock(self, name: str, owner: str, ttl: float) -> bool:
        rows = await self._conns.fetchall(self._q["take_lock"],
                                          {"name": name, "owner": owner, "ttl": ttl})
        return bool(rows)

    async def drop_lock(self, name: str, owner: str) -> None:
        await self._conns.fetchall(self._q["drop_lock"], {"name": name, "owner": owner})

    async def prune_candidates(self, cutoffs: Cutoffs, after: Any, limit: int) -> Candidates:
        # In creation order (retention.sql says why); `after` is (created_at, thread_id).
        at, tid = after if after is not None else (float("-inf"), "")
        # A walk of run_keys_created, a batch of it, whatever the statistics (never analyzed,
        # the planner read and sorted every remaining run for each batch).
        rows = await self._conns.read_by_index(self._q["prune_candidates"], {
            **cutoffs.params(), "after_at": at, "after": tid, "horizon": cutoffs.horizon,
            "limit": limit})
        if not rows:
            return Candidates([], after)
        return Candidates([r[0] for r in rows], (float(rows[-1][1]), str(rows[-1][0])))

    async def running_now(self) -> bool:
        return bool((await self._rows("running_now", {}))[0][0])

    async def prune_estimate(self, cutoffs: Cutoffs) -> list[tuple[str, str, int, int]]:
        return [(str(s), str(a), int(n), int(b))
                for s, a, n, b in await self._rows("prune_estimate", cutoffs.params())]

    async def prune_runs(self, thread_ids: Sequence[str], cutoffs: Cutoffs,
                         audit: Audit | None = None) -> Pruned:
        q = self._q
        params = {**cutoffs.params(), "ids": list(thread_ids)}

        async def body(conn: Conn) -> Pruned:
            async with conn.pipeline():
                await conn.execute(BEGIN)
                cur = await conn.execute(q["prune_mark"], params)
            marked = [r[0] for r in await cur.fetchall()]
            rows = 0
            if marked:
                curs = []
                async with conn.pipeline():
                    for table in TABLES:
                        curs.append(await conn.execute(q[f"prune_{table}"], {"ids": marked}))
                rows = len(marked) + sum(max(0, c.rowcount) for c in curs)  # + run rows
                if audit is not None:
                    await conn.execute(q["insert_audit"], audit.counted(len(marked)).params())
            return Pruned(marked, rows)

        return await self._conns.transaction(body)

    async def get_tombstone(self, thread_id: str) -> Tombstone | None:
        rows = await self._rows("get_tombstone", {"thread_id": thread_id})
        return Tombstone(*rows[0]) if rows else None

    async def reclaim(self, pages: int) -> Space | None:
        return None  # autovacuum makes dead rows' space reusable (docs/retention.md: tuning)

    async def long_logs(self, keep: int, after: str, limit: int) -> list[str]:
        rows = await self._rows("long_logs", {"keep": keep, "after": after, "limit": limit})
        return [r[0] for r in rows]

    async def interrupt_steps(self, thread_id: str, before: int) -> list[int]:
        rows = await self._rows("interrupt_steps", {"thread_id": thread_id, "before": before})
        return sorted(int(r[0]) for r in rows if int(r[0]) > 0)

    async def compact_log(self, thread_id: str, snapshots: dict[int, bytes], before: int,
                          keep: Sequence[int]) -> int:
        q = self._q

        async def body(conn: Conn) -> int:
            async with conn.pipeline():
                await conn.execute(BEGIN)
                for step, data in snapshots.items():
                    await conn.execute(q["snapshot_checkpoint"],
                                       {"thread_id": thread_id, "step": step, "data": data})
                a = await conn.execute(q["compact_checkpoints"], {
                    "thread_id": thread_id, "before": before, "keep": list(keep)})
                b = await conn.execute(q["compact_journal"],
                                       {"thread_id": thread_id, "before": before})
            return max(0, a.rowcount) + max(0, b.rowcount)

        return await self._conns.transaction(body)

    async def compact_estimate(self, thread_id: str, before: int, keep: Sequence[int],
                               cutoffs: Cutoffs) -> int:
        rows = await self._rows("compact_estimate", {
            "thread_id": thread_id, "before": before, "keep": list(keep), **cutoffs.params()})
        return int(rows[0][0]) if rows else 0
