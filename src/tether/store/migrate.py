"""Numbered forward-only migrations and named SQL blocks, read once from package data.

Layout: sql/<dialect>/migrations/NNNN_name.sql and sql/<dialect>/queries.sql, where each
query starts with a line `-- name: some_name` followed by a comment saying what it guarantees.
A block starting `-- fragment: some_name` is no query: it is SQL that several queries share,
each taking it in with a line `{{some_name}}`.
The schema_version table records every migration applied; stores refuse to run on a schema
that is behind and tell the user to run `tether migrate`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

_NAME = re.compile(r"^--\s*(name|fragment):\s*(\w+)\s*$", re.M)
_USE = re.compile(r"^[ \t]*\{\{(\w+)\}\}[ \t]*$", re.M)
_MIGRATION = re.compile(r"^(\d{4})_(\w+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


@cache
def queries(dialect: str) -> dict[str, str]:
    text = (resources.files("tether.store") / "sql" / dialect / "queries.sql").read_text("utf-8")
    return parse_queries(text, f"{dialect}/queries.sql")


def parse_queries(text: str, where: str) -> dict[str, str]:
    """The named queries of a queries.sql text, each with its fragments taken in."""
    parts = _NAME.split(text)
    # parts = [preamble, kind1, name1, body1, kind2, name2, body2, ...]
    out: dict[str, str] = {}
    fragments: dict[str, str] = {}
    for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
        if name in out or name in fragments:
            raise ValueError(f"duplicate query name {name!r} in {where}")
        if kind == "fragment":  # its leading comment stays here, not in every query using it
            lines = body.strip("\n").rstrip().splitlines()
            while lines and lines[0].lstrip().startswith("--"):
                del lines[0]
            fragments[name] = "\n".join(lines)
        else:
            out[name] = body.strip().rstrip(";")

    def use(m: re.Match[str]) -> str:
        try:
            return fragments[m.group(1)]
        except KeyError:
            raise ValueError(f"unknown fragment {m.group(1)!r} in {where}") from None

    return {name: _USE.sub(use, body) for name, body in out.items()}


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
