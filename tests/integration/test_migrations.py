"""Migrations on empty databases of both dialects: applied once, in order, never silently.

The contract suite itself runs on databases built by `migrate()` (the per-session templates),
so "all migrations applied to an empty database pass the contract suite" holds by construction.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import psycopg
import pytest

from tether.errors import SchemaError
from tether.store import migrate as migrations
from tether.store.base import Store


def _dialect(url: str) -> str:
    return "sqlite" if url.startswith("sqlite:") else "postgres"


async def test_migrate_empty_database_to_latest(
    empty_db_url: str, store_for: Callable[[str], Store]
) -> None:
    latest = migrations.latest(_dialect(empty_db_url))
    assert latest >= 1
    store = store_for(empty_db_url)
    await store.open(check_schema=False)
    try:
        assert await store.schema_version() == (0, latest)
        assert await store.migrate() == list(range(1, latest + 1))
        assert await store.schema_version() == (latest, latest)
    finally:
        await store.close()
    # A checked open now succeeds and the schema works.
    store = store_for(empty_db_url)
    await store.open()
    try:
        assert await store.list_runs() == []
    finally:
        await store.close()


async def test_migrate_is_idempotent(empty_db_url: str, store_for: Callable[[str], Store]) -> None:
    store = store_for(empty_db_url)
    await store.open(check_schema=False)
    try:
        assert await store.migrate()
        assert await store.migrate() == []
        latest = migrations.latest(store.dialect)
        assert await store.schema_version() == (latest, latest)
    finally:
        await store.close()


async def test_migrated_template_is_current(db_url: str, store_for: Callable[[str], Store]) -> None:
    store = store_for(db_url)
    await store.open()
    try:
        assert await store.migrate() == []
        latest = migrations.latest(store.dialect)
        assert await store.schema_version() == (latest, latest)
    finally:
        await store.close()


async def test_open_on_an_unmigrated_database_says_run_tether_migrate(
    empty_db_url: str, store_for: Callable[[str], Store]
) -> None:
    store = store_for(empty_db_url)
    try:
        with pytest.raises(SchemaError, match="tether migrate"):
            await store.open()
    finally:
        await store.close()  # idempotent, and must be safe after a failed open
    # Refusing to open created nothing: the database is still empty.
    store = store_for(empty_db_url)
    await store.open(check_schema=False)
    try:
        assert (await store.schema_version())[0] == 0
    finally:
        await store.close()


async def test_concurrent_migrate_applies_once(
    empty_db_url: str, store_for: Callable[[str], Store]
) -> None:
    stores = [store_for(empty_db_url) for _ in range(4)]
    try:
        for s in stores:
            await s.open(check_schema=False)
        results = await asyncio.gather(*(s.migrate() for s in stores))
        latest = migrations.latest(stores[0].dialect)
        applied = sorted(v for r in results for v in r)
        assert applied == list(range(1, latest + 1)), results
        for s in stores:
            assert await s.schema_version() == (latest, latest)
    finally:
        for s in stores:
            await s.close()


@pytest.mark.postgres
async def test_concurrent_migrate_records_each_version_once_on_postgres(
    pg_empty_url: str, store_for: Callable[[str], Store]
) -> None:
    stores = [store_for(pg_empty_url) for _ in range(2)]
    try:
        for s in stores:
            await s.open(check_schema=False)
        first, second = await asyncio.gather(*(s.migrate() for s in stores))
    finally:
        for s in stores:
            await s.close()
    latest = migrations.latest("postgres")
    assert sorted(first + second) == list(range(1, latest + 1))
    assert [] in (first, second)
    async with await psycopg.AsyncConnection.connect(pg_empty_url) as conn:
        cur = await conn.execute("SELECT version FROM schema_version ORDER BY version")
        assert [r[0] for r in await cur.fetchall()] == list(range(1, latest + 1))
