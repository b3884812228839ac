"""What every command shares: the --db/--app/--verbose/--json options, loading the user's
Runtime, running a command's coroutine with tether's errors as a message and exit status 2,
and the value types of the options."""

from __future__ import annotations

import importlib
import logging
import os
import shlex
import sys
from collections.abc import Awaitable, Callable, Collection, Coroutine, Sequence
from typing import Any, TypeVar

import click
import orjson

from .. import eventloop, serde
from ..config import loading_app, resolve_app
from ..errors import AppImportError, ConfigError, TetherError, with_article
from ..runtime import Runtime

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

# Usage errors (a bad option) exit with click's 2, as tether's own errors do. A wait's outcome
# is its exit status: 0 completed (or reached --until), 1 failed, 3 cancelled, 4 timed out.
USER_ERROR = 2
RUN_FAILED = 1
RUN_CANCELLED = 3
TIMED_OUT = 4


class WaitTimeout(TetherError):
    """A CLI wait that ran out of time: exit status 4, so a script tells it from an error."""

    exit_status = TIMED_OUT


def load_app(target: str, source: str = "--app") -> Runtime:
    """Import `module:attr` (attr a Runtime, or a zero-argument callable returning one);
    `source` (--app, TETHER_APP, [tool.tether] in ...) is named in errors."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise AppImportError(f"the app ({source}) must look like module:attribute, got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except TetherError:
        raise  # a bad setting or definition in the app says so itself
    except Exception as exc:
        hint = ""
        if isinstance(exc, RuntimeError) and "asyncio.run() cannot be called" in str(exc):
            hint = (f"; {module_name} calls asyncio.run() when imported: put that call under "
                    "`if __name__ == \"__main__\":`")
        raise AppImportError(f"cannot import module {module_name!r} for the app ({source}): "
                             f"{exc!r}{hint}") from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise AppImportError(f"module {module_name!r} has no attribute {attr!r} (the app, "
                                 f"from {source})")
        obj = getattr(obj, part)
    if callable(obj) and not isinstance(obj, Runtime):
        try:
            obj = obj()
        except TetherError:
            raise
        except Exception as exc:
            raise AppImportError(
                f"app {target} ({source}): calling it (with no arguments) to get the Runtime "
                f"failed: {exc!r}") from exc
    if not isinstance(obj, Runtime):
        raise AppImportError(f"{target} ({source}) is {with_article(type(obj).__name__)}, "
                             "not a tether.Runtime")
    return obj


def runtime_for(db: str | None, app: str | None, need_app: bool = False,
                **flags: object) -> Runtime:
    """The Runtime a command works on: the app's (--app, else TETHER_APP, else `app` in
    [tool.tether]), or a plain one without an app; the command's flags (--db and `flags`;
    None = not given), then TETHER_*, applied over it (tether.config, operator=True)."""
    target, source = resolve_app(app)
    given = {k: v for k, v in {"db": db, **flags}.items() if v is not None}
    if target:
        with loading_app():
            rt = load_app(target, source)
    elif need_app:
        raise ConfigError("this command needs your tether.Runtime: pass --app module:attr, "
                          "set TETHER_APP, or put app = \"module:attr\" under [tool.tether] in "
                          "pyproject.toml")
    else:
        rt = Runtime()
    applied = rt.configured(given, operator=True)
    # Nothing to apply over the app: the app's own object (its code may hold it).
    return rt if not given and applied.settings == rt.settings else applied


def run(main: Coroutine[Any, Any, int], verbose: bool = False) -> int:
    """Run a command's coroutine on tether's event loop; a TetherError is one line on stderr
    and exit status 2, never a traceback."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return eventloop.run(main)
    except WaitTimeout as exc:
        print(f"tether: {exc}", file=sys.stderr)
        return TIMED_OUT
    except TetherError as exc:
        print(f"tether: error: {exc}", file=sys.stderr)
        return USER_ERROR
    except KeyboardInterrupt:
        return 130


