"""Postgres behind a connection pooler (PgBouncer): tether's URL options for it.

    postgresql://u@bouncer:6432/db?pool_mode=transaction&listen_url=postgresql%3A%2F%2Fu%40db-host%3A5432%2Fdb

`pool_mode=transaction` says the URL goes through PgBouncer's transaction pooling, where each
transaction may run on another server connection. tether relies on no session state there (its
multi-statement writes are single transactions, its advisory locks transaction-scoped); what
changes is:
- no server-side prepared statements (psycopg's prepare_threshold=None): a statement prepared
  on one server connection does not exist on the next;
- no `options` startup parameter (PgBouncer refuses it): synchronous_commit is the server's
  (its default, on), so asking for another mode is a configuration error;
- LISTEN needs a session of its own, so `listen_url` (a direct or a session-mode URL, percent-
  encoded in the query; or $TETHER_LISTEN_URL) is required: without it the store refuses to
  open, rather than LISTEN through the pooler and never be woken.

`pool_mode=session` (the default) is plain Postgres semantics; `listen_url` may be given with it
too (say, to keep the listener off a pooler).
"""

from __future__ import annotations

import os
from typing import Final
from urllib.parse import unquote

from ..config import redact
from ..errors import ConfigError

POOL_MODES: Final = ("session", "transaction")
LISTEN_ENV: Final = "TETHER_LISTEN_URL"


def pooler_options(rest: str, safe_url: str) -> tuple[str, str, str | None]:
    """Take `pool_mode` and `listen_url` out of the URL's query (libpq refuses unknown
    options): (the rest, the pool mode, the listen URL or $TETHER_LISTEN_URL or None)."""
    base, sep, query = rest.partition("?")
    mode, listen = "session", None
    kept = []
    for item in query.split("&") if sep else []:
        key, _, value = item.partition("=")
        if key == "pool_mode":
            if value not in POOL_MODES:
                raise ConfigError(f"pool_mode in {safe_url!r} must be one of "
                                  f"{', '.join(POOL_MODES)}, got {value!r}")
            mode = value
        elif key == "listen_url":
            listen = unquote(value)
        else:
            kept.append(item)
    listen = listen or os.environ.get(LISTEN_ENV) or None
    if listen is not None and "pool_mode=transaction" in listen:
        raise ConfigError(f"listen_url {redact(listen)!r} uses transaction pooling: LISTEN "
                          "needs a session (a direct or a session-mode URL)")
    if mode == "transaction" and listen is None:
        raise ConfigError(
            f"{safe_url!r} goes through transaction pooling (pool_mode=transaction), where "
            "LISTEN cannot work (each transaction may run on another server connection, so "
            "notifications never arrive): give a direct or session-mode URL for it, as "
            f"listen_url=<percent-encoded URL> in the query or ${LISTEN_ENV}")
    return base + ("?" + "&".join(kept) if kept else ""), mode, listen
