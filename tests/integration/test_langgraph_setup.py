"""TetherSaver.setup() on Postgres: a database already at tether's latest migration is checked
on the saver's own connection and left alone (no second connection, no migration lock), which
is what a saver opened per request, per worker or per test costs; one behind is migrated."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tether.langgraph import TetherSaver
from tether.store.migrate import latest
from tether.store.postgres import PostgresStore

pytestmark = pytest.mark.postgres


def connections_made(pg: psycopg.Connection[Any]) -> int:
    """Sessions opened on `pg`'s database since it was created (pg_stat_database)."""
    pg.execute("SELECT pg_stat_clear_snapshot()")
    row = pg.execute("SELECT sessions FROM pg_stat_database "
                     "WHERE datname = current_database()").fetchone()
    assert row is not None
    return int(row[0])


async def test_setup_on_an_up_to_date_database_migrates_nothing(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    async def no_migration(self: PostgresStore) -> list[int]:
        calls.append(self.url)
        raise AssertionError("an up-to-date database was migrated again")

    monkeypatch.setattr(PostgresStore, "migrate", no_migration)
    with psycopg.connect(pg_url, autocommit=True) as pg:
        async with TetherSaver.from_conn_string(pg_url, pool_size=1) as saver:
            before = connections_made(pg)
            await saver.setup()
            # The saver's own (kept) connection answered: nothing else connected.
            assert connections_made(pg) == before
            assert await saver.aget_tuple({"configurable": {"thread_id": "t"}}) is None
    assert calls == []


def test_setup_on_an_empty_database_migrates(pg_empty_url: str) -> None:
    with TetherSaver.from_conn_string(pg_empty_url) as saver:
        saver.setup()
    with psycopg.connect(pg_empty_url) as pg:
        row: Any = pg.execute("SELECT max(version) FROM schema_version").fetchone()
    assert row[0] == latest("postgres")
