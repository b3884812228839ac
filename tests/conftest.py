"""Fixtures shared by the whole suite: a migrated database per test on every store.

Each backend keeps one migrated *template* per session and hands every test a fresh copy:
Postgres clones `tether_tpl_<pid>` with `CREATE DATABASE ... TEMPLATE` (procrastinate's
pattern), SQLite copies a migrated file into the test's tmp_path. Templates are built lazily,
on the first test that needs them, so a SQLite-only run never touches Postgres.

Postgres: `postgresql://postgres@127.0.0.1:5432/postgres`, or `TETHER_TEST_PG`. When it cannot
be reached, Postgres tests skip with the reason, except under CI=true where they fail: a CI
job that silently skipped half the contract suite would report green for an untested store.
Deselect them with `-m "not postgres"`.

TETHER_TEST_PGBOUNCER=1: every Postgres database is handed out through a PgBouncer of the
session's own (apps.pgbouncer, transaction pooling), LISTEN on a direct URL (listen_url), so
a suite can be run as tether meets PgBouncer (tests/integration/test_pgbouncer.py does).
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

from apps.backends import BACKENDS
from tether.store.base import Store

PG_DEFAULT = "postgresql://postgres@127.0.0.1:5432/postgres"


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
    """Creates and drops the test databases of one session.

    A CREATE DATABASE costs about 0.1 s and a DROP DATABASE waits for a checkpoint (0.2 s on
    a quiet server, seconds on a busy one): more than most contract tests take. So a thread
    keeps a few clones of the template ready (`clone()` takes one), and drops run on several
    threads (concurrent drops share a checkpoint). `close()` waits for every drop, so the
    session leaves no database behind.
    """

    READY = 3
    DROPPERS = 8

    def __init__(self, url: str):
        self.url = url
        self.conn = psycopg.connect(url, autocommit=True, connect_timeout=3)
        self._errors: list[BaseException] = []
        self._drops: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._droppers = [
            threading.Thread(target=self._drop_loop, name=f"pg-dropper-{i}", daemon=True)
            for i in range(self.DROPPERS)
        ]
        for t in self._droppers:
            t.start()
        self._ready: queue.Queue[str] = queue.Queue(maxsize=self.READY)
        self._stop_cloning = threading.Event()
        self._cloner: threading.Thread | None = None

    def url_of(self, name: str) -> str:
        return _with_dbname(self.url, name)

    def create(self, name: str, template: str) -> str:
        self.conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        )
        return self.url_of(name)

    def drop(self, name: str) -> None:
        self.conn.execute(_drop_sql(name))

    def drop_soon(self, name: str) -> None:
        self._drops.put(name)

    def start_cloning(self, template: str) -> None:
        self._cloner = threading.Thread(
            target=self._clone_loop, args=(template,), name="pg-cloner", daemon=True
        )
        self._cloner.start()

    def clone(self) -> str:
        """A fresh database cloned from the template; the caller drops it."""
        while True:
            self._raise_errors()
            try:
                return self.url_of(self._ready.get(timeout=0.5))
            except queue.Empty:
                if self._cloner is None or not self._cloner.is_alive():
                    self._raise_errors()
                    raise RuntimeError("the Postgres template is not being cloned") from None

    def empty(self) -> str:
        """A fresh database without the tether schema; the caller drops it."""
        return self.create(f"tether_t_{uuid.uuid4().hex}", "template0")

    def stop_cloning(self) -> None:
        """Stop the cloner and drop the clones nobody took (before the template goes)."""
        self._stop_cloning.set()
        if self._cloner is not None:
            self._cloner.join()
        while not self._ready.empty():
            self.drop_soon(self._ready.get_nowait())

    def _clone_loop(self, template: str) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                while not self._stop_cloning.is_set():
                    name = f"tether_t_{uuid.uuid4().hex}"
                    conn.execute(
                        sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                            sql.Identifier(name), sql.Identifier(template)
                        )
                    )
                    while True:
                        try:
                            self._ready.put(name, timeout=0.2)
                            break
                        except queue.Full:
                            if self._stop_cloning.is_set():
                                self.drop_soon(name)
                                return
        except BaseException as exc:
            self._errors.append(exc)

    def _drop_loop(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                while (name := self._drops.get()) is not None:
                    conn.execute(_drop_sql(name))
        except BaseException as exc:
            self._errors.append(exc)

    def _raise_errors(self) -> None:
        if self._errors:
            raise RuntimeError(f"test database administration failed: {self._errors!r}")

    def close(self) -> None:
        self.stop_cloning()
        for _ in self._droppers:
            self._drops.put(None)
        for t in self._droppers:
            t.join()
        self.conn.close()
        self._raise_errors()


def _drop_sql(name: str) -> sql.Composed:
    return sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))


@pytest.fixture(scope="session")
def pg_admin() -> Iterator[PgAdmin]:
    url = os.environ.get("TETHER_TEST_PG", PG_DEFAULT)
    try:
        admin = PgAdmin(url)
    except psycopg.OperationalError as exc:
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        reason = f"Postgres unreachable at {url} (set TETHER_TEST_PG): {first_line}"
        if in_ci():
            pytest.fail(f"CI=true and {reason}", pytrace=False)
        pytest.skip(reason)
    try:
        yield admin
    finally:
        admin.close()


@pytest.fixture(scope="session")
def pg_template(pg_admin: PgAdmin) -> Iterator[str]:
    """Name of a database holding every tether migration, built once per session by
    `PostgresStore.migrate()`; each test gets a clone."""
    name = f"tether_tpl_{os.getpid()}"
    pg_admin.drop(name)  # left over by a crashed session that had our pid
    url = pg_admin.create(name, "template0")
    try:
        asyncio.run(_migrate(url))
        pg_admin.start_cloning(name)
        yield name
    finally:
        pg_admin.stop_cloning()
        pg_admin.drop_soon(name)


@pytest.fixture(scope="session")
def pg_bouncer() -> Iterator[object]:
    """The session's PgBouncer when TETHER_TEST_PGBOUNCER=1 (else None)."""
    if not os.environ.get("TETHER_TEST_PGBOUNCER"):
        yield None
        return
    from apps.pgbouncer import PgBouncer

    parts = urlsplit(os.environ.get("TETHER_TEST_PG", PG_DEFAULT))
    with PgBouncer(parts.hostname or "127.0.0.1", parts.port or 5432) as bouncer:
        yield bouncer


