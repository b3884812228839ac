"""Numbered forward-only migrations and named SQL blocks, read once from package data.

Layout: sql/<dialect>/migrations/NNNN_name.sql and sql/<dialect>/queries/*.sql (one file per
domain: runs, steps, mail...), where each query starts with a line `-- name: some_name`
followed by a comment saying what it guarantees. A block starting `-- fragment: some_name` is
no query: it is SQL that several queries share (in any file of the dialect), each taking it
in with `{{some_name}}`: a line of its own (replaced whole, the fragment keeping its own
indentation), or inline (e.g. a column list). Names are unique across a dialect's files.
The schema_version table records every migration applied; stores refuse to run on a schema
that is behind and tell the user to run `tether migrate`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

_NAME = re.compile(r"^--\s*(name|fragment):\s*(\w+)\s*$", re.M)
_USE_LINE = re.compile(r"^[ \t]*\{\{(\w+)\}\}[ \t]*$", re.M)
_USE = re.compile(r"\{\{(\w+)\}\}")
_MIGRATION = re.compile(r"^(\d{4})_(\w+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


@cache
def queries(dialect: str) -> dict[str, str]:
    """Every named query of the dialect, from all the .sql files of its queries folder."""
    folder = resources.files("tether.store") / "sql" / dialect / "queries"
    files = sorted((entry.name, entry) for entry in folder.iterdir()
                   if entry.name.endswith(".sql"))
    if not files:
        raise ValueError(f"no query files in sql/{dialect}/queries")
    return parse_query_files(
        {f"{dialect}/queries/{name}": entry.read_text("utf-8") for name, entry in files})


def parse_queries(text: str, where: str) -> dict[str, str]:
    """The named queries of one text, each with its fragments taken in."""
    return parse_query_files({where: text})


def parse_query_files(texts: dict[str, str]) -> dict[str, str]:
    """The named queries of several texts ({where: text}), each with its fragments taken in;
    a fragment defined in one text may be used in any other."""
    out: dict[str, tuple[str, str]] = {}  # name -> (where, body)
    fragments: dict[str, str] = {}
    seen: dict[str, str] = {}  # name -> where it was defined
    for where, text in texts.items():
        parts = _NAME.split(text)
        # parts = [preamble, kind1, name1, body1, kind2, name2, body2, ...]
        for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
            if name in seen:
                also = "" if seen[name] == where else f" (also in {seen[name]})"
                raise ValueError(f"duplicate query name {name!r} in {where}{also}")
            seen[name] = where
            if kind == "fragment":  # its leading comment stays here, not in every query using it
                lines = body.strip("\n").rstrip().splitlines()
                while lines and lines[0].lstrip().startswith("--"):
                    del lines[0]
                fragments[name] = "\n".join(lines)
            else:
                out[name] = (where, body.strip().rstrip(";"))

    def take_in(body: str, where: str) -> str:
        def use(m: re.Match[str]) -> str:
            try:
                return fragments[m.group(1)]
            except KeyError:
                raise ValueError(f"unknown fragment {m.group(1)!r} in {where}") from None

        return _USE.sub(use, _USE_LINE.sub(use, body))

    return {name: take_in(body, where) for name, (where, body) in out.items()}


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
