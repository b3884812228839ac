"""A failed transaction's connection goes back to the pool clean: no open transaction, no
row locks, and usable prepared statements (real Postgres)."""

from __future__ import annotations

import psycopg
from psycopg.pq import TransactionStatus

from tether.store.pg_conn import rollback


async def test_rollback_ends_the_transaction_and_releases_its_locks(pg_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as a, \
            await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as b:
        await a.execute("CREATE TABLE probe (id int PRIMARY KEY)")
        await a.execute("INSERT INTO probe VALUES (1)")
        await a.execute("BEGIN")
        await a.execute("SELECT id FROM probe FOR UPDATE")
        await rollback(a)
        assert not a.closed and a.info.transaction_status == TransactionStatus.IDLE
        # The row lock is gone: another session takes it at once.
        await b.execute("SET lock_timeout = '1s'")
        await b.execute("BEGIN")
        assert await (await b.execute("SELECT id FROM probe FOR UPDATE NOWAIT")).fetchall() == [(1,)]
        await b.execute("ROLLBACK")


async def test_rollback_outside_a_transaction_keeps_the_connection_usable(pg_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True,
                                                     prepare_threshold=0) as conn:
        for _ in range(3):  # prepared at once (threshold 0)
            await conn.execute("SELECT %s::int", (1,))
        await rollback(conn)
        assert not conn.closed
        assert await (await conn.execute("SELECT %s::int", (2,))).fetchone() == (2,)


async def test_rollback_of_a_closed_connection_does_nothing(pg_url: str) -> None:
    conn = await psycopg.AsyncConnection.connect(pg_url, autocommit=True)
    await conn.close()
    await rollback(conn)
    assert conn.closed