def through_bouncer(request: pytest.FixtureRequest, url: str) -> str:
    """`url` through the session's PgBouncer, if there is one."""
    bouncer = request.getfixturevalue("pg_bouncer")
    if bouncer is None:
        return url
    return bouncer.url(urlsplit(url).path.lstrip("/"), listen_url=url)  # type: ignore[attr-defined,no-any-return]


@pytest.fixture
def pg_url(pg_admin: PgAdmin, pg_template: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh migrated Postgres database for this test, dropped afterwards."""
    url = pg_admin.clone()
    try:
        yield through_bouncer(request, url)
    finally:
        pg_admin.drop_soon(urlsplit(url).path.lstrip("/"))


@pytest.fixture
def pg_empty_url(pg_admin: PgAdmin) -> Iterator[str]:
    """A fresh Postgres database without the tether schema, dropped afterwards."""
    url = pg_admin.empty()
    try:
        yield url
    finally:
        pg_admin.drop_soon(urlsplit(url).path.lstrip("/"))


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
        self._count = 0

    def create(self, *, migrated: bool = True) -> str:
        if self.backend == "sqlite":
            path = self._tmp / ("t.db" if not self._count else f"t-{self._count}.db")
            if migrated:
                shutil.copyfile(self._request.getfixturevalue("sqlite_template"), path)
            url = f"sqlite:///{path}"
        else:
            admin: PgAdmin = self._request.getfixturevalue("pg_admin")
            url = through_bouncer(self._request, admin.clone() if migrated else admin.empty())
        self._made.append(url)
        self._count += 1
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