def on_runtime(db: str | None, app: str | None, verbose: bool,
               act: Callable[[Runtime], Awaitable[T]], *, as_json: bool,
               show: Callable[[T], object], to_json: Callable[[T], Any] | None = None,
               need_app: bool = False, status: Callable[[T], int] | None = None) -> int:
    """What most commands are: `act` on the command's Runtime (closed after, whatever
    happens), then its result shown: `to_json(result)` (default: its to_dict()) as JSON with
    --json, else `show(result)`; exit status `status(result)` (default 0), or 2 with the
    message of a tether error."""

    async def main() -> int:
        rt = runtime_for(db, app, need_app=need_app)
        try:
            result = await act(rt)
        finally:
            await rt.close()
        if as_json:
            dump(to_json(result) if to_json is not None else result.to_dict())  # type: ignore[attr-defined]
        else:
            show(result)
        return status(result) if status is not None else 0

    return run(main(), verbose)


def json_value(text: str, flag: str) -> Any:
    """An option's JSON, or a ConfigError naming the flag (with how to quote a string when the
    text is a bare word)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        hint = ""
        if text.strip() and not text.lstrip().startswith(("{", "[", '"')):
            hint = (f"; a string is quoted JSON: {flag} {shlex.quote(orjson.dumps(text).decode())}"
                    " (true, false, null and numbers are bare)")
        raise ConfigError(f"{flag} is not valid JSON: {exc}{hint}") from None


def plural(n: int, word: str) -> str:
    """`n` and `word`, its plural when `n` is not 1: "1 run", "2 runs", "1,000 steps"."""
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def cli_actor() -> str:
    """Who the audit log names for the CLI's actions: the OS user."""
    import getpass

    try:
        return getpass.getuser()
    except Exception:  # no user name in the environment or the password database
        return f"uid:{os.getuid()}" if hasattr(os, "getuid") else "unknown"


def dump(obj: Any) -> None:
    sys.stdout.write(serde.display(obj, orjson.OPT_INDENT_2).decode() + "\n")


def spaced_json(value: Any) -> str:
    """`value` as JSON for a table cell: a space after each comma and colon (a terminal too
    narrow for it wraps there, not inside a token), rich markup escaped ("[x]" is text)."""
    import json

    from rich.markup import escape

    plain = orjson.loads(serde.display(value))
    return escape(json.dumps(plain, ensure_ascii=False, separators=(", ", ": ")))


def console() -> Any:
    from rich.console import Console

    return Console()


def _table_of(columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[str]], *,
             optional: Collection[str] = (), width: int, title: str | None = None,
             **kwargs: Any) -> Any:
    """What print_table prints, for a terminal `width` columns wide: a rich Table, or, when
    its columns cannot fit (rich would cut them to an ellipsis), the rows as records."""
    from rich.cells import cell_len
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    keep = [i for i, (name, _) in enumerate(columns)
            if name not in optional or any(row[i] for row in rows)]
    cells = {i: [columns[i][0], *(Text.from_markup(row[i]).plain for row in rows)] for i in keep}
    # The narrowest a column may be (its longest word: a text column folds anywhere, so a
    # few characters), and the width of its longest line.
    least = {i: min(8, natural) if columns[i][1] == "text" else natural for i in keep
             for natural in [max(cell_len(w) for c in cells[i] for w in c.split() or [""])]}
    widths = {i: max(least[i], *(cell_len(line) for c in cells[i] for line in c.splitlines()
                                 or [""])) for i in keep}
    # Each column costs its border and padding (3).
    room = width - 3 * len(keep) - 1
    if sum(least.values()) > room and rows:
        records = [_record([columns[i] for i in keep], [row[i] for i in keep], title)
                   for row in rows]
        caption = kwargs.get("caption")
        return Group(*records, *([Text(caption, style="dim")] if caption else []))
    # Narrow the widest columns first, none below its least; rich would narrow a column
    # below its longest word (cutting it) and widen it back past the terminal.
    while sum(widths.values()) > room:
        widest = max(widths[i] for i in keep if widths[i] > least[i])
        for i in keep:
            if widths[i] == widest > least[i] and sum(widths.values()) > room:
                widths[i] -= 1
    table = Table(**kwargs)
    for i in keep:
        name, kind = columns[i]
        if kind == "id":
            table.add_column(name, no_wrap=True, overflow="ignore", width=widths[i])
        else:
            table.add_column(name, overflow="fold", width=widths[i])
    for row in rows:
        table.add_row(*(row[i] for i in keep))
    return table


