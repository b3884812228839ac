"""Storage backends behind one protocol (see base.py)."""

from __future__ import annotations

from ..config import redact
from ..errors import ConfigError
from ..extras import requires_extra
from .base import Store


def make_store(url: str) -> Store:
    """The store for a DB URL: sqlite:///path.db, sqlite:///:memory:, postgresql://..."""
    if not isinstance(url, str) or "://" not in url:
        raise ConfigError(
            f"malformed DB URL {redact(str(url))!r}: expected sqlite:///path.db, "
            "sqlite:///:memory: or postgresql://user@host:port/db"
        )
    scheme = url.split("://", 1)[0].lower()
    if scheme == "sqlite":
        from .sqlite import SQLiteStore

        return SQLiteStore(url)
    if scheme in ("postgresql", "postgres", "postgresql+psycopg"):
        with requires_extra("postgres", "the Postgres store"):
            from .postgres import PostgresStore

        return PostgresStore(url)
    raise ConfigError(
        f"unsupported DB URL scheme {scheme!r} in {redact(url)!r}: use sqlite:/// or postgresql://"
    )


__all__ = ["Store", "make_store"]
