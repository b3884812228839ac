"""The CLI's words at 80 columns: no command's one-line help is cut to "...", counts agree with
their nouns ("1 run", "2 runs"), and a type is named with its article ("an Agent"), as issue
30 (items 8 and 10) asked."""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import tether
from tether.cli import cli
from tether.cli._common import load_app, plural
from tether.cli.prune import _print
from tether.errors import AppImportError, with_article
from tether.retention import Report
from tether.state import delta_of


def groups(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from groups(command, (*path, name))


def test_no_command_help_is_cut_at_80_columns() -> None:
    for path in groups(cli):
        result = CliRunner().invoke(cli, [*path, "--help"], terminal_width=80)
        assert result.exit_code == 0, result.output
        lines = result.output.splitlines()
        cut = [line for line in lines if line.rstrip().endswith("...")
               and not line.startswith("Usage:")]
        assert cut == [], (path, result.output)
        assert max(map(len, lines)) <= 80, result.output
    said = CliRunner().invoke(cli, ["--help"], terminal_width=80).output
    demo = next(line for line in said.splitlines() if line.split()[:1] == ["demo"])
    assert "lesson" not in demo and "crash recovery" in demo, said


def test_counts_agree_with_their_nouns(capsys: pytest.CaptureFixture[str]) -> None:
    assert (plural(1, "run"), plural(0, "run"), plural(2_000, "step")) == (
        "1 run", "0 runs", "2,000 steps")
    _print(Report(dry_run=True, runs=1, bytes=10, compacted_runs=1, compacted_rows=1))
    out = capsys.readouterr().out
    assert "would remove 1 run (10 bytes" in out and "would compact 1 run (1 row)" in out, out
    _print(Report(dry_run=False, runs=2, rows=1, seconds=0.1))
    assert "removed 2 runs and 1 row in" in capsys.readouterr().out


def test_a_type_is_named_with_its_article(monkeypatch: pytest.MonkeyPatch) -> None:
    assert [with_article(n) for n in ("int", "dict", "Agent", "Runtime")] == [
        "an int", "a dict", "an Agent", "a Runtime"]
    module = types.ModuleType("wording_app")
    module.agent = tether.Agent("wording")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wording_app", module)
    with pytest.raises(AppImportError, match=r"wording_app:agent \(--app\) is an Agent, not a "):
        load_app("wording_app:agent")
    with pytest.raises(tether.SerializationError, match="update key 1 is an int; keys must"):
        delta_of({}, {1: "x"})  # type: ignore[dict-item]


def test_the_advice_wraps_under_its_own_points_at_80_columns(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    monkeypatch.chdir(tmp_path)  # no app, no database: the what-if advice only
    for var in [v for v in os.environ if v.startswith("TETHER_")]:
        monkeypatch.delenv(var)
    result = CliRunner(env={"COLUMNS": "80"}).invoke(
        cli, ["advise", "--runs-per-s", "5", "--steps-per-run", "8", "--step-seconds", "2",
              "--human-wait", "86400"], terminal_width=80)
    assert result.exit_code == 0, result.output
    advice = result.output.split("\nassumed (what-if)", 1)[0].splitlines()
    assert advice[0].startswith("Recommendation: "), result.output
    assert len(advice) > 4 and max(map(len, advice)) <= 80, result.output
    # Every point starts at column 2, and its continuation lines sit under its text.
    assert all(line.startswith(("  - ", "  headroom: ", "    ", " " * 12))
               for line in advice[1:]), result.output
    assert any(line.startswith(" " * 12) and line.strip() for line in advice), result.output
    assert list(tmp_path.iterdir()) == []
