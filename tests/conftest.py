"""Fixtures shared by the whole suite: a migrated database per test on every store.

Each backend keeps one migrated *template* per session and hands every test a fresh copy:
Postgres clones `tether_tpl_<pid>` with `CREATE DATABASE ... TEMPLATE` (procrastinate's
pattern), SQLite copies a migrated file into the test's tmp_path. Templates are built lazily,
on the first test that needs them, so a SQLite-only run never touches Postgres.

Postgres: `postgresql://postgres@127.0.0.1:5432/postgres`, or `TETHER_TEST_PG`. When it cannot
be reached, Postgres tests skip with the reason, except under CI=true where they fail: a CI
job that silently skipped half the contract suite would report green for an untested store.
Deselect them with `-m "not postgres"`.
"""

from __future__ import annotations

import asyncio
import os
import queue
import shutil
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

from tether.store.base import Store

PG_DEFAULT = "postgresql://postgres@127.0.0.1:5432/postgres"
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "postgres: needs a Postgres server (TETHER_TEST_PG); fails when absent in CI"
    )


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def make_store(url: str) -> Store:
    """The store class matching the URL's scheme (imported lazily: Postgres is optional)."""
    if url.startswith("sqlite:"):
        from tether.store.sqlite import SQLiteStore

        return SQLiteStore(url)
    from tether.store.postgres import PostgresStore

    return PostgresStore(url)


async def _migrate(url: str) -> list[int]:
    store = make_store(url)
    await store.open(check_schema=False)
    try:
        return await store.migrate()
    finally:
        await store.close()


# -- Postgres -------------------------------------------------------------------------------


def _with_dbname(url: str, dbname: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + dbname))


class PgAdmin:
    """Creates databases over one autocommit admin connection, and drops them on another,
    in a background thread: a DROP costs a few tenths of a second that no test should wait
    for. `close()` waits until every drop is done, so the session leaves no database behind."""

    def __init__(self, url: str):
        self.url = url
        self.conn = psycopg.connect(url, autocommit=True, connect_timeout=3)
        self._drops: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._errors: list[BaseException] = []
        self._dropper = threading.Thread(target=self._drop_loop, name="pg-dropper", daemon=True)
        self._dropper.start()

    def create(self, name: str, template: str) -> str:
        self.conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        )
        return _with_dbname(self.url, name)

    def drop(self, name: str) -> None:
        """Drop now (a template must be gone before the session ends)."""
        self.conn.execute(_drop_sql(name))

    def drop_soon(self, name: str) -> None:
        self._drops.put(name)

    def _drop_loop(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                while (name := self._drops.get()) is not None:
                    try:
                        conn.execute(_drop_sql(name))
                    except psycopg.Error as exc:
                        self._errors.append(exc)
        except BaseException as exc:
            self._errors.append(exc)

    def close(self) -> None:
        self._drops.put(None)
        self._dropper.join()
        self.conn.close()
        if self._errors:
            raise RuntimeError(f"could not drop test databases: {self._errors}")


def _drop_sql(name: str) -> sql.Composed:
    return sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))


@pytest.fixture(scope="session")
def pg_admin() -> Iterator[PgAdmin]:
    url = os.environ.get("TETHER_TEST_PG", PG_DEFAULT)
    try:
        admin = PgAdmin(url)
    except psycopg.OperationalError as exc:
        reason = f"Postgres unreachable at {url} (set TETHER_TEST_PG): {exc}".strip()
        if in_ci():
            pytest.fail(f"CI=true and {reason}", pytrace=False)
        pytest.skip(reason)
    try:
        yield admin
    finally:
        admin.close()


@pytest.fixture(scope="session")
def pg_template(pg_admin: PgAdmin) -> Iterator[str]:
    """Name of a database holding every tether migration; cloned by each test."""
    name = f"tether_tpl_{os.getpid()}"
    pg_admin.drop(name)  # left over by a crashed session that had our pid
    url = pg_admin.create(name, "template0")
    try:
        asyncio.run(_migrate(url))
        yield name
    finally:
        pg_admin.drop_soon(name)


@pytest.fixture
def pg_url(pg_admin: PgAdmin, pg_template: str) -> Iterator[str]:
    """A fresh migrated Postgres database for this test, dropped afterwards."""
    name = f"tether_t_{uuid.uuid4().hex}"
    url = pg_admin.create(name, pg_template)
    try:
        yield url
    finally:
        pg_admin.drop_soon(name)


@pytest.fixture
def pg_empty_url(pg_admin: PgAdmin) -> Iterator[str]:
    """A fresh Postgres database without the tether schema, dropped afterwards."""
    name = f"tether_t_{uuid.uuid4().hex}"
    url = pg_admin.create(name, "template0")
    try:
        yield url
    finally:
        pg_admin.drop_soon(name)


# -- SQLite ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tether-template") / "template.db"
    asyncio.run(_migrate(f"sqlite:///{path}"))
    # Closing the last connection checkpointed the WAL: the main file is the whole database.
    assert not Path(f"{path}-wal").exists()
    return path


# -- both -----------------------------------------------------------------------------------


class Databases:
    """Hands out fresh databases of one backend; everything it made is dropped at teardown."""

    def __init__(self, backend: str, request: pytest.FixtureRequest, tmp_path: Path):
        self.backend = backend
        self._request = request
        self._tmp = tmp_path
        self._made: list[str] = []

    def create(self, *, migrated: bool = True) -> str:
        if self.backend == "sqlite":
            path = self._tmp / ("t.db" if not self._made else f"t-{len(self._made)}.db")
            if migrated:
                shutil.copyfile(self._request.getfixturevalue("sqlite_template"), path)
            url = f"sqlite:///{path}"
        else:
            admin: PgAdmin = self._request.getfixturevalue("pg_admin")
            template = self._request.getfixturevalue("pg_template") if migrated else "template0"
            url = admin.create(f"tether_t_{uuid.uuid4().hex}", template)
        self._made.append(url)
        return url

    def drop(self, url: str) -> None:
        self._made.remove(url)
        if self.backend == "sqlite":
            path = urlsplit(url).path[1:]
            for suffix in ("", "-wal", "-shm", "-journal"):
                Path(path + suffix).unlink(missing_ok=True)
        else:
            admin: PgAdmin = self._request.getfixturevalue("pg_admin")
            admin.drop_soon(urlsplit(url).path.lstrip("/"))

    def drop_all(self) -> None:
        for url in list(self._made):
            self.drop(url)


@pytest.fixture(params=BACKENDS)
def databases(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Databases]:
    """A factory of fresh databases, parametrized over every backend."""
    # Build the template now, outside any event loop (and skip or fail before the test body
    # runs when Postgres is absent), so create() may be called from async tests.
    request.getfixturevalue("sqlite_template" if request.param == "sqlite" else "pg_template")
    dbs = Databases(request.param, request, tmp_path)
    try:
        yield dbs
    finally:
        dbs.drop_all()


@pytest.fixture
def db_url(databases: Databases) -> str:
    """A migrated database URL: a file in tmp_path, or a fresh Postgres template clone."""
    return databases.create()


@pytest.fixture
def empty_db_url(databases: Databases) -> str:
    """A database URL with no tether schema at all."""
    return databases.create(migrated=False)


@pytest.fixture
def store_for() -> Callable[[str], Store]:
    """The store constructor for a URL (not opened)."""
    return make_store


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Store]:
    s = make_store(db_url)
    await s.open()
    try:
        yield s
    finally:
        await s.close()
