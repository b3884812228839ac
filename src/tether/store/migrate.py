"""Numbered forward-only migrations and named SQL blocks, read once from package data.

Layout: sql/<dialect>/migrations/NNNN_name.sql and sql/<dialect>/queries.sql, where each
query starts with a line `-- name: some_name` followed by a comment saying what it guarantees.
The schema_version table records every migration applied; stores refuse to run on a schema
that is behind and tell the user to run `tether migrate`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.M)
_MIGRATION = re.compile(r"^(\d{4})_(\w+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


@cache
def queries(dialect: str) -> dict[str, str]:
    text = (resources.files("tether.store") / "sql" / dialect / "queries.sql").read_text("utf-8")
    parts = _NAME.split(text)
    # parts = [preamble, name1, body1, name2, body2, ...]
    out: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in out:
            raise ValueError(f"duplicate query name {name!r} in {dialect}/queries.sql")
        out[name] = body.strip().rstrip(";")
    return out


@cache
def migrations(dialect: str) -> tuple[Migration, ...]:
    folder = resources.files("tether.store") / "sql" / dialect / "migrations"
    found: list[Migration] = []
    for entry in folder.iterdir():
        m = _MIGRATION.match(entry.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), entry.read_text("utf-8")))
    found.sort(key=lambda mig: mig.version)
    for i, mig in enumerate(found, start=1):
        if mig.version != i:
            raise ValueError(f"{dialect} migrations must be numbered 0001.. without gaps")
    return tuple(found)


def latest(dialect: str) -> int:
    migs = migrations(dialect)
    return migs[-1].version if migs else 0


def behind_message(current: int, target: int, url: str) -> str:
    if current == 0:
        return (f"the database at {url} has no tether schema; "
                f"run `tether migrate --db {url}` first")
    return (f"the tether schema at {url} is at version {current} but this code needs "
            f"{target}; run `tether migrate --db {url}`")