def _record(columns: Sequence[tuple[str, str]], row: Sequence[str],
            title: str | None = None) -> Any:
    """One row as a record: a title line (`title` formatted with the row's values by column
    name; else its ids; else its first value), then each other value under its name."""
    import collections
    import string

    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    values = {name: value for (name, _), value in zip(columns, row, strict=True)}
    if title is not None:
        named = {field for _, field, _, _ in string.Formatter().parse(title) if field}
        heading = title.format_map(collections.defaultdict(str, values))  # a column left out: ""
    else:
        named = {name for name, kind in columns if kind == "id"} or {columns[0][0]}
        heading = "  ".join(values[name] for name, _ in columns if name in named)
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim")
    grid.add_column(overflow="fold")
    for (name, _), value in zip(columns, row, strict=True):
        if name not in named and value:
            grid.add_row(f"  {name}", value)
    return Group(Text.from_markup(heading, style="bold"), grid, Text(""))


def print_table(columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[str]], *,
                optional: Collection[str] = (), title: str | None = None,
                **kwargs: Any) -> None:
    """Rows under named columns, readable in any terminal: (name, kind) per column, "id"
    (never cut or wrapped: it is copied into the next command), "word" (a status, a
    version, a name: as wide as its longest word), "words" (a list, key=value pairs, JSON:
    wrapped between its words, never inside one) or "text" (folded anywhere). A column
    named in `optional` that no row has a value for is left out. When the columns cannot
    fit the terminal, each row is printed as a record instead of being cut: titled by
    `title` (a format string over the column names, e.g. "step {step} · {node}"; default:
    the row's ids, else its first value), then each other value under its name. `kwargs` go
    to the Table (a caption)."""
    out = console()
    out.print(_table_of(columns, rows, optional=optional, width=out.width, title=title,
                        **kwargs))


# -- options ----------------------------------------------------------------------------------


def connection_options(f: F) -> F:
    """--db, --app and --verbose: on every command that opens the database."""
    f = click.option("-v", "--verbose", is_flag=True, help="log at INFO level")(f)
    f = click.option("--app", metavar="MODULE:ATTR",
                     help="module:attr of your tether.Runtime (default: $TETHER_APP, else app "
                          "in [tool.tether] of pyproject.toml)")(f)
    f = click.option("--db", metavar="URL",
                     help="database URL (default: $TETHER_DB, else the app's Runtime(...), "
                          "else db in [tool.tether], else sqlite:///tether.db)")(f)
    return f


def json_option(f: F) -> F:
    """--json: on every command that prints what it read or did."""
    return click.option("--json", "as_json", is_flag=True, help="print JSON")(f)


class Bounded(click.ParamType[float]):
    """`kind(text)` (int or float) within [low, high] (above `low` when `strict`)."""

    def __init__(self, kind: Callable[[str], float], what: str, low: float,
                 high: float | None = None, *, strict: bool = False, metavar: str = "N") -> None:
        self.kind = kind
        self.what = what
        self.low = low
        self.high = high
        self.strict = strict
        self.name = what
        self._metavar = metavar

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        return self._metavar

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None
                ) -> float:
        if isinstance(value, (int, float)):
            return value  # a default, already of its kind
        try:
            number = self.kind(value)
        except ValueError:
            self.fail(f"{value!r} is not {self.what}", param, ctx)
        if (number < self.low or (self.strict and number == self.low)
                or (self.high is not None and number > self.high)):
            bound = f"> {self.low}" if self.strict else f">= {self.low}"
            if self.high is not None:
                bound = f"within {self.low}..{self.high}"
            self.fail(f"must be {bound}, got {number}", param, ctx)
        return number


POSITIVE_INT = Bounded(int, "an integer", 1)
NON_NEGATIVE_INT = Bounded(int, "an integer", 0)
PORT = Bounded(int, "a port number", 0, 65535, metavar="PORT")
POSITIVE_FLOAT = Bounded(float, "a number", 0.0, strict=True, metavar="SECONDS")
