"""A SQLite database's URL, and its schema: which migration it is at, and applying the
pending ones (the numbered files of sql/sqlite/migrations, migrate.py) inside the caller's
IMMEDIATE transaction."""

from __future__ import annotations

import os
import sqlite3
from urllib.parse import parse_qs, urlsplit

from ..errors import ConfigError
from .migrate import migrations


def parse_sqlite_url(url: str) -> tuple[str, dict[str, str]]:
    """sqlite:///relative.db, sqlite:////abs/path.db, sqlite:///:memory: -> (path, options)."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite" or parts.netloc:
        raise ConfigError(
            f"malformed SQLite URL {url!r}: expected sqlite:///path.db or sqlite:///:memory:"
        )
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not path:
        raise ConfigError(f"malformed SQLite URL {url!r}: no database path")
    opts = {k.lower(): v[-1] for k, v in parse_qs(parts.query).items()}
    return path, opts


def create_private(path: str) -> bool:
    """Whether the database file at `path` is new (absent or empty); an absent one is created
    here, empty, with mode 0600. SQLite creates the -wal and -shm files with the database
    file's mode (unix VFS), so they are 0600 too: a state, journal or input may hold what
    only the application's user should read. The mode is given to open() rather than set by
    umask, which is process-wide and would race other threads creating files."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return os.path.getsize(path) == 0
    os.close(fd)
    return True


def missing_file(path: str) -> str | None:
    """The absolute path of a database file that does not exist (one stat), else None."""
    return None if os.path.exists(path) else os.path.abspath(path)


def schema_applied(conn: sqlite3.Connection) -> int:
    """The last migration applied to the database (0: none)."""
    row = conn.execute(
        "SELECT count(*) FROM sqlite_master WHERE type='table' AND name='schema_version'"
    ).fetchone()
    if not row[0]:
        return 0
    got = conn.execute("SELECT max(version) FROM schema_version").fetchone()[0]
    return int(got or 0)


def apply_migrations(conn: sqlite3.Connection) -> list[int]:
    """Apply the pending migrations, inside the caller's IMMEDIATE transaction (which
    serializes concurrent migrators across processes); returns their numbers."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_version "
        "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
    )
    current = schema_applied(conn)
    done: list[int] = []
    for mig in migrations("sqlite"):
        if mig.version <= current:
            continue
        for stmt in _split_sql(mig.sql):
            conn.execute(stmt)
        conn.execute(
            "INSERT INTO schema_version VALUES (?, ?, (julianday('now') - 2440587.5) * 86400.0)",
            (mig.version, mig.name),
        )
        done.append(mig.version)
    return done


def _split_sql(script: str) -> list[str]:
    """Split a migration into statements (our migrations hold no ';' inside literals; a
    trigger's body, BEGIN ... END, holds its own, so a piece goes on until SQLite says the
    statement is complete)."""
    lines = [ln for ln in script.splitlines() if not ln.strip().startswith("--")]
    out: list[str] = []
    pending = ""
    for piece in "\n".join(lines).split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \n;"):
                out.append(pending.strip().removesuffix(";").strip())
            pending = ""
    if pending.strip(" \n;"):
        out.append(pending.strip().removesuffix(";").strip())
    return out
