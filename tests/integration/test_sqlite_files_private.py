"""A new SQLite database's files (the database, its -wal and -shm) are mode 0600, whatever the
process's umask lets through (issue 28, item 8): they hold every run's state, journal and
input, which only the application's user should read."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tether.store.base import NewRun
from tether.store.sqlite import SQLiteStore


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The usual umask (022): what it lets through is 0644, readable by every local user."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.usefixtures("open_umask")
async def test_a_new_database_and_its_wal_and_shm_are_0600(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    store = SQLiteStore(f"sqlite:///{db}")
    await store.open(check_schema=False)
    try:
        await store.migrate()
        data = orjson.dumps({"q": 1})
        await store.create_run(NewRun("t1", "a", "v1", "start", data,
                                      hashlib.sha256(data).hexdigest()))
        files = [db, tmp_path / "t.db-wal", tmp_path / "t.db-shm"]
        assert all(f.exists() for f in files)  # WAL mode, a write done, connections open
        assert {f.name: oct(_mode(f)) for f in files} == {f.name: "0o600" for f in files}
    finally:
        await store.close()


@pytest.mark.usefixtures("open_umask")
async def test_an_existing_database_keeps_its_mode(tmp_path: Path) -> None:
    """Only what tether creates is made private: a file the operator made keeps the mode
    they chose (a group that shares it, say)."""
    db = tmp_path / "t.db"
    db.touch(mode=0o640)
    db.chmod(0o640)
    store = SQLiteStore(f"sqlite:///{db}")
    await store.open(check_schema=False)
    try:
        await store.migrate()
        assert _mode(db) == 0o640
    finally:
        await store.close()
