"""A write job that returns its cursor (`lambda c: c.execute(...)`) hands the event loop None,
the cursor closed on the commit thread under the write lock: freed later on the loop's thread,
it reset a cached statement the commit thread could be running for the next batch ("bad
parameter or other API misuse", pending writes rolled back). Both SQLite writers: the store's
and the LangGraph saver's."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tether.langgraph._sqlite import SQLiteRows
from tether.store import make_store


def cursor_job(seen: list[Any]) -> Any:
    def job(conn: sqlite3.Connection) -> sqlite3.Cursor:
        cur = conn.execute("SELECT 1")
        seen.append(cur)
        return cur

    return job


def check(seen: list[Any], results: list[Any]) -> None:
    assert results == [None] * len(seen)
    for cur in seen:
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            cur.fetchone()


async def test_the_stores_writer_hands_back_no_cursor(tmp_path: Path) -> None:
    store = make_store(f"sqlite:///{tmp_path / 't.db'}")
    await store.open(check_schema=False)
    try:
        seen: list[Any] = []
        check(seen, await asyncio.gather(*(store._w(cursor_job(seen))  # type: ignore[attr-defined]
                                           for _ in range(50))))
    finally:
        await store.close()


async def test_the_savers_writer_hands_back_no_cursor(tmp_path: Path) -> None:
    rows = SQLiteRows(f"sqlite:///{tmp_path / 'lg.db'}")
    await rows.open(private_loop=False)
    try:
        seen: list[Any] = []
        check(seen, await asyncio.gather(*(rows._w(cursor_job(seen)) for _ in range(50))))
    finally:
        await rows.close()
