"""The scale benches' measurement of the Postgres server's own cost (tether.bench.pgcost):
what a client's writes cost is counted (commits, rows, WAL, backend CPU) and nothing else."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from tether.bench.common import direct_url, libpq_url
from tether.bench.pgcost import DbCost, PgCost

pytestmark = pytest.mark.postgres

COMMITS = 300


async def _write(url: str, n: int) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("CREATE TABLE IF NOT EXISTS scratch (i int, pad text)")
        for i in range(n):
            await conn.execute("INSERT INTO scratch VALUES (%s, repeat('x', 200))", (i,))
        await asyncio.sleep(0.3)  # sampled while alive: a backend's CPU is read from /proc


def test_pgcost_counts_a_clients_commits_rows_wal_and_cpu(pg_empty_url: str) -> None:
    url = libpq_url(direct_url(pg_empty_url))

    async def main() -> tuple[DbCost, DbCost]:
        async with PgCost(url, interval=0.05) as cost:
            await cost.start()
            await _write(url, COMMITS)
            await cost.stop()
            busy = await cost.finish(wait_s=0.5)
            await cost.start()
            await asyncio.sleep(0.3)
            await cost.stop()
            idle = await cost.finish(wait_s=0.5)
        return busy, idle

    busy, idle = asyncio.run(main())
    # the CREATE TABLE and the inserts; the watcher's own reads are left out, as far as the
    # server has reported them (a backend reports its counts about once a second)
    assert abs(busy.commits - (COMMITS + 1)) <= 25, busy
    assert busy.rows_written >= COMMITS, busy
    assert busy.backend_cpu_s > 0 and busy.backends >= 1, busy
    if busy.wal_bytes is not None:
        # each row is over 200 bytes in the WAL, and each commit has its record
        assert busy.wal_bytes >= COMMITS * 200, busy
    # With no client at work: no rows, and of the commits only a few of the watcher's own
    # reads that the server reported late
    assert idle.commits < COMMITS / 10 and idle.rows_written == 0, idle
    assert idle.backend_cpu_s < busy.backend_cpu_s, (idle, busy)
