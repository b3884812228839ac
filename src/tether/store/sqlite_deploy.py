"""The SQLite part of rainbow deploys: the worker registry and the weight table (the
Deployments protocol of store/base.py), on SQLiteStore's reader and writer."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import orjson

from ..errors import InvalidState
from .audit import Audit
from .base import RunRecord
from .deploy_types import DeploymentRecord, OpenRuns, WorkerBeat, WorkerRecord

Job = Callable[[sqlite3.Connection], Any]


class SQLiteDeployments:
    def __init__(self, queries: Mapping[str, str], read: Callable[[Job], Awaitable[Any]],
                 write: Callable[[Job], Awaitable[Any]], work_available: asyncio.Event) -> None:
        self._q = queries
        self._r = read
        self._w = write
        self._work_available = work_available

    async def _rows(self, name: str, params: Mapping[str, Any] | None = None) -> list[Any]:
        q = self._q[name]
        rows: list[Any] = await self._r(lambda c: c.execute(q, params or {}).fetchall())
        return rows

    async def beat_worker(self, beat: WorkerBeat) -> None:
        q, params = self._q, {f: getattr(beat, f) for f in WorkerBeat.__dataclass_fields__}

        def job(conn: sqlite3.Connection) -> None:
            conn.execute(q["prune_workers"])
            conn.execute(q["beat_worker"], params)

        await self._w(job)

    async def stop_worker(self, worker_id: str) -> None:
        q = self._q["stop_worker"]
        await self._w(lambda c: c.execute(q, {"id": worker_id}).close())

    async def list_workers(self) -> list[WorkerRecord]:
        return [WorkerRecord(*r) for r in await self._rows("list_workers")]

    async def list_deployments(self) -> list[DeploymentRecord]:
        return [DeploymentRecord(*r) for r in await self._rows("list_deployments")]

    async def set_weights(self, weights: Sequence[tuple[str, int]], *, replace: bool,
                          audit: Audit | None = None) -> None:
        q = self._q

        def job(conn: sqlite3.Connection) -> None:
            if replace:
                conn.execute(q["clear_weights"])
            conn.executemany(q["set_weight"], [{"version": v, "weight": w} for v, w in weights])
            if audit is not None:
                conn.execute(q["insert_audit"], audit.params())

        await self._w(job)

    async def open_runs(self, cap: int | None = None) -> list[OpenRuns]:
        if cap is None:
            return [OpenRuns(*r) for r in await self._rows("open_runs")]
        return [OpenRuns(*r) for r in await self._rows("open_runs_capped", {"cap": cap})]

    async def stranded_runs(self, version: str, before: float, cap: int | None = None) -> int:
        rows = await self._rows("stranded_runs", {"version": version, "before": before,
                                                  "cap": cap})
        return int(rows[0][0])

    async def retire_version(self, version: str, limit: int = 20,
                             audit: Audit | None = None) -> list[str]:
        q = self._q

        def job(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(q["open_run_ids"], {"version": version, "limit": limit})
            open_ids = [r[0] for r in rows.fetchall()]
            if not open_ids:
                conn.execute(q["retire_version"], {"version": version})
                if audit is not None:
                    conn.execute(q["insert_audit"], audit.params())
            return open_ids

        result: list[str] = await self._w(job)
        return result

    async def move_runs(
        self,
        from_version: str,
        to_version: str,
        thread_ids: Sequence[str] | None,
        decide: Callable[[list[RunRecord]], Sequence[str]],
        audit: Audit | None = None,
    ) -> list[RunRecord]:
        q = self._q

        def job(conn: sqlite3.Connection) -> tuple[list[RunRecord], int]:
            if thread_ids is None:
                rows = conn.execute(q["parked_runs"], {"version": from_version}).fetchall()
            else:
                ids = orjson.dumps(list(thread_ids)).decode()
                rows = conn.execute(q["runs_by_ids"], {"ids": ids}).fetchall()
            found = [RunRecord(*r) for r in rows]
            move = list(decide(found))
            if move:
                n = conn.execute(q["move_runs"], {
                    "ids": orjson.dumps(move).decode(), "from_version": from_version,
                    "to_version": to_version}).rowcount
                if n != len(move):  # a named run is not parked on from_version
                    raise InvalidState(
                        f"only {n} of the {len(move)} runs to move are parked on "
                        f"{from_version!r}; nothing moved")
                if audit is not None:
                    conn.execute(q["insert_audit"], audit.counted(len(move)).params())
            return found, len(move)

        found: list[RunRecord]
        found, moved = await self._w(job)
        if moved:
            self._work_available.set()
        return found
