"""Numbered forward-only migrations and named SQL blocks, read once from package data.

Layout: sql/<dialect>/migrations/NNNN_name.sql and sql/<dialect>/queries/*.sql (one file per
domain: runs, steps, mail...), where each query starts with a line `-- name: some_name`
followed by a comment saying what it guarantees. A block starting `-- fragment: some_name` is
no query: it is SQL that several queries share (in any file of the dialect), each taking it
in with `{{some_name}}`: a line of its own (replaced whole, the fragment keeping its own
indentation), or inline (e.g. a column list). Names are unique across a dialect's files.
A fragment may take in other fragments (expanded in turn; a cycle is an error), and may have
parameters, `-- fragment: page(key, cond)`, each `{{key}}` in its body replaced by the text
its use gives, `{{page(created_at, AND x = 1)}}`: arguments are split at the commas outside
parentheses and quotes, stripped, and are expanded before the fragment is (so an argument
may itself be `{{other}}`); a line holding only a parameter whose argument is empty is
dropped.
The schema_version table records every migration applied; stores refuse to run on a schema
that is behind and tell the user to run `tether migrate`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

_NAME = re.compile(r"^--[ \t]*(name|fragment):[ \t]*(\w+)[ \t]*(?:\(([^()\n]*)\))?[ \t]*$",
                   re.M)
# A use: {{name}} or {{name(arguments)}}; arguments hold no braces, so in `{{a({{b}})}}` only
# the inner use matches until it is replaced: arguments are expanded before their use.
_CALL = r"\{\{(\w+)(?:\(([^{}\n]*)\))?\}\}"
_USE_LINE = re.compile(rf"^[ \t]*{_CALL}[ \t]*$", re.M)
_USE = re.compile(_CALL)
_PARAM_LINE = re.compile(r"^[ \t]*\{\{(\w+)\}\}[ \t]*(?:\n|\Z)", re.M)
_PARAM = re.compile(r"\{\{(\w+)\}\}")
_MIGRATION = re.compile(r"^(\d{4})_(\w+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


@dataclass(frozen=True, slots=True)
class _Fragment:
    """A `-- fragment:` block: its parameters (none for most) and its body, unexpanded."""

    params: tuple[str, ...]
    body: str


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
    fragments: dict[str, _Fragment] = {}
    seen: dict[str, str] = {}  # name -> where it was defined
    for where, text in texts.items():
        parts = _NAME.split(text)
        # parts = [preamble, kind1, name1, params1, body1, kind2, name2, params2, body2, ...]
        for kind, name, params, body in zip(parts[1::4], parts[2::4], parts[3::4], parts[4::4],
                                            strict=True):
            if name in seen:
                also = "" if seen[name] == where else f" (also in {seen[name]})"
                raise ValueError(f"duplicate query name {name!r} in {where}{also}")
            seen[name] = where
            if kind == "fragment":  # its leading comment stays here, not in every query using it
                lines = body.strip("\n").rstrip().splitlines()
                while lines and lines[0].lstrip().startswith("--"):
                    del lines[0]
                fragments[name] = _Fragment(_params(params, name, where), "\n".join(lines))
            elif params is not None:
                raise ValueError(f"query {name!r} in {where} has parameters: only a fragment may")
            else:
                out[name] = (where, body.strip().rstrip(";"))
    for name, fragment in fragments.items():
        for param in fragment.params:
            if param in fragments:  # `{{param}}` in the body would mean either
                raise ValueError(f"parameter {param!r} of fragment {name!r} in {seen[name]} "
                                 f"is also a fragment's name")
    return {name: _expand(body, where, (name,), fragments)
            for name, (where, body) in out.items()}


def _params(text: str | None, name: str, where: str) -> tuple[str, ...]:
    """The parameter names of a `-- fragment: name(a, b)` line (`text` is `a, b`)."""
    if text is None:
        return ()
    params = tuple(p.strip() for p in text.split(","))
    if not all(p.isidentifier() for p in params) or len(set(params)) < len(params):
        raise ValueError(f"fragment {name!r} in {where}: parameters must be distinct names, "
                         f"got ({text})")
    return params


def _expand(body: str, where: str, chain: tuple[str, ...],
            fragments: dict[str, _Fragment]) -> str:
    """`body` with every fragment use replaced, innermost first; `chain` is the query and the
    fragments being expanded that lead here (for errors, and to find a cycle)."""

    def use(m: re.Match[str]) -> str:
        name, arguments = m.group(1), m.group(2)
        fragment = fragments.get(name)
        if fragment is None:
            raise ValueError(f"unknown fragment {name!r} in {where} "
                             f"(used by {' -> '.join(chain)})")
        if name in chain:
            raise ValueError(f"fragment cycle in {where}: {' -> '.join((*chain, name))}")
        args = () if arguments is None else _split_arguments(arguments)
        if len(args) != len(fragment.params):
            raise ValueError(f"fragment {name!r} takes {len(fragment.params)} argument(s) "
                             f"({', '.join(fragment.params)}), got {len(args)} in {where} "
                             f"(used by {' -> '.join(chain)})")
        return _expand(_bind(fragment, args), where, (*chain, name), fragments)

    while _USE.search(body):  # each pass replaces the innermost uses, so fewer `{{` remain
        body = _USE.sub(use, _USE_LINE.sub(use, body))
    return body


def _bind(fragment: _Fragment, args: tuple[str, ...]) -> str:
    """The fragment's body with its parameters replaced by the arguments of one use."""
    if not args:
        return fragment.body
    values = dict(zip(fragment.params, args, strict=True))

    def drop_empty(m: re.Match[str]) -> str:
        return "" if values.get(m.group(1)) == "" else m.group(0)

    def value(m: re.Match[str]) -> str:
        return values.get(m.group(1), m.group(0))  # not a parameter: a fragment's use

    return _PARAM.sub(value, _PARAM_LINE.sub(drop_empty, fragment.body))


def _split_arguments(text: str) -> tuple[str, ...]:
    """A use's arguments: `text` split at the commas outside parentheses and quotes, so an
    argument may be `status IN ('a', 'b')`; each stripped."""
    args: list[str] = []
    depth, quoted, start = 0, False, 0
    for i, ch in enumerate(text):
        if ch == "'":  # a doubled quote inside a literal toggles twice: still quoted
            quoted = not quoted
        elif quoted:
            continue
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            args.append(text[start:i].strip())
            start = i + 1
    args.append(text[start:].strip())
    return tuple(args)


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
