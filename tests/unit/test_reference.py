"""docs/reference.md is complete and true: its CLI table names every `tether` command with
every flag it has (and no other), and its Python section names every public name of
`tether.__all__` and every public attribute of Runtime."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

import tether
from tether.cli import cli

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference.md"
# On every command that opens the database, documented once above the table.
COMMON = {"--db", "--app", "--verbose", "-v", "--json", "--help"}
OPAQUE = {"bench"}  # passes its arguments through to the bench runner (its flags: bench --help)


def commands(group: click.Group, path: tuple[str, ...] = ()) -> dict[str, click.Command]:
    found: dict[str, click.Command] = {}
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            found.update(commands(cmd, (*path, name)))
            if cmd.invoke_without_command:  # the group itself runs too (`tether workers`)
                found[" ".join((*path, name))] = cmd
        else:
            found[" ".join((*path, name))] = cmd
    return found


def cli_rows(text: str) -> dict[str, str]:
    """A row's leading lowercase words -> its usage cell, from the table under ## CLI."""
    section = text[text.index("\n## CLI"):text.index("\n## HTTP API")]
    rows: dict[str, str] = {}
    for cell in re.findall(r"^\| `(tether (?:[^|`]|\\\|)*?)` \|", section, re.MULTILINE):
        words = [w for w in cell.split()[1:] if re.fullmatch(r"[a-z][a-z-]*", w)]
        rows[" ".join(words)] = cell
    return rows


def check_cli_table(text: str) -> None:
    rows = cli_rows(text)
    real = commands(cli)
    # A row's leading lowercase words are the command path (then its arguments).
    documented = {}
    for words, cell in rows.items():
        for n in range(len(words.split()), 0, -1):
            path = " ".join(words.split()[:n])
            if path in real:
                documented[path] = cell
                break
        else:
            raise AssertionError(f"reference.md documents `{cell}`, which is no command")
    missing = sorted(set(real) - set(documented))
    assert not missing, f"commands missing from docs/reference.md's CLI table: {missing}"
    for path, cmd in real.items():
        if path in OPAQUE:
            continue
        cell = documented[path]
        shown = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", cell))
        options = [p for p in cmd.params if isinstance(p, click.Option)]
        names = {o for p in options for o in p.opts}
        for p in options:
            if not set(p.opts) & (COMMON | shown):
                raise AssertionError(f"`tether {path}` has {p.opts[0]}, not in reference.md: {cell}")
        unknown = shown - names
        assert not unknown, (f"reference.md shows {sorted(unknown)} for `tether {path}`, which "
                             "has no such flag")


def test_every_command_and_flag_is_in_the_cli_table() -> None:
    check_cli_table(REFERENCE.read_text())


def test_the_check_finds_a_missing_command_or_flag() -> None:
    text = REFERENCE.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `tether runs retry"))
    with pytest.raises(AssertionError, match=r"missing .*\['runs retry'\]"):
        check_cli_table(text.replace(row + "\n", ""))
    with pytest.raises(AssertionError, match=r"has --limit, not in reference\.md"):
        check_cli_table(text.replace("`tether runs list [--status STATUS] [--agent A] [--limit N]`",
                                     "`tether runs list [--status STATUS] [--agent A]`"))
    with pytest.raises(AssertionError, match="no such flag"):
        check_cli_table(text.replace("`tether runs cancel THREAD`", "`tether runs cancel THREAD --force`"))


def test_every_public_python_name_is_documented() -> None:
    text = REFERENCE.read_text()
    ticks = " ".join(re.findall(r"`([^`]*)`", text))
    missing = [n for n in tether.__all__ if not re.search(rf"(?<![\w.]){re.escape(n)}\b", ticks)]
    assert not missing, f"names of tether.__all__ missing from docs/reference.md: {missing}"
    public = [n for n in vars(tether.Runtime) if not n.startswith("_")]
    undocumented = [n for n in public if not re.search(rf"\b{n}\b", ticks)]
    assert not undocumented, f"Runtime attributes missing from docs/reference.md: {undocumented}"
