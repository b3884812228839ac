"""The Postgres part of rainbow deploys: the worker registry and the weight table (the
Deployments protocol of store/base.py), on PostgresStore's connections."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from ..errors import InvalidState
from .audit import Audit
from .base import RunRecord
from .deploy_types import DeploymentRecord, OpenRuns, WorkerBeat, WorkerRecord
from .pg_conn import BEGIN, Conn, PgConnections


class PgDeployments:
    def __init__(self, conns: PgConnections, queries: Mapping[str, bytes]) -> None:
        self._conns = conns
        self._q = queries

    async def beat_worker(self, beat: WorkerBeat) -> None:
        params = {f: getattr(beat, f) for f in WorkerBeat.__dataclass_fields__}
        await self._conns.fetchall(self._q["beat_worker"], params, idempotent=True)

    async def stop_worker(self, worker_id: str) -> None:
        await self._conns.fetchall(self._q["stop_worker"], {"id": worker_id}, idempotent=True)

    async def list_workers(self) -> list[WorkerRecord]:
        return [WorkerRecord(*r) for r in await self._conns.read(self._q["list_workers"])]

    async def list_deployments(self) -> list[DeploymentRecord]:
        return [DeploymentRecord(*r) for r in await self._conns.read(self._q["list_deployments"])]

    async def set_weights(self, weights: Sequence[tuple[str, int]], *, replace: bool,
                          audit: Audit | None = None) -> None:
        q = self._q

        async def body(conn: Conn) -> None:
            async with conn.pipeline():
                await conn.execute(BEGIN)
                await conn.execute(q["lock_deployments"])
                if replace:
                    await conn.execute(q["clear_weights"])
                for version, weight in weights:
                    await conn.execute(q["set_weight"], {"version": version, "weight": weight})
                if audit is not None:
                    await conn.execute(q["insert_audit"], audit.params())

        await self._conns.transaction(body)

    async def open_runs(self, cap: int | None = None) -> list[OpenRuns]:
        if cap is None:
            return [OpenRuns(*r) for r in await self._conns.read(self._q["open_runs"])]
        versions = [r[0] for r in await self._conns.read(self._q["open_versions"])]
        if not versions:
            return []
        rows = await self._conns.read_by_index(self._q["open_runs_capped"],  # no JIT, no sort
                                               {"cap": cap, "versions": versions})
        return [OpenRuns(*r) for r in rows if r[2]]

    async def stranded_runs(self, version: str, before: float, cap: int | None = None) -> int:
        rows = await self._conns.read_by_index(  # along runs_open, whatever the statistics
            self._q["stranded_runs"], {"version": version, "before": before, "cap": cap})
        row = rows[0] if rows else None
        return int(row[0]) if row is not None else 0

    async def retire_version(self, version: str, limit: int = 20,
                             audit: Audit | None = None) -> list[str]:
        q = self._q

        async def body(conn: Conn) -> list[str]:
            async with conn.pipeline():
                await conn.execute(BEGIN)
                await conn.execute(q["lock_deployments"])
                cur = await conn.execute(q["open_run_ids"], {"version": version, "limit": limit})
            open_ids = [r[0] for r in await cur.fetchall()]
            if not open_ids:
                await conn.execute(q["retire_version"], {"version": version})
                if audit is not None:
                    await conn.execute(q["insert_audit"], audit.params())
            return open_ids

        return await self._conns.transaction(body)

    async def move_runs(
        self,
        from_version: str,
        to_version: str,
        thread_ids: Sequence[str] | None,
        decide: Callable[[list[RunRecord]], Sequence[str]],
        audit: Audit | None = None,
    ) -> list[RunRecord]:
        q = self._q

        async def body(conn: Conn) -> list[RunRecord]:
            async with conn.pipeline():
                await conn.execute(BEGIN)
                if thread_ids is None:
                    cur = await conn.execute(q["parked_runs"], {"version": from_version})
                else:
                    cur = await conn.execute(q["runs_by_ids"], {"ids": list(thread_ids)})
            found = [RunRecord(*r) for r in await cur.fetchall()]
            move = list(decide(found))
            if move:
                cur = await conn.execute(q["move_runs"], {
                    "ids": move, "from_version": from_version, "to_version": to_version})
                row = await cur.fetchone()
                moved = int(row[0]) if row is not None else 0
                if moved != len(move):  # a named run is not parked on from_version
                    raise InvalidState(
                        f"only {moved} of the {len(move)} runs to move are parked on "
                        f"{from_version!r}; nothing moved")
                if audit is not None:
                    await conn.execute(q["insert_audit"], audit.counted(len(move)).params())
            return found

        return await self._conns.transaction(body)
